//! `POST /chain`: run this station's part of a token step and forward the output residual
//! straight to the next hop, so a client makes one request per token.
//!
//! The entry takes `{"tokens": [...]}` (with the exit's ask: rows, sampling parameters and
//! state, drafts, logprobs), embeds and runs its layers; every other node takes the residual,
//! with the ask after it. A node that holds the head answers logits (or `X-Return: token`: the
//! picks of the engine's sampler, the argmax without an ask, as JSON); any other forwards to the first URL of `X-Route` (passing on the rest) or, without a
//! route, to its manifest successor, and relays the answer back with its own timing prepended
//! to `X-Chain-Trace`. The first URL of a route must be the manifest successor or one of the
//! next hops allowed at start (`--route-to`), else 403 `route_refused`; redirects are never
//! followed. The hop runs after this node's compute, on its own bounded set of blocking threads
//! ([`DEFAULT_MAX_HOPS`]), so hops that never answer hold no compute permit and cannot starve
//! `/embed` or `/forward`. A hop that cannot be reached within the hop timeout gives a 502 that
//! names the node, its range and its URL (also in `X-Failed-Hop`). With a mesh key everything
//! that carries model data is sealed ([`crate::mesh::seal`]): the client's token request (the entry
//! refuses an unsealed one with 401), every residual between nodes, and the exit's answer,
//! which the nodes before it relay unchanged to the client. An entry with a grant verifier
//! refuses a client without a valid, unrevoked `X-Grant`. Contract: `specs/mesh.md`.

use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use crate::engine::ops::argmax;
use crate::engine::sampling::{Sampler, SamplerState, SamplingParams};
use crate::mesh::grant::GrantError;
use crate::mesh::node::{MeshNode, DEFAULT_MAX_HOPS};
use crate::mesh::seal::{self, SealContext, SealDir, SealError};
use crate::station::server::{
    binary, check_context, compute, header, json, read_body, refuse, session_of, set, with_session,
    Refusal, Resp, Station,
};
use crate::wire;

/// Refuses an `X-Route` whose next hop is neither the successor nor allowed at start.
fn check_route(node: &MeshNode, route: &str) -> Result<(), Refusal> {
    let Some(next) = route
        .split(',')
        .next()
        .map(|u| u.trim().trim_end_matches('/'))
    else {
        return Ok(());
    };
    if route.is_empty() {
        return Ok(());
    }
    let successor = node.successor.as_ref().map(|s| s.url.trim_end_matches('/'));
    if successor == Some(next) || node.routes.iter().any(|r| r == next) {
        return Ok(());
    }
    Err(refuse(
        StatusCode::FORBIDDEN,
        "route_refused",
        format!(
            "node {} forwards only to its successor{}; X-Route names {next:?}",
            node.node_id,
            if node.routes.is_empty() {
                String::new()
            } else {
                format!(" or {}", node.routes.join(", "))
            }
        ),
    ))
}

/// Refuses direct compute routes (`/embed`, `/forward`, `/lm-head`) on a sealed or
/// grant-guarded station: they would carry residuals in clear or skip the grant.
pub(crate) fn guard_direct(st: &Station, route: &str) -> Result<(), Refusal> {
    let Some(m) = st.mesh() else { return Ok(()) };
    if m.key.is_some() {
        return Err(refuse(StatusCode::UNAUTHORIZED, "sealed_mesh", format!("this station is in a sealed mesh: {route} would carry a residual in clear; use POST /chain")));
    }
    if m.grant.is_some() {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "grant_required",
            format!(
                "this station requires a grant: use POST /chain with {}",
                wire::H_GRANT
            ),
        ));
    }
    Ok(())
}

enum Input {
    Tokens(Vec<u32>),
    Residual(Vec<f32>),
}

/// What this node's compute leaves to do: answer, or forward to the next hop.
enum Step {
    Answer(Resp),
    Forward(HopCall),
}

