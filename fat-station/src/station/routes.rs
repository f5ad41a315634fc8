//! The route table of a station: each `(method, path)` of `specs/station-wire.md` to its
//! handler, `/chain` to [`crate::mesh::relay`]; refusals become the wire's error body.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use knot_format::LayerRange;
use tokio::net::TcpListener;
use tracing::debug;

use crate::mesh::relay;
use crate::station::response_budget::Held;
use crate::station::server::{
    binary, busy_responses, check_context, check_room, compute, dtype_f16, header, json, read_body,
    refuse, session_of, set, with_session, Refusal, Resp, Station,
};
use crate::wire::{self, ErrorBody};
use http_frame::conn::serve_connections_with;

/// Serves on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    station: Arc<Station>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let limits = station.limits.conn.clone();
    // Idle sessions expire on a timer too, not only when another session arrives.
    let every = (station.limits.session_idle / 4)
        .clamp(Duration::from_millis(250), Duration::from_secs(30));
    let sweeper = {
        let station = station.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                station.sweep_sessions();
            }
        })
    };
    serve_connections_with(listener, station, handle, limits, shutdown).await;
    sweeper.abort();
}

/// Binds `addr`; returns the listener and the address actually bound (port 0 picks one).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let l = TcpListener::bind(addr).await?;
    let a = l.local_addr()?;
    Ok((l, a))
}

async fn handle(st: Arc<Station>, req: Request<Incoming>) -> Result<Response<Held>, Infallible> {
    let t0 = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let out = route(st.clone(), req).await;
    let resp = within_budget(&st, answer(&method, &path, out)).await;
    st.metrics.request(&path, resp.status().as_u16());
    access_log(&method, &path, &resp, t0);
    Ok(resp)
}

/// The answer as a body within the response budget ([`crate::station::response_budget`]),
/// else `503 responses_busy` (its body freed at once).
async fn within_budget(st: &Station, resp: Resp) -> Response<Held> {
    let (parts, body) = resp.into_parts();
    let data = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(never) => match never {},
    };
    let len = data.len();
    if let Some(held) = st.responses.hold(data) {
        return Response::from_parts(parts, held);
    }
    st.metrics
        .responses_refused
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let busy = answer(&Method::GET, "", Err(busy_responses(st, len)));
    let (parts, body) = busy.into_parts();
    let data = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(never) => match never {},
    };
    // An error body is under the unbudgeted size, so this always holds.
    match st.responses.hold(data) {
        Some(held) => Response::from_parts(parts, held),
        None => Response::from_parts(parts, Held::empty()),
    }
}

/// The access log: one info line per request, `POST /forward 200 12.3 ms 3584 B` (method,
/// route, status, milliseconds from the head to the answer, body bytes sent). The route is
/// the path cut to 64 characters (hyper has already refused control characters in it).
fn access_log<B: hyper::body::Body>(method: &Method, path: &str, resp: &Response<B>, t0: Instant) {
    let route = match path.char_indices().nth(64) {
        Some((i, _)) => &path[..i],
        None => path,
    };
    tracing::info!(
        target: "access",
        "{method} {route} {} {:.1} ms {} B",
        resp.status().as_u16(),
        t0.elapsed().as_secs_f64() * 1e3,
        resp.body().size_hint().exact().unwrap_or(0)
    );
}

/// A handler's result as the response the client gets: refusals become the wire's error body.
fn answer(method: &Method, path: &str, out: Result<Resp, Refusal>) -> Resp {
    match out {
        Ok(r) => r,
        Err(e) => {
            debug!("{method} {path} -> {} {}", e.status, e.message);
            let mut r = json(
                e.status,
                &ErrorBody {
                    error: e.code.into(),
                    message: e.message,
                    held: e.held.map(|h| h as u64),
                },
            );
            if e.status == StatusCode::SERVICE_UNAVAILABLE {
                r.headers_mut()
                    .insert(RETRY_AFTER, HeaderValue::from_static("1"));
            }
            r
        }
    }
}

