//! Blocking station client and the chain that drives tokens through a list of stations, and
//! the client side of a sealed `POST /chain` ([`SealedStep`]).
//!
//! Used by moonshine, paris-probe and the parity tools. Keep-alive connections are pooled
//! per client; every call has a timeout so a dead hop never hangs the caller.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use knot_format::LayerRange;
use serde::{Deserialize, Serialize};

use crate::mesh_file::MeshFile;
use crate::seal::{self, MeshKey, SealContext, SealDir};
use crate::wire::{self, Health, Refusal};

/// Why a station call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Refused(Refusal),
    /// The call did not get an answer: `why` is the cause in a few words (`connection
    /// refused`, `timed out`); `unreachable` when no connection was made at all, and then the
    /// message asks whether a station runs at `base`.
    #[error("{}", transport_message(.url, .base, .why, *.unreachable))]
    Transport {
        url: String,
        base: String,
        why: String,
        unreachable: bool,
    },
    /// `base` answers the OpenAI API rather than the station wire (`what` names it: a moonshine
    /// gateway or another OpenAI-compatible server).
    #[error("{base} is {what}, not a fat-station: give the URL of a station (the one the gateway was started with), or send OpenAI requests to {base}/v1")]
    NotAStation { base: String, what: String },
    #[error("{url}: bad response: {why}")]
    BadResponse { url: String, why: String },
    #[error("mesh: {0}")]
    Mesh(String),
    /// A sealed mesh's answer that is unsealed, does not verify, or answers another request.
    #[error("{url}: sealed response refused: {why}")]
    Sealed { url: String, why: String },
}

/// A station URL that [`station_url`] refused; the message quotes it and says what to write.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a station URL: {why} (write HOST:PORT or http://HOST:PORT)")]
pub struct UrlError {
    pub input: String,
    pub why: String,
}

/// A station's (or a gateway's) base URL as people type it: `http://HOST[:PORT]` or just
/// `HOST[:PORT]` (stations speak plain HTTP, so `http://` is implied), IPv6 hosts in brackets.
/// Returns `http://HOST[:PORT]` without a trailing slash; refuses `https://` and other
/// schemes, a path, query or user info, a port outside 1..65535, and a bare port (`8080`,
/// with a hint to write `127.0.0.1:8080`). Use it as the clap `value_parser` of URL flags.
pub fn station_url(s: &str) -> Result<String, UrlError> {
    let t = s.trim();
    let bad = |why: String| UrlError {
        input: s.to_string(),
        why,
    };
    let rest = match t.split_once("://") {
        Some((scheme, r)) if scheme.eq_ignore_ascii_case("http") => r,
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err(bad("stations speak plain HTTP, not https".into()))
        }
        Some((scheme, _)) => return Err(bad(format!("unknown scheme {scheme:?}"))),
        None => t,
    };
    let authority = rest.trim_end_matches('/');
    if authority.is_empty() {
        return Err(bad("no host".into()));
    }
    if authority.contains(['/', '?', '#', '@']) || authority.contains(char::is_whitespace) {
        return Err(bad("a station URL has no path, query or user".into()));
    }
    if let Ok(p) = authority.parse::<u16>() {
        return Err(bad(format!("a bare port: did you mean 127.0.0.1:{p}?")));
    }
    let port = match authority.strip_prefix('[') {
        Some(v6) => match v6.split_once(']') {
            Some((_, "")) => None,
            Some((_, after)) => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| bad("junk after the IPv6 host".into()))?,
            ),
            None => return Err(bad("unclosed '[' in an IPv6 host".into())),
        },
        None => authority.rsplit_once(':').map(|(_, p)| p),
    };
    if let Some(p) = port {
        if !matches!(p.parse::<u16>(), Ok(1..)) {
            return Err(bad(format!("port {p:?} is not a number in 1..65535")));
        }
    }
    Ok(format!("http://{authority}"))
}

/// [`ClientError::Transport`]'s one line: `cannot reach URL: connection refused (is
/// fat-station running at BASE?)`, or `URL: timed out` once connected.
fn transport_message(url: &str, base: &str, why: &str, unreachable: bool) -> String {
    if unreachable {
        format!("cannot reach {url}: {why} (is fat-station running at {base}?)")
    } else {
        format!("{url}: {why}")
    }
}