/// A forward prepared by the compute step, sent outside the compute pool.
struct HopCall {
    url: String,
    /// Names the next hop in errors.
    name: String,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    /// This node's `X-Chain-Trace` entry.
    me: String,
    /// Who forwards, for errors: `node N (layers a-b)`.
    from: String,
}

/// Most alternatives an exit answers per pick (OpenAI's `top_logprobs` allows 20).
const MAX_TOP_LOGPROBS: usize = 64;

/// A `/chain` request's headers, read before the body.
struct ChainHeaders {
    session: Option<String>,
    pos: Option<String>,
    request_id: Option<String>,
    want_token: bool,
    route: String,
    seal: Option<String>,
    seal_ts: Option<String>,
    from_layer: Option<String>,
    grant: Option<String>,
    exit_ask: Option<String>,
}

/// One `/chain` step once admitted: what this node runs and answers or forwards.
struct Admitted {
    h: ChainHeaders,
    request_id: String,
    session: Option<std::sync::Arc<std::sync::Mutex<crate::engine::Session>>>,
    pos: Option<usize>,
    input: Input,
    ask: Option<wire::ExitAsk>,
    seal_ms: f64,
}

/// Handles `POST /chain`: parse, admit (grant, seal, body), compute this node's layers, then
/// answer (the exit) or forward (everyone else).
pub(crate) async fn chain(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    let h = parse_headers(&req);
    let body = read_body(&st, req).await?;
    let a = admit(&st, h?, &body)?;
    let step = compute(st.clone(), move |st| run_step(st, a)).await?;
    match step {
        Step::Answer(r) => Ok(r),
        Step::Forward(call) => hop(st, call).await,
    }
}

/// Step 1: the headers, each one spelling (`X-Return`: `logits` or `token`).
fn parse_headers(req: &Request<Incoming>) -> Result<ChainHeaders, Refusal> {
    let h = |n: &str| header(req, n);
    let want_token = match h(wire::H_RETURN)?.as_deref() {
        None | Some("logits") => false,
        Some("token") => true,
        Some(o) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                format!("X-Return {o:?}: expected logits or token"),
            ))
        }
    };
    Ok(ChainHeaders {
        session: h(wire::H_SESSION)?,
        pos: h(wire::H_POS)?,
        request_id: h(wire::H_REQUEST_ID)?,
        want_token,
        route: h(wire::H_ROUTE)?.unwrap_or_default(),
        seal: h(wire::H_SEAL)?,
        seal_ts: h(wire::H_SEAL_TS)?,
        from_layer: h(wire::H_FROM_LAYER)?,
        grant: h(wire::H_GRANT)?,
        exit_ask: h(wire::H_EXIT_ASK)?,
    })
}