/// The route table: each route is one named handler below.
async fn route(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    if let p @ (wire::ROUTE_EMBED | wire::ROUTE_FORWARD | wire::ROUTE_LM_HEAD) = req.uri().path() {
        if let Err(e) = relay::guard_direct(&st, p) {
            // Read the body first so the refusal is delivered, not a reset.
            let _ = read_body(&st, req).await;
            return Err(e);
        }
    }
    match (req.method(), req.uri().path()) {
        (&Method::POST, wire::ROUTE_CHAIN) => relay::chain(st, req).await,
        (&Method::POST, wire::ROUTE_CHECKPOINT) => crate::mesh::ship::receive(st, req).await,
        (&Method::GET, wire::ROUTE_HEALTH) => Ok(json(StatusCode::OK, &st.health())),
        (&Method::GET, wire::ROUTE_METRICS) => Ok(st.metrics_response()),
        (&Method::POST, wire::ROUTE_EMBED) => embed(st, req).await,
        (&Method::POST, wire::ROUTE_FORWARD) => forward(st, req).await,
        (&Method::POST, wire::ROUTE_LM_HEAD) => lm_head(st, req).await,
        (&Method::GET, wire::ROUTE_TOKENIZER) => tokenizer_info(st).await,
        (&Method::GET, wire::ROUTE_VOCAB) => vocab(st).await,
        (&Method::POST, wire::ROUTE_TOKENIZE) => tokenize(st, req).await,
        (&Method::POST, wire::ROUTE_DETOKENIZE) => detokenize(st, req).await,
        (
            _,
            p @ (wire::ROUTE_HEALTH
            | wire::ROUTE_TOKENIZER
            | wire::ROUTE_VOCAB
            | wire::ROUTE_METRICS
            | wire::ROUTE_EMBED
            | wire::ROUTE_FORWARD
            | wire::ROUTE_LM_HEAD
            | wire::ROUTE_TOKENIZE
            | wire::ROUTE_DETOKENIZE
            | wire::ROUTE_CHAIN
            | wire::ROUTE_CHECKPOINT),
        ) => Err(refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{} is not allowed on {p}", req.method()),
        )),
        (_, p) => Err(refuse(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no route {p}"),
        )),
    }
}

/// `POST /embed`: token ids -> the residual.
async fn embed(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    let body: wire::EmbedRequest = read_json(&st, req).await?;
    if body.tokens.is_empty() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "tokens must not be empty",
        ));
    }
    // The residual is tokens x hidden floats: bound it like a session before allocating.
    if body.tokens.len() > st.limits.max_positions {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "context_full",
            format!(
                "{} tokens exceed this station's limit of {}",
                body.tokens.len(),
                st.limits.max_positions
            ),
        ));
    }
    st.metrics.tokens.fetch_add(
        body.tokens.len() as u64,
        std::sync::atomic::Ordering::Relaxed,
    );
    compute(st, move |st| {
        let t = Instant::now();
        let x = st.model.embed(&body.tokens)?;
        Ok(residual_response(&x, st.model.cfg.hidden, t, false))
    })
    .await
}

/// `POST /forward`: parse, check the range is held and the context has room, then run it.
async fn forward(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    // Read the body before any refusal: a response sent while the client is still
    // writing would reset the connection instead of delivering the error.
    let range_h = header(&req, wire::H_LAYER_RANGE);
    let dtype_h = header(&req, wire::H_DTYPE);
    let pos_h = header(&req, wire::H_POS);
    let session_h = header(&req, wire::H_SESSION);
    let bytes = read_body(&st, req).await?;
    let (range_h, pos_h, session_h) = (range_h?, pos_h?, session_h?);
    let f16 = dtype_f16(dtype_h?.as_deref())?;
    let range = held_range(&st, range_h.as_deref())?;
    let (session, pos) = session_of(&st, session_h.as_deref(), pos_h.as_deref())?;
    let mut x = decode_residual(&bytes, f16, st.model.cfg.hidden)?;
    check_context(&st, pos.unwrap_or(0), x.len() / st.model.cfg.hidden)?;
    check_room(&st, bytes.len())?;
    compute(st, move |st| {
        let t = Instant::now();
        let start = with_session(st, session, pos, range.start as usize, |model, s| {
            model.forward(s, &mut x, range)
        })?;
        let mut r = residual_response(&x, st.model.cfg.hidden, t, f16);
        set(&mut r, wire::H_START_POS, start.to_string());
        Ok(r)
    })
    .await
}