/// The cause of a failed call in a few words, and whether no connection was made at all.
/// (ureq's own message repeats the URL and its source's text.)
fn transport_cause(e: &ureq::Error) -> (String, bool) {
    let ureq::Error::Transport(t) = e else {
        return (e.to_string(), false);
    };
    let unreachable = matches!(
        t.kind(),
        ureq::ErrorKind::ConnectionFailed | ureq::ErrorKind::Dns
    );
    let mut src = std::error::Error::source(t);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return (io_cause(io), unreachable);
        }
        src = s.source();
    }
    let why = match (t.kind(), t.message()) {
        (ureq::ErrorKind::Dns, _) => "cannot resolve the host name".to_string(),
        (k, Some(m)) => format!("{}: {m}", k.to_string().to_lowercase()),
        (k, None) => k.to_string().to_lowercase(),
    };
    (why, unreachable)
}

/// An I/O error in a few words (`connection refused`, not `Connection refused (os error 111)`).
fn io_cause(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::ConnectionRefused => "connection refused".into(),
        K::TimedOut | K::WouldBlock => "timed out".into(),
        K::ConnectionReset => "connection reset".into(),
        K::ConnectionAborted => "connection aborted".into(),
        K::UnexpectedEof => "the connection closed before an answer".into(),
        K::AddrNotAvailable => "address not available".into(),
        _ => e.to_string(),
    }
}

/// One station's client.
#[derive(Clone)]
pub struct StationClient {
    base: String,
    agent: ureq::Agent,
}

/// A residual returned by a hop, with the station's timing.
#[derive(Clone, Debug)]
pub struct Hop {
    pub residual: Vec<f32>,
    /// `X-Compute-Ms` as the station reported it.
    pub compute_ms: f64,
    /// Bytes received.
    pub bytes: usize,
}