/// Step 2: the request id, the grant (entry), the seal, the body (tokens at the entry, a
/// residual and the exit's ask elsewhere), the context, and the route.
fn admit(st: &Station, h: ChainHeaders, body: &[u8]) -> Result<Admitted, Refusal> {
    let node = st.mesh_node();
    let held = st.model().holdings();
    let client_chose_id = h.request_id.is_some();
    let request_id = match &h.request_id {
        Some(r) if wire::valid_session_id(r) => r.clone(),
        Some(_) => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "X-Request-Id must be 1-64 chars of [A-Za-z0-9_.:-]",
            ))
        }
        None if held.embed => node.request_id(),
        None => {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "a forwarded hop needs X-Request-Id",
            ))
        }
    };
    let (session, pos) = session_of(st, h.session.as_deref(), h.pos.as_deref())?;
    let session_name = h.session.clone().unwrap_or_default();
    // The body's seal binds the direction and the layer it starts at, besides the request.
    let open_body = |dir: SealDir, from_layer: u32| {
        let ctx = SealContext {
            dir,
            request_id: &request_id,
            from_layer,
            session: &session_name,
            pos: pos.unwrap_or(0),
            ts_ms: 0,
            route: &h.route,
            ret: seal::ret_tag(h.want_token),
        };
        unseal(node, body, h.seal.as_deref(), h.seal_ts.as_deref(), ctx)
    };
    let (input, ask, seal_ms) = if held.embed {
        check_grant(node, h.grant.as_deref())?;
        if node.key.is_some() && h.seal.is_some() && !client_chose_id {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_seal",
                "a sealed request needs the X-Request-Id its seal binds",
            ));
        }
        let (plain, ms) = open_body(SealDir::Request, held.layers.start)?;
        let r: wire::ChainRequest = serde_json::from_slice(&plain).map_err(|e| {
            refuse(
                StatusCode::BAD_REQUEST,
                "bad_json",
                format!("the entry takes {{\"tokens\": [...]}}: {e}"),
            )
        })?;
        if r.tokens.is_empty() {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                "bad_request",
                "tokens must not be empty",
            ));
        }
        if let Some(ask) = &r.exit {
            check_ask(ask, h.want_token, r.tokens.len())?;
        }
        check_context(st, pos.unwrap_or(0), r.tokens.len())?;
        (Input::Tokens(r.tokens), r.exit, ms)
    } else {
        let from = match h.from_layer.as_deref().map(wire::parse_header_number) {
            Some(Some(f)) => f,
            Some(None) => {
                return Err(refuse(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    "X-From-Layer is not a plain decimal number",
                ))
            }
            None => held.layers.start,
        };
        if from != held.layers.start {
            return Err(refuse(
                StatusCode::CONFLICT,
                "wrong_hop",
                format!(
                    "residual is at layer {from} but node {} runs {}-{}",
                    node.node_id, held.layers.start, held.layers.end
                ),
            ));
        }
        let (plain, ms) = open_body(SealDir::Hop, from)?;
        let (x, ask) = residual_and_ask(st, &plain, h.exit_ask.as_deref(), h.want_token)?;
        (Input::Residual(x), ask, ms)
    };
    // After the grant and the seal: only then may the route be trusted this far.
    if !held.head {
        check_route(node, &h.route)?;
    }
    Ok(Admitted {
        h,
        request_id,
        session,
        pos,
        input,
        ask,
        seal_ms,
    })
}

/// An entry with a grant verifier refuses a client without a valid, unrevoked grant.
fn check_grant(node: &MeshNode, grant: Option<&str>) -> Result<(), Refusal> {
    let Some(v) = &node.grant else { return Ok(()) };
    let g = grant.ok_or_else(|| {
        refuse(
            StatusCode::UNAUTHORIZED,
            "grant_required",
            format!(
                "this entry requires a monster-guard grant in {}",
                wire::H_GRANT
            ),
        )
    })?;
    v.verify_header(g, crate::mesh::grant::now_s())
        .map(drop)
        .map_err(grant_refusal)
}

/// Refuses an exit ask the exit could not answer: more rows than tokens (or than
/// [`wire::MAX_LOGIT_ROWS`]), drafts or logprobs with `X-Return: logits`, sampling
/// parameters out of range.
fn check_ask(ask: &wire::ExitAsk, want_token: bool, tokens: usize) -> Result<(), Refusal> {
    let bad = |m: String| Err(refuse(StatusCode::BAD_REQUEST, "bad_request", m));
    if ask.hidden {
        // Every row's hidden state: no rows, sampling or candidates go with it.
        return if want_token
            || *ask
                != (wire::ExitAsk {
                    hidden: true,
                    rows: ask.rows,
                    ..Default::default()
                })
        {
            bad("hidden answers every row's hidden state: with X-Return: logits and no sample, drafts, logprobs or candidates".into())
        } else {
            Ok(())
        };
    }
    let rows = ask_rows(ask, want_token);
    if rows > tokens || rows > wire::MAX_LOGIT_ROWS {
        return bad(format!(
            "the exit ask wants {rows} rows of a step of {tokens} tokens (at most {})",
            wire::MAX_LOGIT_ROWS
        ));
    }
    if !want_token && (ask.sample.is_some() || !ask.drafts.is_empty() || ask.logprobs.is_some()) {
        return bad("sample, drafts and logprobs need X-Return: token".into());
    }
    if want_token && ask.rows > 1 {
        return bad("with X-Return: token the rows are the drafts plus one".into());
    }
    if ask
        .candidates
        .is_some_and(|k| k == 0 || k > wire::MAX_CANDIDATES)
    {
        return bad(format!("candidates: 1 to {} per row", wire::MAX_CANDIDATES));
    }
    if !want_token && ask.candidates.is_some() {
        return bad("candidates need X-Return: token".into());
    }
    if ask.logprobs.is_some_and(|n| n > MAX_TOP_LOGPROBS) {
        return bad(format!("logprobs: at most {MAX_TOP_LOGPROBS} alternatives"));
    }
    if let Some(s) = &ask.sample {
        sampling_params(s)
            .validate()
            .or_else(|e| bad(e.to_string()))?;
    }
    Ok(())
}

