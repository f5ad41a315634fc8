//! Blocking station client and the chain that drives tokens through a list of stations, and
//! the client side of a sealed `POST /chain` ([`SealedStep`]).
//!
//! Used by moonshine, paris-probe and the parity tools. Keep-alive connections are pooled
//! per client; every call has a timeout so a dead hop never hangs the caller.

use std::io::Read;
use std::time::Duration;

use knot_format::LayerRange;
use serde::{Deserialize, Serialize};

use crate::mesh::seal::{self, MeshKey, SealContext, SealDir};
use crate::wire::{self, ErrorBody, Health};

/// Why a station call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{url}: {status} {code}: {message}")]
    Refused {
        url: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{url}: {source}")]
    Transport {
        url: String,
        source: Box<ureq::Error>,
    },
    #[error("{url}: bad response: {why}")]
    BadResponse { url: String, why: String },
    #[error("mesh: {0}")]
    Mesh(String),
    /// A sealed mesh's answer that is unsealed, does not verify, or answers another request.
    #[error("{url}: sealed response refused: {why}")]
    Sealed { url: String, why: String },
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
    /// A client for `base` (`http://host:port`), with `timeout` per call.
    pub fn new(base: &str, timeout: Duration) -> Self {
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
                let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
                    Ok(e) => (e.error, e.message),
                    Err(_) => ("http".into(), text),
                };
                Err(ClientError::Refused {
                    url,
                    status,
                    code,
                    message,
                })
            }
            Err(e) => Err(ClientError::Transport {
                url,
                source: Box::new(e),
            }),
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

    /// `GET /health`.
    pub fn health(&self) -> Result<Health, ClientError> {
        let r = self.call(
            self.agent
                .get(&format!("{}{}", self.base, wire::ROUTE_HEALTH)),
            None,
        )?;
        self.json(r)
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
        let url = r.get_url().to_string();
        let mut b = Vec::new();
        r.into_reader()
            .read_to_end(&mut b)
            .map_err(|e| ClientError::BadResponse {
                url: url.clone(),
                why: e.to_string(),
            })?;
        wire::decode_vocab(&b).map_err(|why| ClientError::BadResponse { url, why })
    }

    fn binary(&self, r: ureq::Response) -> Result<Hop, ClientError> {
        let url = r.get_url().to_string();
        let compute_ms = r
            .header(wire::H_COMPUTE_MS)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        let f16 = r.header(wire::H_DTYPE) == Some("f16");
        let mut b = Vec::new();
        r.into_reader()
            .read_to_end(&mut b)
            .map_err(|e| ClientError::BadResponse {
                url: url.clone(),
                why: e.to_string(),
            })?;
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

/// One hop of a chain: a station and the blocks it runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MeshHop {
    pub url: String,
    /// `a-b`, half-open original layer indices.
    pub layers: String,
}

/// A mesh file: stations in order; the first serves `/embed`, the last `/lm-head`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MeshFile {
    #[serde(default)]
    pub model: Option<String>,
    pub stations: Vec<MeshHop>,
}

/// Stations chained in layer order.
pub struct Chain {
    hops: Vec<(StationClient, LayerRange)>,
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
        Ok(Chain { hops })
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