impl StationClient {
    /// A client for `base` (`http://host:port`, or `host:port`: see [`station_url`]), with
    /// `timeout` per call.
    pub fn new(base: &str, timeout: Duration) -> Self {
        let base = station_url(base).unwrap_or_else(|_| base.to_string());
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5).min(timeout))
            .timeout(timeout)
            .build();
        StationClient {
            base: base.trim_end_matches('/').to_string(),
            agent,
        }
    }

    /// The station's base URL.
    pub fn url(&self) -> &str {
        &self.base
    }

    fn call(&self, req: ureq::Request, body: Option<&[u8]>) -> Result<ureq::Response, ClientError> {
        let url = req.url().to_string();
        let res = match body {
            Some(b) => req.send_bytes(b),
            None => req.call(),
        };
        match res {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(status, r)) => {
                let text = r.into_string().unwrap_or_default();
                Err(ClientError::Refused(Refusal::from_body(url, status, text)))
            }
            Err(e) => {
                let (why, unreachable) = transport_cause(&e);
                Err(ClientError::Transport {
                    url,
                    base: self.base.clone(),
                    why,
                    unreachable,
                })
            }
        }
    }

    fn json<T: for<'de> Deserialize<'de>>(&self, r: ureq::Response) -> Result<T, ClientError> {
        let url = r.get_url().to_string();
        let text = r.into_string().map_err(|e| ClientError::BadResponse {
            url: url.clone(),
            why: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| ClientError::BadResponse {
            url,
            why: format!("invalid JSON: {e}"),
        })
    }

    fn post_json<B: Serialize, T: for<'de> Deserialize<'de>>(
        &self,
        route: &str,
        body: &B,
    ) -> Result<T, ClientError> {
        let b = serde_json::to_vec(body).map_err(|e| ClientError::BadResponse {
            url: self.base.clone(),
            why: e.to_string(),
        })?;
        let r = self.call(
            self.agent
                .post(&format!("{}{route}", self.base))
                .set("content-type", "application/json"),
            Some(&b),
        )?;
        self.json(r)
    }

    /// `GET /health`. When the answer is not a station's (a gateway's `/health`, a 404), asks
    /// `/v1/models` and names an OpenAI server passed where a station was meant
    /// ([`ClientError::NotAStation`]).
    pub fn health(&self) -> Result<Health, ClientError> {
        let answer = self
            .call(
                self.agent
                    .get(&format!("{}{}", self.base, wire::ROUTE_HEALTH)),
                None,
            )
            .and_then(|r| self.json(r));
        match answer {
            Err(e @ (ClientError::BadResponse { .. } | ClientError::Refused(_))) => {
                Err(self.openai_server().unwrap_or(e))
            }
            other => other,
        }
    }

    /// `Some(NotAStation)` when `GET /v1/models` answers an OpenAI model list.
    fn openai_server(&self) -> Option<ClientError> {
        let r = self
            .agent
            .get(&format!("{}/v1/models", self.base))
            .call()
            .ok()?;
        let v: serde_json::Value = serde_json::from_str(&r.into_string().ok()?).ok()?;
        if v.get("object")?.as_str()? != "list" {
            return None;
        }
        let ours = v["data"]
            .as_array()
            .is_some_and(|d| d.iter().any(|m| m["owned_by"] == "aeon-shell"));
        let what = if ours {
            "a moonshine gateway (OpenAI API)"
        } else {
            "an OpenAI-compatible server"
        };
        Some(ClientError::NotAStation {
            base: self.base.clone(),
            what: what.into(),
        })
    }

    /// `GET /tokenizer`: special ids and the chat template.
    pub fn tokenizer_info(&self) -> Result<wire::TokenizerInfo, ClientError> {
        let r = self.call(
            self.agent
                .get(&format!("{}{}", self.base, wire::ROUTE_TOKENIZER)),
            None,
        )?;
        self.json(r)
    }

    /// `POST /tokenize`.
    pub fn tokenize(&self, text: &str, add_bos: Option<bool>) -> Result<Vec<u32>, ClientError> {
        let t: wire::Tokens = self.post_json(
            wire::ROUTE_TOKENIZE,
            &wire::TokenizeRequest {
                text: text.into(),
                add_bos,
                ..Default::default()
            },
        )?;
        Ok(t.tokens)
    }

    /// `POST /tokenize` with `parts`: `(text, parse_special)` pieces encoded as one text, with
    /// special tokens only where `parse_special` is true (a chat template's markup, never a
    /// user's content).
    pub fn tokenize_parts(
        &self,
        parts: &[(&str, bool)],
        add_bos: Option<bool>,
    ) -> Result<Vec<u32>, ClientError> {
        let t: wire::Tokens = self.post_json(
            wire::ROUTE_TOKENIZE,
            &wire::TokenizeRequest {
                add_bos,
                parts: Some(
                    parts
                        .iter()
                        .map(|&(text, parse_special)| wire::TextPart {
                            text: text.into(),
                            parse_special,
                        })
                        .collect(),
                ),
                ..Default::default()
            },
        )?;
        if t.tokens.is_empty() && parts.iter().any(|p| !p.0.is_empty()) {
            // A station older than `parts` reads only the (empty) `text`.
            return Err(ClientError::BadResponse {
                url: format!("{}{}", self.base, wire::ROUTE_TOKENIZE),
                why: "no tokens for non-empty parts: the station predates /tokenize parts".into(),
            });
        }
        Ok(t.tokens)
    }

    /// `POST /detokenize`.
    pub fn detokenize(&self, tokens: &[u32]) -> Result<String, ClientError> {
        let t: wire::Text = self.post_json(
            wire::ROUTE_DETOKENIZE,
            &wire::Tokens {
                tokens: tokens.to_vec(),
            },
        )?;
        Ok(t.text)
    }

    /// `GET /vocab`: every token's bytes and whether it is special, in id order.
    pub fn vocab(&self) -> Result<Vec<wire::VocabToken>, ClientError> {
        let r = self.call(
            self.agent
                .get(&format!("{}{}", self.base, wire::ROUTE_VOCAB)),
            None,
        )?;
        let (url, b) = body_bytes(r)?;
        wire::decode_vocab(&b).map_err(|why| ClientError::BadResponse { url, why })
    }

    fn binary(&self, r: ureq::Response) -> Result<Hop, ClientError> {
        let compute_ms = r
            .header(wire::H_COMPUTE_MS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let f16 = r.header(wire::H_DTYPE) == Some("f16");
        let (url, b) = body_bytes(r)?;
        let residual = if f16 {
            wire::decode_f16(&b)
        } else {
            wire::decode_f32(&b)
        }
        .ok_or_else(|| ClientError::BadResponse {
            url,
            why: format!("{} bytes is not a float array", b.len()),
        })?;
        Ok(Hop {
            residual,
            compute_ms,
            bytes: b.len(),
        })
    }

    /// `POST /embed`: tokens -> residual rows.
    pub fn embed(&self, tokens: &[u32]) -> Result<Hop, ClientError> {
        let b = serde_json::to_vec(&wire::EmbedRequest {
            tokens: tokens.to_vec(),
        })
        .unwrap_or_default();
        let r = self.call(
            self.agent
                .post(&format!("{}{}", self.base, wire::ROUTE_EMBED))
                .set("content-type", "application/json"),
            Some(&b),
        )?;
        self.binary(r)
    }

    /// `POST /forward` over `range`, optionally within a session at position `pos`.
    pub fn forward(
        &self,
        x: &[f32],
        range: LayerRange,
        session: Option<(&str, usize)>,
        f16: bool,
    ) -> Result<Hop, ClientError> {
        let mut req = self
            .agent
            .post(&format!("{}{}", self.base, wire::ROUTE_FORWARD))
            .set("content-type", "application/octet-stream")
            .set(
                wire::H_LAYER_RANGE,
                &format!("{}-{}", range.start, range.end),
            );
        if let Some((id, pos)) = session {
            req = req
                .set(wire::H_SESSION, id)
                .set(wire::H_POS, &pos.to_string());
        }
        if f16 {
            req = req.set(wire::H_DTYPE, "f16");
        }
        let body = if f16 {
            wire::encode_f16(x)
        } else {
            wire::encode_f32(x)
        };
        let r = self.call(req, Some(&body))?;
        self.binary(r)
    }

    /// `POST /lm-head`: residual rows -> logits of the last row.
    pub fn lm_head(&self, x: &[f32]) -> Result<Hop, ClientError> {
        self.lm_head_rows(x, 1)
    }

    /// `POST /lm-head` with `X-Logit-Rows: rows`: logits of the last `rows` rows,
    /// `(rows, vocab)` row-major.
    pub fn lm_head_rows(&self, x: &[f32], rows: usize) -> Result<Hop, ClientError> {
        let mut req = self
            .agent
            .post(&format!("{}{}", self.base, wire::ROUTE_LM_HEAD))
            .set("content-type", "application/octet-stream");
        if rows != 1 {
            req = req.set(wire::H_LOGIT_ROWS, &rows.to_string());
        }
        let r = self.call(req, Some(&wire::encode_f32(x)))?;
        let hop = self.binary(r)?;
        if !hop.residual.len().is_multiple_of(rows.max(1)) {
            return Err(ClientError::BadResponse {
                url: format!("{}{}", self.base, wire::ROUTE_LM_HEAD),
                why: format!("{} logits are not {rows} whole rows", hop.residual.len()),
            });
        }
        Ok(hop)
    }
}

/// The client side of one sealed `POST /chain` step (`specs/mesh.md`, "Trust on the wire"):
/// seals the `{"tokens": [...]}` request under a fresh random request id, and opens the exit's
/// answer under that same id, so neither an old answer nor a request's own seal (another
/// direction tag) can stand in for it.
pub struct SealedStep<'a> {
    key: &'a MeshKey,
    /// The id both seals bind (send it as `X-Request-Id`).
    pub request_id: String,
    session: &'a str,
    pos: usize,
    route: &'a str,
    ret: &'static str,
    /// Milliseconds spent sealing and opening so far.
    pub seal_ms: f64,
}