/// Logit rows the exit computes for `ask`.
fn ask_rows(ask: &wire::ExitAsk, want_token: bool) -> usize {
    if want_token {
        ask.drafts.len() + 1
    } else {
        ask.rows.max(1)
    }
}

/// The engine's sampling parameters from the wire's (the seed is in the state).
fn sampling_params(s: &wire::SampleSpec) -> SamplingParams {
    SamplingParams {
        temperature: s.temperature,
        top_k: s.top_k,
        top_p: s.top_p,
        repeat_penalty: s.repeat_penalty,
        repeat_last_n: s.repeat_last_n,
        seed: 0,
        min_p: s.min_p,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        logit_bias: s.logit_bias.clone(),
    }
}

/// A forwarded body: the residual rows, then the exit's ask when `X-Exit-Ask` gives its
/// length.
fn residual_and_ask(
    st: &Station,
    plain: &[u8],
    ask_len: Option<&str>,
    want_token: bool,
) -> Result<(Vec<f32>, Option<wire::ExitAsk>), Refusal> {
    let bad = |code: &'static str, m: String| refuse(StatusCode::BAD_REQUEST, code, m);
    let (rows, ask) = match ask_len {
        None => (plain, None),
        Some(v) => {
            let n = wire::parse_header_number(v).ok_or_else(|| {
                bad(
                    "bad_request",
                    "X-Exit-Ask is not a plain decimal number".into(),
                )
            })?;
            let (rows, ask) =
                wire::split_exit_ask(plain, n as usize).map_err(|m| bad("bad_request", m))?;
            (rows, Some(ask))
        }
    };
    let hidden = st.model().cfg.hidden;
    if rows.is_empty() || !rows.len().is_multiple_of(hidden * 4) {
        return Err(bad(
            "bad_residual",
            format!(
                "residual of {} bytes is not whole rows of {hidden} f32",
                rows.len()
            ),
        ));
    }
    if let Some(a) = &ask {
        check_ask(a, want_token, rows.len() / (hidden * 4))?;
    }
    Ok((wire::decode_f32(rows).unwrap_or_default(), ask))
}

/// Step 3 (on the compute pool): embed or take the residual, run this node's layers, then
/// answer at the exit or prepare the forward.
fn run_step(st: &Station, mut a: Admitted) -> Result<Step, Refusal> {
    let t = Instant::now();
    let node = st.mesh_node();
    let held = st.model().holdings();
    let mut x = match std::mem::replace(&mut a.input, Input::Tokens(Vec::new())) {
        Input::Tokens(t) => st.model().embed(&t)?,
        Input::Residual(x) => x,
    };
    let range = held.layers;
    if !range.is_empty() {
        let rows = x.len() / st.model().cfg.hidden.max(1);
        // A state to ship to this range's replicas ([`crate::mesh::ship`]), made while the
        // session is held; it goes out on the shipping thread.
        let ship = node.ship.as_ref().zip(a.h.session.as_deref());
        let job = with_session(
            st,
            a.session.clone(),
            a.pos,
            range.start as usize,
            |m, s| {
                let start = m.forward(s, &mut x, range)?;
                Ok(ship
                    .filter(|(sh, _)| sh.due(start, rows))
                    .and_then(|(sh, id)| sh.export(st, id, s)))
            },
        )?;
        st.metrics
            .chain_rows
            .fetch_add(rows as u64, std::sync::atomic::Ordering::Relaxed);
        if let (Some((sh, _)), Some(job)) = (ship, job) {
            sh.queue(job);
        }
    }
    if held.head {
        if !a.h.route.is_empty() {
            return Err(refuse(
                StatusCode::CONFLICT,
                "route_past_exit",
                format!(
                    "node {} holds the head but X-Route names more hops: {}",
                    node.node_id, a.h.route
                ),
            ));
        }
        return answer(st, &a, &x, t).map(Step::Answer);
    }
    forward(st, &a, &x, t).map(Step::Forward)
}

