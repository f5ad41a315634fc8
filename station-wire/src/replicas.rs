//! Clients of forwarding meshes: one request per token to a chain's entry (`POST /chain`),
//! and a [`ReplicaSet`] that fails over to another chain when a node dies mid-generation.
//!
//! Failover: when a step fails at the transport level or with a 5xx, the chain is marked
//! dead and the step is retried on the next live chain under the same session id. That
//! chain's stations answer `409 session_mismatch` with the positions they hold (`"held"`:
//! what the dead chain's nodes shipped them, `--checkpoint-to`, else 0) and the client
//! re-sends every token from there. Without a live chain left, the error names the node, its
//! layer range and its URL. Every call has a timeout, so nothing hangs.

use std::io::Read;
use std::time::{Duration, Instant};

use knot_format::LayerRange;

use crate::mesh_file::{MeshFile, MeshHop};
use crate::wire;

/// Why a mesh step failed.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// A hop failed; names the node and range when the mesh file knows them.
    #[error("{who} failed: {why}")]
    HopFailed {
        who: String,
        url: String,
        status: Option<u16>,
        why: String,
    },
    /// A station refused the request (4xx): not a node failure, no failover.
    #[error(transparent)]
    Refused(wire::Refusal),
    #[error("{url}: bad response: {why}")]
    BadResponse { url: String, why: String },
    /// The stations ran other ranges than the chain lists (e.g. full-model stations given
    /// ranges by `moonshine mesh form --assign` but not restarted from its manifests).
    #[error("{url}: the chain ran {got} but the mesh assigns {want}; start the stations from the elector's manifests (fat-station --manifest) or use the per-hop client (moonshine --mesh)")]
    RangeMismatch {
        url: String,
        want: String,
        got: String,
    },
    #[error("every chain failed; last: {0}")]
    AllFailed(Box<MeshError>),
    #[error("mesh: {0}")]
    Config(String),
}

impl MeshError {
    /// Whether another chain may succeed where this failed.
    pub fn is_node_failure(&self) -> bool {
        matches!(self, MeshError::HopFailed { .. })
    }
}

/// The result of one step.
#[derive(Clone, Debug)]
pub struct StepOut {
    /// Argmax token (with `X-Return: token`), or of the logits.
    pub token: u32,
    pub logit: f32,
    /// Full logits when asked for.
    pub logits: Option<Vec<f32>>,
    /// `X-Chain-Trace`: (node, range, compute ms, seal ms) per node.
    pub trace: Vec<(String, String, f64, f64)>,
    /// Wall time of the request.
    pub wall_ms: f64,
}

/// Parses `node=a-b:ms:seal_ms,...`.
pub fn parse_trace(v: &str) -> Vec<(String, String, f64, f64)> {
    v.split(',')
        .filter_map(|item| {
            let (node, rest) = item.trim().split_once('=')?;
            let mut p = rest.split(':');
            let range = p.next()?.to_string();
            let ms = p.next()?.parse().ok()?;
            let seal = p.next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
            Some((node.to_string(), range, ms, seal))
        })
        .collect()
}

/// One forwarding chain, called at its entry.
pub struct MeshChain {
    pub hops: Vec<MeshHop>,
    agent: ureq::Agent,
    /// Send `X-Route` (the hops after the entry) rather than relying on manifest successors.
    pub source_route: bool,
    /// Hex grant for `X-Grant`.
    pub grant_hex: Option<String>,
    /// The mesh key of a sealed mesh: seal the request, open the answer.
    pub mesh_key: Option<crate::seal::MeshKey>,
}