impl<'a> SealedStep<'a> {
    /// A step at `pos` of `session` (or stateless), with `route` as sent in `X-Route` (empty
    /// when none) and `want_token` as `X-Return: token`.
    pub fn new(
        key: &'a MeshKey,
        session: Option<(&'a str, usize)>,
        route: &'a str,
        want_token: bool,
    ) -> SealedStep<'a> {
        let (session, pos) = session.unwrap_or(("", 0));
        SealedStep {
            key,
            request_id: seal::random_request_id(),
            session,
            pos,
            route,
            ret: seal::ret_tag(want_token),
            seal_ms: 0.0,
        }
    }

    /// Seals the request body for the entry; returns it and the `X-Seal-Ts` value. Send it
    /// with `X-Seal: v1`, `X-Seal-Ts` and `X-Request-Id: self.request_id`.
    pub fn seal_request(&mut self, body: &[u8]) -> (Vec<u8>, u64) {
        let t = std::time::Instant::now();
        let ts = seal::now_ms();
        let ctx = SealContext {
            dir: SealDir::Request,
            request_id: &self.request_id,
            from_layer: 0,
            session: self.session,
            pos: self.pos,
            ts_ms: ts,
            route: self.route,
            ret: self.ret,
        };
        let sealed = self.key.seal(body, &ctx);
        self.seal_ms += t.elapsed().as_secs_f64() * 1e3;
        (sealed, ts)
    }