/// This node's `X-Chain-Trace` entry.
fn trace_entry(node: &MeshNode, range: knot_format::LayerRange, ms: f64, seal_ms: f64) -> String {
    format!(
        "{}={}-{}:{:.3}:{:.3}",
        node.node_id, range.start, range.end, ms, seal_ms
    )
}

/// Step 4a, the exit: logits, or the picks of the ask's sampler, sealed when the mesh has a
/// key (the nodes before relay it unchanged).
fn answer(st: &Station, a: &Admitted, x: &[f32], t: Instant) -> Result<Resp, Refusal> {
    let node = st.mesh_node();
    let range = st.model().holdings().layers;
    let want_token = a.h.want_token;
    let hidden = a.ask.as_ref().is_some_and(|k| k.hidden);
    let rows = match &a.ask {
        Some(k) if !k.hidden => ask_rows(k, want_token),
        _ => 1,
    };
    let seq = x.len() / st.model().cfg.hidden.max(1);
    if rows > seq {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("the exit ask wants {rows} rows of a step of {seq} tokens"),
        ));
    }
    let (plain, ctype) = if hidden {
        (
            wire::encode_f32(&st.model().final_hidden(x)?),
            "application/octet-stream",
        )
    } else if want_token {
        let mut logits = st.model().lm_head_rows(x, rows)?;
        let tok = pick(&mut logits, st.model().cfg.vocab, a.ask.as_ref());
        (
            serde_json::to_vec(&tok).unwrap_or_default(),
            "application/json",
        )
    } else {
        let logits = st.model().lm_head_rows(x, rows)?;
        (wire::encode_f32(&logits), "application/octet-stream")
    };
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let mut seal_ms = a.seal_ms;
    let mut r = match &node.key {
        Some(key) => {
            let t0 = Instant::now();
            let ts = seal::now_ms();
            let ctx = SealContext {
                dir: SealDir::Response,
                request_id: &a.request_id,
                from_layer: range.end,
                session: a.h.session.as_deref().unwrap_or_default(),
                pos: a.pos.unwrap_or(0),
                ts_ms: ts,
                route: "",
                ret: seal::ret_tag(want_token),
            };
            let sealed = key.seal(&plain, &ctx);
            seal_ms += t0.elapsed().as_secs_f64() * 1e3;
            let mut r = binary(sealed);
            set(&mut r, wire::H_SEAL, "v1".into());
            set(&mut r, wire::H_SEAL_TS, ts.to_string());
            r
        }
        None => {
            let mut r = binary(plain);
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(ctype),
            );
            r
        }
    };
    set(
        &mut r,
        wire::H_CHAIN_TRACE,
        trace_entry(node, range, ms, seal_ms),
    );
    set(&mut r, wire::H_REQUEST_ID, a.request_id.clone());
    Ok(r)
}