impl MeshChain {
    /// A chain; `timeout` bounds each whole step (all hops).
    pub fn new(hops: Vec<MeshHop>, timeout: Duration) -> Result<MeshChain, MeshError> {
        if hops.is_empty() {
            return Err(MeshError::Config(
                "a chain needs at least one station".into(),
            ));
        }
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5).min(timeout))
            .timeout(timeout)
            .build();
        Ok(MeshChain {
            hops,
            agent,
            source_route: true,
            grant_hex: None,
            mesh_key: None,
        })
    }

    fn who(&self, url: &str) -> String {
        let u = url.trim_end_matches('/');
        match self.hops.iter().find(|h| h.url.trim_end_matches('/') == u) {
            Some(h) => format!("node {} (layers {}) at {u}", h.node_id, h.layers),
            None => format!("hop {u}"),
        }
    }

    /// Sends `tokens` at `pos` of `session` (or stateless) through the chain.
    pub fn step(
        &self,
        tokens: &[u32],
        session: Option<(&str, usize)>,
        want_logits: bool,
    ) -> Result<StepOut, MeshError> {
        let entry = self.hops[0].url.trim_end_matches('/');
        let url = format!("{entry}{}", wire::ROUTE_CHAIN);
        let mut req = self
            .agent
            .post(&url)
            .set("content-type", "application/json");
        if !want_logits {
            req = req.set(wire::H_RETURN, "token");
        }
        if let Some((s, p)) = session {
            req = req.set(wire::H_SESSION, s).set(wire::H_POS, &p.to_string());
        }
        let mut route = String::new();
        if self.source_route && self.hops.len() > 1 {
            let hops: Vec<&str> = self.hops[1..]
                .iter()
                .map(|h| h.url.trim_end_matches('/'))
                .collect();
            route = hops.join(",");
            req = req.set(wire::H_ROUTE, &route);
        }
        if let Some(g) = &self.grant_hex {
            req = req.set(wire::H_GRANT, g);
        }
        let body = serde_json::to_vec(&wire::ChainRequest {
            tokens: tokens.to_vec(),
            exit: None,
        })
        .map_err(|e| MeshError::Config(e.to_string()))?;
        let t = Instant::now();
        let mut sealed = self
            .mesh_key
            .as_ref()
            .map(|k| crate::client::SealedStep::new(k, session, &route, !want_logits));
        let body = match &mut sealed {
            Some(s) => {
                let (b, ts) = s.seal_request(&body);
                req = req
                    .set(wire::H_SEAL, "v1")
                    .set(wire::H_SEAL_TS, &ts.to_string())
                    .set(wire::H_REQUEST_ID, &s.request_id);
                b
            }
            None => body,
        };
        let resp = match req.send_bytes(&body) {
            Ok(r) => r,
            Err(ureq::Error::Status(status, r)) => {
                let failed = r.header(wire::H_FAILED_HOP).map(str::to_string);
                let text = r.into_string().unwrap_or_default();
                let refusal = wire::Refusal::from_body(url, status, text);
                if status >= 500 {
                    let u = failed.unwrap_or_else(|| entry.to_string());
                    return Err(MeshError::HopFailed {
                        who: self.who(&u),
                        url: u,
                        status: Some(status),
                        why: format!("{status} {}: {}", refusal.code, refusal.message),
                    });
                }
                return Err(MeshError::Refused(refusal));
            }
            Err(e) => {
                return Err(MeshError::HopFailed {
                    who: self.who(entry),
                    url: entry.to_string(),
                    status: None,
                    why: e.to_string(),
                })
            }
        };
        let trace = resp
            .header(wire::H_CHAIN_TRACE)
            .map(parse_trace)
            .unwrap_or_default();
        // A chain answers with one trace entry per node; the ranges must be those listed, or
        // the answer, though well-formed, did not come from this mesh's split.
        if !trace.is_empty() {
            let norm = |r: &str| {
                LayerRange::parse(r)
                    .map(|r| format!("{}-{}", r.start, r.end))
                    .unwrap_or_else(|| r.to_string())
            };
            let got: Vec<String> = trace.iter().map(|t| norm(&t.1)).collect();
            let want: Vec<String> = self.hops.iter().map(|h| norm(&h.layers)).collect();
            if got != want {
                return Err(MeshError::RangeMismatch {
                    url,
                    want: want.join(", "),
                    got: got.join(", "),
                });
            }
        }
        let bad = |why: String| MeshError::BadResponse {
            url: url.clone(),
            why,
        };
        let seal_h = resp.header(wire::H_SEAL).map(str::to_string);
        let seal_ts = resp.header(wire::H_SEAL_TS).map(str::to_string);
        let mut b = Vec::new();
        resp.into_reader()
            .take(64 << 20)
            .read_to_end(&mut b)
            .map_err(|e| bad(e.to_string()))?;
        if let Some(s) = &mut sealed {
            let exit_layer = self
                .hops
                .last()
                .and_then(|h| knot_format::LayerRange::parse(&h.layers))
                .map(|r| r.end)
                .unwrap_or(0);
            b = s
                .open_response(&url, seal_h.as_deref(), seal_ts.as_deref(), exit_layer, &b)
                .map_err(|e| match e {
                    crate::client::ClientError::Sealed { why, .. } => {
                        bad(format!("sealed response refused: {why}"))
                    }
                    e => bad(e.to_string()),
                })?;
        }
        let wall_ms = t.elapsed().as_secs_f64() * 1e3;
        if want_logits {
            let logits = wire::decode_f32(&b)
                .filter(|l| !l.is_empty())
                .ok_or_else(|| bad(format!("{} bytes is not logits", b.len())))?;
            let (token, logit) =
                logits
                    .iter()
                    .enumerate()
                    .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
                        if v > b.1 {
                            (i, v)
                        } else {
                            b
                        }
                    });
            Ok(StepOut {
                token: token as u32,
                logit,
                logits: Some(logits),
                trace,
                wall_ms,
            })
        } else {
            let t: wire::ChainToken =
                serde_json::from_slice(&b).map_err(|e| bad(format!("invalid JSON: {e}")))?;
            Ok(StepOut {
                token: t.token,
                logit: t.logit,
                logits: None,
                trace,
                wall_ms,
            })
        }
    }
}