    /// Opens the exit's answer: `seal` and `ts` are the response's `X-Seal` and `X-Seal-Ts`,
    /// `exit_layer` the exit's range end (the model's layer count).
    pub fn open_response(
        &mut self,
        url: &str,
        seal: Option<&str>,
        ts: Option<&str>,
        exit_layer: u32,
        body: &[u8],
    ) -> Result<Vec<u8>, ClientError> {
        let refused = |why: String| ClientError::Sealed {
            url: url.to_string(),
            why,
        };
        match seal {
            Some("v1") => {}
            Some(v) => return Err(refused(format!("unknown X-Seal {v:?}"))),
            None => {
                return Err(refused(
                    "the answer is not sealed, but this client holds the mesh key".into(),
                ))
            }
        }
        let ts_ms = ts
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| refused("sealed answer without a numeric X-Seal-Ts".into()))?;
        let t = std::time::Instant::now();
        let ctx = SealContext {
            dir: SealDir::Response,
            request_id: &self.request_id,
            from_layer: exit_layer,
            session: self.session,
            pos: self.pos,
            ts_ms,
            route: "",
            ret: self.ret,
        };
        let out = self.key.open(body, &ctx).map(|(plain, _)| plain);
        self.seal_ms += t.elapsed().as_secs_f64() * 1e3;
        out.map_err(|e| refused(e.to_string()))
    }
}

/// Stations chained in layer order.
pub struct Chain {
    hops: Vec<(StationClient, LayerRange)>,
    /// Send each step as one `POST /chain` to the entry (the stations forward node to node),
    /// rather than `/embed`, `/forward` per hop and `/lm-head` from here.
    relay: AtomicBool,
}

/// What one step asks of the chain's exit.
#[derive(Clone, Debug)]
pub enum Ask {
    /// The logits of the last `rows` tokens, `(rows, vocab)` row-major.
    Logits { rows: usize },
    /// `X-Return: token` with this ask: the exit's sampler picks (through `POST /chain`). The
    /// per-hop path answers the logits of `drafts.len() + 1` rows instead, for the caller to
    /// pick from.
    Token(wire::ExitAsk),
    /// Every row's final hidden state (after the output norm), `(tokens, hidden)` row-major,
    /// answered as [`Answer::Logits`]; only through `POST /chain` ([`wire::ExitAsk::hidden`]).
    Hidden,
}

/// What the exit answered.
#[derive(Clone, Debug)]
pub enum Answer {
    /// Logit rows, `(rows, vocab)` row-major.
    Logits(Vec<f32>),
    /// The exit's picks.
    Picks(wire::ChainToken),
}

/// `/chain` refusals that mean "this chain cannot relay" (not "this request is wrong"):
/// an entry that may not forward to the next hop (`route_refused`), a full station whose
/// head comes before the mesh's end (`route_past_exit`), a node with no next hop
/// (`no_successor`), a station without `/chain` (404).
fn cannot_relay(e: &ClientError) -> bool {
    matches!(e, ClientError::Refused(Refusal { status, code, .. })
        if *status == 404 || matches!(code.as_str(), "route_refused" | "route_past_exit" | "no_successor"))
}