/// `X-Return: token`: without an ask the last row's argmax; with one, the ask's sampler over
/// every row (the engine's, as the gateway's), stopping at the first pick that is not the
/// row's draft.
fn pick(logits: &mut [f32], vocab: usize, ask: Option<&wire::ExitAsk>) -> wire::ChainToken {
    let Some(ask) = ask else {
        let id = argmax(logits);
        return wire::ChainToken {
            token: id,
            logit: logits
                .get(id as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
            picks: Vec::new(),
            rng: None,
            rows: Vec::new(),
        };
    };
    let mut sampler = match &ask.sample {
        Some(s) => Sampler::resume(
            sampling_params(s),
            SamplerState {
                rng: s.rng,
                recent: s.recent.clone(),
                counts: s.counts.clone(),
            },
        ),
        None => Sampler::new(SamplingParams::default()),
    };
    if let Some(k) = ask.candidates {
        let rows = sampler.candidates(logits, vocab, &ask.drafts, k);
        let (token, logit) = rows
            .last()
            .and_then(|r| r.first())
            .copied()
            .unwrap_or((0, f32::NEG_INFINITY));
        return wire::ChainToken {
            token,
            logit,
            picks: Vec::new(),
            rng: Some(sampler.rng_state()),
            rows,
        };
    }
    let raw = logits.to_vec();
    let picked = sampler.pick_rows(logits, vocab, &ask.drafts, ask.logprobs);
    let last = picked.len().saturating_sub(1);
    let (token, logit) = picked.last().map_or((0, f32::NEG_INFINITY), |p| {
        (
            p.0,
            raw.get(last * vocab + p.0 as usize).copied().unwrap_or(0.0),
        )
    });
    wire::ChainToken {
        token,
        logit,
        picks: picked
            .into_iter()
            .map(|(id, lp)| wire::ChainPick {
                id,
                logprob: lp.as_ref().and_then(|l| wire::finite(l.logprob)),
                top: lp
                    .map(|l| {
                        l.top
                            .into_iter()
                            .map(|(i, v)| (i, wire::finite(v)))
                            .collect()
                    })
                    .unwrap_or_default(),
            })
            .collect(),
        rng: Some(sampler.rng_state()),
        rows: Vec::new(),
    }
}

/// Step 4b, every node but the exit: the residual (and the exit's ask) for the next hop, the
/// route's first URL or the manifest successor, sealed when the mesh has a key.
fn forward(st: &Station, a: &Admitted, x: &[f32], t: Instant) -> Result<HopCall, Refusal> {
    let node = st.mesh_node();
    let range = st.model().holdings().layers;
    let compute_ms = t.elapsed().as_secs_f64() * 1e3;
    let route = &a.h.route;
    let (next_url, rest, next_name) = match route.split_once(',') {
        _ if route.is_empty() => match &node.successor {
            Some(s) => (
                s.url.clone(),
                String::new(),
                format!("node {} (layers {})", s.node_id, s.layers),
            ),
            None => {
                return Err(refuse(
                    StatusCode::CONFLICT,
                    "no_successor",
                    format!(
                        "node {} runs {}-{} but has no successor and no X-Route",
                        node.node_id, range.start, range.end
                    ),
                ))
            }
        },
        Some((a, b)) => (
            a.trim().to_string(),
            b.trim().to_string(),
            format!("the hop after layer {}", range.end),
        ),
        None => (
            route.trim().to_string(),
            String::new(),
            format!("the hop after layer {}", range.end),
        ),
    };
    let next_url = next_url.trim_end_matches('/').to_string();
    let mut plain = wire::encode_f32(x);
    let pos_n = a.pos.unwrap_or(0);
    let mut headers = vec![
        ("content-type", "application/octet-stream".to_string()),
        (wire::H_REQUEST_ID, a.request_id.clone()),
        (wire::H_FROM_LAYER, range.end.to_string()),
    ];
    if let Some(ask) = &a.ask {
        let trailer = serde_json::to_vec(ask).unwrap_or_default();
        headers.push((wire::H_EXIT_ASK, trailer.len().to_string()));
        plain.extend_from_slice(&trailer);
    }
    if let Some(s) = &a.h.session {
        headers.push((wire::H_SESSION, s.clone()));
        headers.push((wire::H_POS, pos_n.to_string()));
    }
    if a.h.want_token {
        headers.push((wire::H_RETURN, "token".into()));
    }
    if !rest.is_empty() {
        headers.push((wire::H_ROUTE, rest.clone()));
    }
    let mut seal_ms = a.seal_ms;
    let body = match &node.key {
        Some(key) => {
            let ts0 = Instant::now();
            let ts = seal::now_ms();
            let ctx = SealContext {
                dir: SealDir::Hop,
                request_id: &a.request_id,
                from_layer: range.end,
                session: a.h.session.as_deref().unwrap_or_default(),
                pos: pos_n,
                ts_ms: ts,
                route: &rest,
                ret: seal::ret_tag(a.h.want_token),
            };
            let b = key.seal(&plain, &ctx);
            seal_ms += ts0.elapsed().as_secs_f64() * 1e3;
            headers.push((wire::H_SEAL, "v1".into()));
            headers.push((wire::H_SEAL_TS, ts.to_string()));
            b
        }
        None => plain,
    };
    Ok(HopCall {
        url: next_url,
        name: next_name,
        headers,
        body,
        me: trace_entry(node, range, compute_ms, seal_ms),
        from: format!(
            "node {} (layers {}-{})",
            node.node_id, range.start, range.end
        ),
    })
}

/// Sends a prepared forward on one of the node's hop threads (waiting up to the hop timeout
/// for one) and relays the answer.
async fn hop(st: Arc<Station>, call: HopCall) -> Result<Resp, Refusal> {
    let node = st.mesh_node();
    let permit = tokio::time::timeout(node.hop_timeout, node.hops.clone().acquire_owned())
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or_else(|| {
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "hops_busy",
                format!(
                    "node {} has {DEFAULT_MAX_HOPS} hops in flight; try again",
                    node.node_id
                ),
            )
        })?;
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        send_hop(st.mesh_node(), call)
    })
    .await
    .map_err(|e| {
        refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("hop task failed: {e}"),
        )
    })
}

