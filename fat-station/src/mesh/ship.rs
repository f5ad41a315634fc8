//! Checkpoint shipping (issue 35): a node pushes its sessions' state to the replicas of its
//! layer range, so that a replica chain taking over after a node loss starts from the last
//! shipped position instead of replaying the conversation from 0.
//!
//! Sender ([`Shipper`], `--checkpoint-to URL`): after a `/chain` step that ends a multi-row
//! forward (a prompt, a chat turn) or crosses a multiple of `--checkpoint-every`, the node
//! exports the session ([`crate::engine::Session::export_state`]: every recurrent block's
//! live state, the attention blocks' keys and values from the position the replicas last
//! confirmed) and a background thread posts it to each replica's `POST /checkpoint`, sealed
//! with the mesh key like the chain's residuals. The step's answer never waits for it; at
//! most [`QUEUE`] states wait to go out, and a state that finds the queue full is dropped (the
//! next one carries everything again).
//!
//! Receiver ([`receive`]): the body must open under the mesh key with the session, position
//! and layer boundary its headers name, come from the same model (hash) and cover exactly the
//! layers this node holds; its length must be exactly what this node's own config gives for
//! those positions (`--max-body` and `--max-positions` bound it before that). Then the
//! session of that name holds the state; a client that sends that session's next step
//! (`X-Pos` beyond it) learns the position from `409 session_mismatch` `"held"` and replays
//! only the tokens after it.

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, StatusCode};

use crate::engine::{Session, StateError};
use crate::mesh::relay::unseal;
use crate::mesh::seal::{self, MeshKey, SealContext, SealDir};
use crate::station::server::{
    compute, header, json, mismatch, read_body, refuse, session_of, with_session, Refusal, Resp,
    Station,
};
use crate::wire;

/// States waiting to go out, at most.
pub const QUEUE: usize = 4;
/// Sessions whose confirmed position the sender remembers, at most (then it forgets them all:
/// the next state of each ships its keys and values from 0).
const MAX_TRACKED: usize = 4096;
/// What the seal binds as the answer kind of a checkpoint.
const RET: &str = "state";

/// One state to ship.
pub(crate) struct Job {
    session: String,
    pos: usize,
    /// The first position of the keys and values the record carries.
    from: usize,
    /// [`wire::encode_checkpoint`]'s body, unsealed.
    body: Vec<u8>,
    /// The sender's first layer (bound by the seal).
    first_layer: u32,
}

/// The sending side: the replicas, the queue and what they confirmed.
pub struct Shipper {
    urls: Vec<String>,
    every: usize,
    tx: SyncSender<Job>,
    /// Session -> the position every replica confirmed holding (keys and values ship from
    /// there).
    acked: Arc<Mutex<HashMap<String, usize>>>,
}

impl Shipper {
    /// Starts the thread that posts states to `urls` (base URLs of the replicas of this
    /// node's layer range), sealed with `key` when the mesh has one; `every` is the period
    /// in positions (`--checkpoint-every`; 0: at the end of multi-row forwards only).
    pub fn start(
        urls: Vec<String>,
        every: usize,
        key: Option<MeshKey>,
        timeout: Duration,
    ) -> std::io::Result<Shipper> {
        let urls: Vec<String> = urls
            .into_iter()
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .collect();
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let acked = Arc::new(Mutex::new(HashMap::new()));
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5).min(timeout))
            .timeout(timeout)
            .redirects(0)
            .build();
        let (to, seen) = (urls.clone(), Arc::clone(&acked));
        std::thread::Builder::new()
            .name("checkpoint-ship".into())
            .spawn(move || {
                for job in rx {
                    let got: Vec<Option<usize>> = to
                        .iter()
                        .map(|u| post(&agent, key.as_ref(), u, &job))
                        .collect();
                    if let Ok(mut m) = seen.lock() {
                        let before = m.get(&job.session).copied().unwrap_or(0);
                        let now = got.iter().map(|g| g.unwrap_or(before)).min();
                        if m.len() >= MAX_TRACKED {
                            m.clear();
                        }
                        m.insert(job.session.clone(), now.unwrap_or(before));
                    }
                }
            })?;
        Ok(Shipper {
            urls,
            every,
            tx,
            acked,
        })
    }

    /// The replicas' base URLs.
    pub fn urls(&self) -> &[String] {
        &self.urls
    }

    /// Whether a forward of `rows` rows at `start` calls for a checkpoint.
    pub(crate) fn due(&self, start: usize, rows: usize) -> bool {
        let end = start + rows;
        rows > 1 || (self.every > 0 && end / self.every > start / self.every)
    }

    /// The state of `s` to ship for `session` (keys and values from what the replicas
    /// confirmed), or `None` when the model's state cannot travel (logged).
    pub(crate) fn export(&self, st: &Station, session: &str, s: &Session) -> Option<Job> {
        let from = self
            .acked
            .lock()
            .ok()
            .and_then(|m| m.get(session).copied())
            .unwrap_or(0);
        let rec = match s.export_state(&st.model().cfg, from) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("checkpoint not shipped: {e}");
                return None;
            }
        };
        let kv = st.model().cfg.kv_dim();
        let first = s.first_layer();
        Some(Job {
            session: session.to_string(),
            pos: s.positions(first, kv).unwrap_or(0),
            from: from.min(s.positions(first, kv).unwrap_or(0)),
            body: wire::encode_checkpoint(&model_hash(st), &rec),
            first_layer: first as u32,
        })
    }

    /// Hands `job` to the thread; dropped (logged) when [`QUEUE`] states already wait.
    pub(crate) fn queue(&self, job: Job) {
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(j)) => tracing::warn!(
                session = %j.session,
                pos = j.pos,
                "checkpoint dropped: {QUEUE} states already wait to go to the replicas"
            ),
            Err(TrySendError::Disconnected(_)) => {
                tracing::warn!("checkpoint dropped: the shipping thread is gone")
            }
        }
    }
}