/// The `X-Layer-Range` of a `/forward`: present, well formed, non-empty and held here.
fn held_range(st: &Station, h: Option<&str>) -> Result<LayerRange, Refusal> {
    let h = h.ok_or_else(|| {
        refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "missing header X-Layer-Range: a-b",
        )
    })?;
    let range =
        wire::parse_layer_range(h).map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad_range", e))?;
    if range.is_empty() {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_range",
            format!("X-Layer-Range {}-{} is empty", range.start, range.end),
        ));
    }
    let held = st.model.holdings().layers;
    if !held.contains_range(&range) {
        return Err(refuse(
            StatusCode::NOT_FOUND,
            "not_held",
            format!(
                "this station holds layers {}-{}, not {}-{}",
                held.start, held.end, range.start, range.end
            ),
        ));
    }
    Ok(range)
}

/// `POST /lm-head`: the residual's last rows -> logits.
async fn lm_head(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    let dtype_h = header(&req, wire::H_DTYPE);
    let rows_h = header(&req, wire::H_LOGIT_ROWS);
    let bytes = read_body(&st, req).await?;
    let f16 = dtype_f16(dtype_h?.as_deref())?;
    let rows_h = rows_h?;
    let x = decode_residual(&bytes, f16, st.model.cfg.hidden)?;
    let rows = logit_rows(rows_h.as_deref(), x.len() / st.model.cfg.hidden)?;
    check_room(&st, rows * st.model.cfg.vocab * 4)?;
    compute(st, move |st| {
        let t = Instant::now();
        let logits = st.model.lm_head_rows(&x, rows)?;
        let mut r = binary(wire::encode_f32(&logits));
        set(&mut r, wire::H_COMPUTE_MS, ms(t));
        Ok(r)
    })
    .await
}

/// `GET /tokenizer`: the vocabulary's size, its special ids and the chat template.
async fn tokenizer_info(st: Arc<Station>) -> Result<Resp, Refusal> {
    compute(st, move |st| {
        let tok = st.tokenizer()?;
        let template = st
            .model
            .knot()
            .tokenizer()
            .ok()
            .flatten()
            .and_then(|d| d.chat_template);
        Ok(json(
            StatusCode::OK,
            &wire::TokenizerInfo {
                vocab: tok.vocab_size() as u32,
                bos_id: tok.bos_id(),
                eos_id: tok.eos_id(),
                eog_ids: (0..tok.vocab_size() as u32)
                    .filter(|&i| tok.is_eog(i))
                    .collect(),
                add_bos: tok.add_bos_default(),
                chat_template: template,
            },
        ))
    })
    .await
}

/// `GET /vocab`: every token's bytes, for callers that detokenize themselves.
async fn vocab(st: Arc<Station>) -> Result<Resp, Refusal> {
    compute(st, move |st| {
        let tok = st.tokenizer()?;
        let special = tok.special_ids();
        let body = wire::encode_vocab((0..tok.vocab_size() as u32).map(|id| {
            (
                special.binary_search(&id).is_ok(),
                tok.token_bytes(id).unwrap_or_default(),
            )
        }));
        Ok(binary(body))
    })
    .await
}