/// A failover event, for reports.
#[derive(Clone, Debug)]
pub struct Failover {
    /// Chain that failed and the error.
    pub from_chain: usize,
    pub error: String,
    /// Chain taken over, and how many tokens it re-prefilled: every token so far, or those
    /// after the position its stations held from shipped checkpoints.
    pub to_chain: usize,
    pub reprefilled: usize,
}

/// Replica chains with failover; keeps the token history of one generation.
pub struct ReplicaSet {
    chains: Vec<MeshChain>,
    dead: Vec<bool>,
    active: usize,
    /// Tokens the active chain's session holds.
    synced: usize,
    /// The session id on every chain: a replica's stations hold the states the failed
    /// chain's nodes shipped under this name.
    session: String,
    /// Whether the active chain has not answered since a failover.
    resuming: bool,
    /// Failovers so far.
    pub failovers: Vec<Failover>,
}

impl ReplicaSet {
    /// Replicas in order of preference; `session` names the generation (each chain's session
    /// id is derived from it).
    pub fn new(chains: Vec<MeshChain>, session: &str) -> Result<ReplicaSet, MeshError> {
        if chains.is_empty() {
            return Err(MeshError::Config("no chains".into()));
        }
        if !wire::valid_session_id(session) || session.len() > 48 {
            return Err(MeshError::Config(format!(
                "session id {session:?} must be 1-48 chars of [A-Za-z0-9_.:-]"
            )));
        }
        let n = chains.len();
        Ok(ReplicaSet {
            chains,
            dead: vec![false; n],
            active: 0,
            synced: 0,
            session: session.into(),
            resuming: false,
            failovers: Vec::new(),
        })
    }

    /// From a chains file.
    pub fn from_file(
        f: &MeshFile,
        timeout: Duration,
        session: &str,
    ) -> Result<ReplicaSet, MeshError> {
        let chains = f
            .all_chains()
            .into_iter()
            .map(|c| MeshChain::new(c, timeout))
            .collect::<Result<Vec<_>, _>>()?;
        ReplicaSet::new(chains, session)
    }