/// The whole model's hash (a shard's parent), as `/health` reports it.
fn model_hash(st: &Station) -> String {
    let knot = st.model().knot();
    knot.shard()
        .map_or(knot.model_hash(), |s| s.parent_hash.as_str())
        .to_string()
}

/// Posts one state to one replica; returns the position it holds afterwards when it says
/// (the state's on success, its `held` on a `409`), `None` when it failed otherwise.
fn post(agent: &ureq::Agent, key: Option<&MeshKey>, url: &str, job: &Job) -> Option<usize> {
    let rid = seal::random_request_id();
    let mut req = agent
        .post(&format!("{url}{}", wire::ROUTE_CHECKPOINT))
        .set("content-type", "application/octet-stream")
        .set(wire::H_SESSION, &job.session)
        .set(wire::H_POS, &job.pos.to_string())
        .set(wire::H_REQUEST_ID, &rid);
    let body = match key {
        Some(k) => {
            let ts = seal::now_ms();
            let ctx = SealContext {
                dir: SealDir::Checkpoint,
                request_id: &rid,
                from_layer: job.first_layer,
                session: &job.session,
                pos: job.pos,
                ts_ms: ts,
                route: "",
                ret: RET,
            };
            req = req
                .set(wire::H_SEAL, "v1")
                .set(wire::H_SEAL_TS, &ts.to_string());
            k.seal(&job.body, &ctx)
        }
        None => job.body.clone(),
    };
    match req.send_bytes(&body) {
        Ok(_) => {
            tracing::debug!(
                session = %job.session,
                pos = job.pos,
                from = job.from,
                bytes = body.len(),
                "checkpoint shipped to {url}"
            );
            Some(job.pos)
        }
        Err(ureq::Error::Status(409, r)) => {
            let text = r.into_string().unwrap_or_default();
            let held = wire::Refusal::from_body(url.to_string(), 409, text).held;
            tracing::debug!(session = %job.session, "replica {url} holds {held:?}; next state ships from there");
            held
        }
        Err(e) => {
            tracing::warn!(session = %job.session, "checkpoint to {url} failed: {e}");
            None
        }
    }
}

/// `POST /checkpoint`: takes a peer's session state (see the module doc).
pub(crate) async fn receive(st: Arc<Station>, req: Request<Incoming>) -> Result<Resp, Refusal> {
    let node = st.mesh_node();
    if node.key.is_none() && node.grant.is_some() {
        return Err(refuse(
            StatusCode::UNAUTHORIZED,
            "grant_required",
            "this station requires grants but has no mesh key: it takes no unsealed state",
        ));
    }
    let session = header(&req, wire::H_SESSION)?.ok_or_else(|| {
        refuse(
            StatusCode::BAD_REQUEST,
            "bad_session",
            "POST /checkpoint needs X-Session",
        )
    })?;
    let pos_h = header(&req, wire::H_POS)?.ok_or_else(|| {
        refuse(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "POST /checkpoint needs X-Pos",
        )
    })?;
    let rid = header(&req, wire::H_REQUEST_ID)?.unwrap_or_default();
    let seal_h = header(&req, wire::H_SEAL)?;
    let ts_h = header(&req, wire::H_SEAL_TS)?;
    let (slot, pos) = session_of(&st, Some(&session), Some(&pos_h))?;
    let pos = pos.unwrap_or(0);
    let body = read_body(&st, req).await?;
    let first = st.model().holdings().layers.start;
    let ctx = SealContext {
        dir: SealDir::Checkpoint,
        request_id: &rid,
        from_layer: first,
        session: &session,
        pos,
        ts_ms: 0,
        route: "",
        ret: RET,
    };
    let (plain, _) = unseal(node, &body, seal_h.as_deref(), ts_h.as_deref(), ctx)?;
    let bad = |why: String| refuse(StatusCode::BAD_REQUEST, "bad_checkpoint", why);
    let (hash, _) = wire::decode_checkpoint(&plain).map_err(bad)?;
    let mine = model_hash(&st);
    if hash != mine {
        return Err(refuse(
            StatusCode::CONFLICT,
            "model_mismatch",
            format!("the state is of model {hash}; this station serves {mine}"),
        ));
    }
    if crate::engine::state_record_position(wire::decode_checkpoint(&plain).map_err(bad)?.1)
        != Some(pos)
    {
        return Err(bad(format!("the record's position is not X-Pos {pos}")));
    }
    compute(st, move |st| {
        let (_, rec) = wire::decode_checkpoint(&plain).map_err(bad)?;
        let took = with_session(st, slot, None, first as usize, |m, s| {
            Ok(s.import_state(&m.cfg, rec))
        })?;
        match took {
            Ok(held) => {
                st.metrics
                    .checkpoints_in
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(session = %session, held, "took a shipped state");
                Ok(json(StatusCode::OK, &serde_json::json!({ "held": held })))
            }
            Err(StateError::Gap { from, held }) => Err(mismatch(
                held,
                format!("the state's keys and values start at {from}; this session holds {held}"),
            )),
            Err(e @ StateError::Unsupported(_)) => Err(refuse(
                StatusCode::NOT_IMPLEMENTED,
                "unsupported",
                e.to_string(),
            )),
            Err(e) => Err(bad(e.to_string())),
        }
    })
    .await
}