/// Posts `call` to the next hop and relays its answer (a transport failure or a redirect is
/// a 502 naming the hop).
fn send_hop(node: &MeshNode, call: HopCall) -> Resp {
    let HopCall {
        url,
        name,
        headers,
        body,
        me,
        from,
    } = call;
    let mut req = node.agent.post(&format!("{url}{}", wire::ROUTE_CHAIN));
    for (h, v) in &headers {
        req = req.set(h, v);
    }
    let failed = |why: String| {
        let mut r = json(
            StatusCode::BAD_GATEWAY,
            &wire::ErrorBody {
                held: None,
                error: "hop_failed".into(),
                message: format!("{name} at {url} failed after {from}: {why}"),
            },
        );
        set(&mut r, wire::H_FAILED_HOP, url.clone());
        set(&mut r, wire::H_CHAIN_TRACE, me.clone());
        r
    };
    let r = match req.send_bytes(&body) {
        Ok(r) if (300..400).contains(&r.status()) => {
            return failed(format!(
                "answered a redirect ({}), not followed",
                r.status()
            ))
        }
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return failed(e.to_string()),
    };
    let status = r.status();
    let ct = r
        .header("content-type")
        .unwrap_or("application/octet-stream")
        .to_string();
    let trace = r
        .header(wire::H_CHAIN_TRACE)
        .map(|t| format!("{me},{t}"))
        .unwrap_or_else(|| me.clone());
    let failed_hop = r.header(wire::H_FAILED_HOP).map(str::to_string);
    // A sealed answer travels back unchanged, with what its seal binds.
    let passed: Vec<(&'static str, String)> = [wire::H_SEAL, wire::H_SEAL_TS, wire::H_REQUEST_ID]
        .into_iter()
        .filter_map(|h| r.header(h).map(|v| (h, v.to_string())))
        .collect();
    let mut b = Vec::new();
    let read = r.into_reader().take(256 << 20).read_to_end(&mut b);
    let mut out = binary(b);
    *out.status_mut() = match read {
        Ok(_) => StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        Err(_) => StatusCode::BAD_GATEWAY,
    };
    if let Ok(v) = hyper::header::HeaderValue::from_str(&ct) {
        out.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    set(&mut out, wire::H_CHAIN_TRACE, trace);
    if let Some(f) = failed_hop {
        set(&mut out, wire::H_FAILED_HOP, f);
    }
    for (h, v) in passed {
        set(&mut out, h, v);
    }
    out
}

/// Opens a sealed body (request at the entry, residual elsewhere) or passes an open one
/// through on a keyless node; `ctx.ts_ms` is taken from `X-Seal-Ts`. Returns the plaintext
/// and the milliseconds spent.
pub(crate) fn unseal(
    node: &MeshNode,
    body: &[u8],
    seal_h: Option<&str>,
    ts_h: Option<&str>,
    mut ctx: SealContext,
) -> Result<(Vec<u8>, f64), Refusal> {
    let what = match ctx.dir {
        SealDir::Request => "request",
        _ => "residual",
    };
    match (&node.key, seal_h) {
        (Some(key), Some("v1")) => {
            let t = Instant::now();
            ctx.ts_ms = ts_h.and_then(wire::parse_timestamp_ms).ok_or_else(|| {
                refuse(
                    StatusCode::BAD_REQUEST,
                    "bad_seal",
                    "sealed request without a numeric X-Seal-Ts",
                )
            })?;
            let (plain, nonce) = key.open(body, &ctx).map_err(seal_refusal)?;
            node.replay.accept(nonce, ctx.ts_ms).map_err(seal_refusal)?;
            Ok((plain, t.elapsed().as_secs_f64() * 1e3))
        }
        (Some(_), Some(v)) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "bad_seal",
            format!("X-Seal {v:?}: this node speaks v1"),
        )),
        (Some(_), None) => Err(refuse(
            StatusCode::UNAUTHORIZED,
            "unsealed",
            format!(
                "node {} is in a sealed mesh and refuses an unsealed {what}",
                node.node_id
            ),
        )),
        (None, Some(_)) => Err(refuse(
            StatusCode::BAD_REQUEST,
            "no_key",
            format!(
                "node {} has no mesh key and cannot open a sealed {what}",
                node.node_id
            ),
        )),
        (None, None) => Ok((body.to_vec(), 0.0)),
    }
}