/// `POST /tokenize`: text (or text and special-token parts) -> ids.
async fn tokenize(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    let body: wire::TokenizeRequest = read_json(&st, req).await?;
    check_text(&st, &body)?;
    compute(st, move |st| {
        let tok = st.tokenizer()?;
        let add_bos = body.add_bos.unwrap_or_else(|| tok.add_bos_default());
        let pieces = body
            .pieces()
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad_request", e))?;
        Ok(json(
            StatusCode::OK,
            &wire::Tokens {
                tokens: tok.encode_parts(&pieces, add_bos),
            },
        ))
    })
    .await
}

/// `POST /detokenize`: ids -> text; an id outside the vocabulary is a 400.
async fn detokenize(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    let body: wire::Tokens = read_json(&st, req).await?;
    compute(st, move |st| {
        let tok = st.tokenizer()?;
        if let Some(bad) = body
            .tokens
            .iter()
            .find(|&&t| t as usize >= tok.vocab_size())
        {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_token",
                format!(
                    "token id {bad} is outside the vocabulary ({})",
                    tok.vocab_size()
                ),
            ));
        }
        Ok(json(
            StatusCode::OK,
            &wire::Text {
                text: tok.decode(&body.tokens),
            },
        ))
    })
    .await
}

/// Refuses a `/tokenize` body whose text (all parts together) is over [`Limits::max_text`].
fn check_text(st: &Station, body: &wire::TokenizeRequest) -> Result<(), Refusal> {
    let len = body.text.len()
        + body
            .parts
            .iter()
            .flatten()
            .map(|p| p.text.len())
            .sum::<usize>();
    if len > st.limits.max_text {
        return Err(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "text of {len} bytes exceeds this station's limit of {} for /tokenize",
                st.limits.max_text
            ),
        ));
    }
    Ok(())
}

async fn read_json<T: serde::de::DeserializeOwned>(
    st: &Station,
    req: Request<Incoming>,
) -> Result<T, Refusal> {
    let b = read_body(st, req).await?;
    serde_json::from_slice(&b).map_err(|e| {
        refuse(
            StatusCode::BAD_REQUEST,
            "bad_json",
            format!("invalid JSON body: {e}"),
        )
    })
}

/// The `X-Logit-Rows` of an `/lm-head` over `seq` rows (1 without the header).
fn logit_rows(h: Option<&str>, seq: usize) -> Result<usize, Refusal> {
    match h {
        None => Ok(1),
        Some(v) => wire::parse_logit_rows(v, seq)
            .map_err(|e| refuse(StatusCode::BAD_REQUEST, "bad_request", e)),
    }
}

fn decode_residual(b: &[u8], f16: bool, hidden: usize) -> Result<Vec<f32>, Refusal> {
    let width = if f16 { 2 } else { 4 };
    let row = hidden * width;
    if b.is_empty() || !b.len().is_multiple_of(row) {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_residual",
            format!(
                "residual of {} bytes is not a whole number of rows of {hidden} x {} bytes",
                b.len(),
                width
            ),
        ));
    }
    let x = if f16 {
        wire::decode_f16(b)
    } else {
        wire::decode_f32(b)
    };
    x.ok_or_else(|| refuse(StatusCode::BAD_REQUEST, "bad_residual", "ragged residual"))
}

fn ms(t: Instant) -> String {
    format!("{:.3}", t.elapsed().as_secs_f64() * 1e3)
}

fn residual_response(x: &[f32], hidden: usize, t: Instant, f16: bool) -> Resp {
    let mut r = binary(if f16 {
        wire::encode_f16(x)
    } else {
        wire::encode_f32(x)
    });
    set(&mut r, wire::H_COMPUTE_MS, ms(t));
    set(&mut r, wire::H_SEQ, (x.len() / hidden).to_string());
    set(&mut r, wire::H_HIDDEN, hidden.to_string());
    if f16 {
        set(&mut r, wire::H_DTYPE, "f16".into());
    }
    r
}