    /// The chains.
    pub fn chains(&self) -> &[MeshChain] {
        &self.chains
    }

    /// Mutable chains (e.g. to set a grant).
    pub fn chains_mut(&mut self) -> &mut [MeshChain] {
        &mut self.chains
    }

    /// Index of the chain in use.
    pub fn active(&self) -> usize {
        self.active
    }

    /// Next-token step for the whole history `tokens` (prompt + generated so far): sends only
    /// what the active chain has not seen; on a node failure fails over and re-prefills.
    pub fn next(&mut self, tokens: &[u32], want_logits: bool) -> Result<StepOut, MeshError> {
        if tokens.is_empty() {
            return Err(MeshError::Config("no tokens".into()));
        }
        if self.synced >= tokens.len() {
            // Recompute the last position (e.g. a retry): rewind one.
            self.synced = tokens.len() - 1;
        }
        loop {
            let from = self.synced;
            let sid = &self.session;
            match self.chains[self.active].step(&tokens[from..], Some((sid, from)), want_logits) {
                Ok(out) => {
                    if std::mem::take(&mut self.resuming) {
                        if let Some(f) = self.failovers.last_mut() {
                            f.reprefilled = tokens.len() - from;
                        }
                    }
                    self.synced = tokens.len();
                    return Ok(out);
                }
                // The stations hold fewer positions than sent from (a fresh replica: 0; one
                // that took shipped checkpoints, or a hybrid gone back to its last
                // checkpoint: that position): re-send from there. Each retry starts earlier,
                // so this ends.
                Err(MeshError::Refused(r))
                    if r.status == 409
                        && r.code == "session_mismatch"
                        && r.held.is_some_and(|h| h < from) =>
                {
                    self.synced = r.held.unwrap_or(0);
                }
                Err(e) if e.is_node_failure() => {
                    self.dead[self.active] = true;
                    let Some(next) = (0..self.chains.len())
                        .map(|i| (self.active + 1 + i) % self.chains.len())
                        .find(|&i| !self.dead[i])
                    else {
                        return Err(if self.chains.len() == 1 {
                            e
                        } else {
                            MeshError::AllFailed(Box::new(e))
                        });
                    };
                    tracing::warn!(
                        "chain {} failed ({e}); retrying on chain {next} with {} tokens",
                        self.active,
                        tokens.len()
                    );
                    self.failovers.push(Failover {
                        from_chain: self.active,
                        error: e.to_string(),
                        to_chain: next,
                        reprefilled: tokens.len(),
                    });
                    self.active = next;
                    self.resuming = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Greedy generation of `n` tokens after `prompt`; `on_token` sees each as it comes.
    pub fn generate_greedy(
        &mut self,
        prompt: &[u32],
        n: usize,
        stop: &[u32],
        on_token: &mut dyn FnMut(usize, &StepOut),
    ) -> Result<Vec<u32>, MeshError> {
        let mut all = prompt.to_vec();
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            let s = self.next(&all, false)?;
            on_token(i, &s);
            all.push(s.token);
            out.push(s.token);
            if stop.contains(&s.token) {
                break;
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_parse() {
        let t = parse_trace("n0=0-8:12.5:0.010,n1=8-16:9.000:0.020,bad");
        assert_eq!(t.len(), 2);
        assert_eq!(t[1], ("n1".to_string(), "8-16".to_string(), 9.0, 0.02));
    }

    #[test]
    fn a_dead_single_chain_names_the_node_and_range_quickly() {
        // A port nobody listens on.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        drop(l);
        let c = MeshChain::new(
            vec![MeshHop {
                node_id: "n0".into(),
                url,
                layers: "0-24".into(),
            }],
            Duration::from_secs(2),
        )
        .unwrap();
        let mut rs = ReplicaSet::new(vec![c], "s1").unwrap();
        let t = Instant::now();
        let e = rs.next(&[1, 2, 3], false).unwrap_err().to_string();
        assert!(e.contains("node n0 (layers 0-24)"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