/// What one token step through the chain cost, hop by hop.
#[derive(Clone, Debug, Default)]
pub struct StepTrace {
    /// (url, range, bytes received, compute ms) per forward hop.
    pub hops: Vec<(String, LayerRange, usize, f64)>,
    pub embed_ms: f64,
    pub head_ms: f64,
}

impl Chain {
    /// Builds a chain and checks that the ranges tile `0..n` with no gap or overlap.
    pub fn new(hops: Vec<(StationClient, LayerRange)>) -> Result<Chain, ClientError> {
        if hops.is_empty() {
            return Err(ClientError::Mesh("no stations".into()));
        }
        let mut next = 0;
        for (c, r) in &hops {
            if r.start != next || r.is_empty() {
                return Err(ClientError::Mesh(format!(
                    "{} runs {}-{}, expected a range starting at {next}",
                    c.url(),
                    r.start,
                    r.end
                )));
            }
            next = r.end;
        }
        Ok(Chain {
            hops,
            relay: AtomicBool::new(false),
        })
    }

    /// Sends each step as one `POST /chain` to the entry when `on` (the caller checked that
    /// every station holds exactly its hop's layers); a chain that refuses to relay
    /// ([`Chain::trip`]) turns it off again.
    pub fn set_relay(&self, on: bool) {
        self.relay.store(on, Ordering::Relaxed);
    }

    /// True while steps go through `POST /chain`.
    pub fn relays(&self) -> bool {
        self.relay.load(Ordering::Relaxed)
    }

    /// One step: `tokens` at `pos` of `session` (or stateless), answering what `ask` asks.
    /// Relaying, one `POST /chain` to the entry with the other hops in `X-Route`; a chain that
    /// refuses to relay (a station that may not forward to the next, a full station in a
    /// split) falls back to the per-hop path for good, with a warning. Per hop: `/embed`,
    /// `/forward` on each, `/lm-head`, and always logits.
    pub fn trip(
        &self,
        tokens: &[u32],
        session: Option<(&str, usize)>,
        ask: &Ask,
        trace: &mut StepTrace,
    ) -> Result<Answer, ClientError> {
        if self.relays() {
            match self.relay_trip(tokens, session, ask, trace) {
                Err(e) if cannot_relay(&e) => {
                    tracing::warn!("the chain does not relay ({e}); driving each hop instead");
                    self.set_relay(false);
                    *trace = StepTrace::default();
                }
                other => return other,
            }
        }
        let rows = match ask {
            Ask::Logits { rows } => *rows,
            Ask::Token(a) => a.drafts.len() + 1,
            Ask::Hidden => return Err(ClientError::Mesh(
                "hidden states need the one-trip POST /chain path, which this chain does not relay"
                    .into(),
            )),
        };
        self.step_rows(tokens, session, rows, trace)
            .map(Answer::Logits)
    }