/// A grant the entry refuses: 403 naming why (`grant_revoked` for a revoked grant or
/// parent), 503 when the revocation list cannot be trusted (fail closed).
fn grant_refusal(e: GrantError) -> Refusal {
    let (status, code) = match &e {
        GrantError::Revoked { .. } => (StatusCode::FORBIDDEN, "grant_revoked"),
        GrantError::Revocations { .. } => {
            (StatusCode::SERVICE_UNAVAILABLE, "revocations_unverified")
        }
        _ => (StatusCode::FORBIDDEN, "grant_refused"),
    };
    refuse(status, code, e.to_string())
}

fn seal_refusal(e: SealError) -> Refusal {
    let (status, code) = match &e {
        SealError::Tampered | SealError::Short(_) => (StatusCode::FORBIDDEN, "seal_invalid"),
        SealError::Replayed => (StatusCode::CONFLICT, "replayed"),
        SealError::Stale { .. } => (StatusCode::CONFLICT, "stale"),
        SealError::Key { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "key"),
    };
    refuse(status, code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hidden_ask_goes_alone_with_logits() {
        let hidden = wire::ExitAsk {
            hidden: true,
            ..Default::default()
        };
        assert!(check_ask(&hidden, false, 3).is_ok());
        // Hidden states of every row: not with a token answer, a sampler or candidates.
        assert!(check_ask(&hidden, true, 3).is_err());
        for ask in [
            wire::ExitAsk {
                logprobs: Some(2),
                ..hidden.clone()
            },
            wire::ExitAsk {
                candidates: Some(4),
                ..hidden.clone()
            },
            wire::ExitAsk {
                drafts: vec![1],
                ..hidden.clone()
            },
        ] {
            assert!(check_ask(&ask, false, 3).is_err(), "{ask:?}");
        }
        // An ask without it serializes as before (older stations read it unchanged).
        let plain = serde_json::to_string(&wire::ExitAsk::default()).expect("json");
        assert!(!plain.contains("hidden"), "{plain}");
    }
}