    /// [`Chain::trip`] through `POST /chain`.
    fn relay_trip(
        &self,
        tokens: &[u32],
        session: Option<(&str, usize)>,
        ask: &Ask,
        trace: &mut StepTrace,
    ) -> Result<Answer, ClientError> {
        let entry = self.entry();
        let url = format!("{}{}", entry.base, wire::ROUTE_CHAIN);
        let mut req = entry
            .agent
            .post(&url)
            .set("content-type", "application/json");
        let (exit, rows, want_token) = match ask {
            Ask::Logits { rows } => {
                let rows = (*rows).max(1);
                let exit = (rows > 1).then(|| wire::ExitAsk {
                    rows,
                    ..Default::default()
                });
                (exit, rows, false)
            }
            Ask::Token(a) => (Some(a.clone()), a.drafts.len() + 1, true),
            Ask::Hidden => (
                Some(wire::ExitAsk {
                    hidden: true,
                    ..Default::default()
                }),
                tokens.len(),
                false,
            ),
        };
        if want_token {
            req = req.set(wire::H_RETURN, "token");
        }
        if let Some((id, pos)) = session {
            req = req
                .set(wire::H_SESSION, id)
                .set(wire::H_POS, &pos.to_string());
        }
        let route: Vec<&str> = self.hops[1..].iter().map(|(c, _)| c.url()).collect();
        if !route.is_empty() {
            req = req.set(wire::H_ROUTE, &route.join(","));
        }
        let body = serde_json::to_vec(&wire::ChainRequest {
            tokens: tokens.to_vec(),
            exit,
        })
        .unwrap_or_default();
        let r = entry.call(req, Some(&body))?;
        let ran = r
            .header(wire::H_CHAIN_TRACE)
            .map(parse_chain_trace)
            .unwrap_or_default();
        let (url, b) = body_bytes(r)?;
        let want: Vec<LayerRange> = self.hops.iter().map(|h| h.1).collect();
        let got: Vec<LayerRange> = ran.iter().map(|t| t.0).collect();
        if got != want {
            let show = |v: &[LayerRange]| {
                v.iter()
                    .map(|r| format!("{}-{}", r.start, r.end))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return Err(ClientError::Mesh(format!(
                "{url}: the chain ran {} but the mesh assigns {}",
                show(&got),
                show(&want)
            )));
        }
        trace.hops = self
            .hops
            .iter()
            .zip(&ran)
            .map(|((c, r), t)| (c.url().to_string(), *r, 0, t.1))
            .collect();
        if let Some(last) = trace.hops.last_mut() {
            last.2 = b.len();
        }
        let bad = |why: String| ClientError::BadResponse {
            url: url.clone(),
            why,
        };
        if want_token {
            let t: wire::ChainToken =
                serde_json::from_slice(&b).map_err(|e| bad(format!("invalid JSON: {e}")))?;
            return Ok(Answer::Picks(t));
        }
        let logits = wire::decode_f32(&b)
            .filter(|l| !l.is_empty() && l.len().is_multiple_of(rows))
            .ok_or_else(|| bad(format!("{} bytes are not {rows} rows of logits", b.len())))?;
        Ok(Answer::Logits(logits))
    }

    /// Parses a mesh file's hops.
    pub fn from_mesh(mesh: &MeshFile, timeout: Duration) -> Result<Chain, ClientError> {
        let hops = mesh
            .stations
            .iter()
            .map(|h| {
                let r = LayerRange::parse(&h.layers).ok_or_else(|| {
                    ClientError::Mesh(format!("bad layers {:?} for {}", h.layers, h.url))
                })?;
                Ok((StationClient::new(&h.url, timeout), r))
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Chain::new(hops)
    }

    /// A single full station: asks it which layers it serves.
    pub fn single(url: &str, timeout: Duration) -> Result<Chain, ClientError> {
        let c = StationClient::new(url, timeout);
        let h = c.health()?;
        let r = LayerRange::parse(&h.layers)
            .ok_or_else(|| ClientError::Mesh(format!("{url} reports bad layers {:?}", h.layers)))?;
        Chain::new(vec![(c, r)])
    }

    /// The entry station (serves `/embed`, `/tokenize`).
    pub fn entry(&self) -> &StationClient {
        &self.hops[0].0
    }

    /// The exit station (serves `/lm-head`).
    pub fn exit(&self) -> &StationClient {
        &self.hops[self.hops.len() - 1].0
    }

    /// The hops in order.
    pub fn hops(&self) -> &[(StationClient, LayerRange)] {
        &self.hops
    }

    /// Tokens at position `pos` of `session` (or stateless) -> last-row logits.
    pub fn step(
        &self,
        tokens: &[u32],
        session: Option<(&str, usize)>,
        trace: &mut StepTrace,
    ) -> Result<Vec<f32>, ClientError> {
        self.step_rows(tokens, session, 1, trace)
    }

    /// [`Chain::step`] returning the logits of the last `rows` tokens, `(rows, vocab)`
    /// row-major (`X-Logit-Rows`): one trip that scores every drafted token.
    pub fn step_rows(
        &self,
        tokens: &[u32],
        session: Option<(&str, usize)>,
        rows: usize,
        trace: &mut StepTrace,
    ) -> Result<Vec<f32>, ClientError> {
        let e = self.entry().embed(tokens)?;
        trace.embed_ms = e.compute_ms;
        let mut x = e.residual;
        for (c, r) in &self.hops {
            let hop = c.forward(&x, *r, session, false)?;
            trace
                .hops
                .push((c.url().to_string(), *r, hop.bytes, hop.compute_ms));
            x = hop.residual;
        }
        let h = self.exit().lm_head_rows(&x, rows)?;
        trace.head_ms = h.compute_ms;
        Ok(h.residual)
    }
}

/// `X-Chain-Trace` (`node=a-b:ms:seal_ms,...`) as each node's range and compute ms (entries
/// that do not parse are left out).
fn parse_chain_trace(v: &str) -> Vec<(LayerRange, f64)> {
    v.split(',')
        .filter_map(|item| {
            let (_, rest) = item.trim().split_once('=')?;
            let mut p = rest.split(':');
            let range = LayerRange::parse(p.next()?)?;
            let ms = p.next()?.parse().ok()?;
            Some((range, ms))
        })
        .collect()
}

/// Largest binary response read from a hop: far above any real one (a 4096-row residual of a
/// 7B model is 58 MiB) but a bound, so a hostile hop cannot make the client read forever.
const MAX_RESPONSE_BYTES: u64 = 512 << 20;

/// A response's URL and whole body, at most [`MAX_RESPONSE_BYTES`].
fn body_bytes(r: ureq::Response) -> Result<(String, Vec<u8>), ClientError> {
    let url = r.get_url().to_string();
    let mut b = Vec::new();
    r.into_reader()
        .take(MAX_RESPONSE_BYTES + 1)
        .read_to_end(&mut b)
        .map_err(|e| ClientError::BadResponse {
            url: url.clone(),
            why: e.to_string(),
        })?;
    if b.len() as u64 > MAX_RESPONSE_BYTES {
        return Err(ClientError::BadResponse {
            url,
            why: format!("body over {MAX_RESPONSE_BYTES} bytes"),
        });
    }
    Ok((url, b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn station_urls_take_host_port_without_a_scheme() {
        for (given, want) in [
            ("127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
            ("HTTP://node-2:80", "http://node-2:80"),
            ("localhost", "http://localhost"),
            ("[::1]:9000", "http://[::1]:9000"),
            (" r1.local:8081 ", "http://r1.local:8081"),
        ] {
            assert_eq!(station_url(given).as_deref(), Ok(want), "{given}");
        }
    }

    #[test]
    fn station_urls_refuse_what_no_station_serves_with_the_reason() {
        for (given, why) in [
            ("https://x:1", "stations speak plain HTTP, not https"),
            ("ftp://x:1", "unknown scheme \"ftp\""),
            ("8080", "a bare port: did you mean 127.0.0.1:8080?"),
            ("http://", "no host"),
            ("x:0", "port \"0\" is not a number in 1..65535"),
            ("x:99999", "port \"99999\" is not a number in 1..65535"),
            ("x:1/v1", "a station URL has no path, query or user"),
            ("[::1", "unclosed '[' in an IPv6 host"),
        ] {
            let e = station_url(given).unwrap_err();
            assert_eq!(e.why, why, "{given}");
            assert_eq!(
                e.to_string(),
                format!(
                    "{given:?} is not a station URL: {why} (write HOST:PORT or http://HOST:PORT)"
                )
            );
        }
    }

    #[test]
    fn a_refused_connection_names_the_url_once_with_a_hint() {
        // Port 1 on loopback: nothing listens there.
        let c = StationClient::new("127.0.0.1:1", Duration::from_secs(2));
        assert_eq!(c.url(), "http://127.0.0.1:1");
        let e = c.health().unwrap_err();
        assert_eq!(
            e.to_string(),
            "cannot reach http://127.0.0.1:1/health: connection refused \
             (is fat-station running at http://127.0.0.1:1?)"
        );
        assert!(
            std::error::Error::source(&e).is_none(),
            "the cause is printed once"
        );
    }
}
