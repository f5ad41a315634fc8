//! A station's place in a mesh: its name, successor, mesh key, grant verifier, the next hops
//! it may forward to and the client it forwards with. [`crate::station`] holds one;
//! [`crate::mesh::relay`] runs `POST /chain` with it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::mesh::grant::GrantVerifier;
use crate::mesh::manifest::Successor;
use crate::mesh::seal::{self, MeshKey, ReplayWindow};

/// Default time a hop may take (connect + compute of everything downstream) before the
/// caller gives up with a 502.
pub const DEFAULT_HOP_TIMEOUT: Duration = Duration::from_secs(60);
/// Default replay window either side of this station's clock.
pub const DEFAULT_REPLAY_WINDOW: Duration = Duration::from_secs(30);
/// Most hops a node has in flight at once; a step waits for one up to the hop timeout, then
/// gets 503 `hops_busy`.
pub const DEFAULT_MAX_HOPS: usize = 64;

/// A station's place in a mesh.
pub struct MeshNode {
    /// Names this node in traces and errors.
    pub node_id: String,
    /// Where to forward without an `X-Route`.
    pub successor: Option<Successor>,
    /// Seal requests, residuals and answers; refuse unsealed ones.
    pub key: Option<MeshKey>,
    /// Refuse entry requests without a valid grant.
    pub grant: Option<GrantVerifier>,
    /// Nonces accepted recently.
    pub replay: ReplayWindow,
    /// Next hops an `X-Route` may name besides the successor (`--route-to`), without a
    /// trailing `/`.
    pub(crate) routes: Vec<String>,
    /// Keep-alive client to the next hops (no redirects).
    pub(crate) agent: ureq::Agent,
    /// One permit per hop in flight.
    pub(crate) hops: Arc<Semaphore>,
    pub(crate) hop_timeout: Duration,
    counter: AtomicU64,
    /// Where this node's session states go (`--checkpoint-to`), when anywhere.
    pub(crate) ship: Option<crate::mesh::ship::Shipper>,
}

impl MeshNode {
    /// A mesh node; `hop_timeout` bounds each forward.
    pub fn new(
        node_id: String,
        successor: Option<Successor>,
        key: Option<MeshKey>,
        grant: Option<GrantVerifier>,
        hop_timeout: Duration,
        replay_window: Duration,
    ) -> MeshNode {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5).min(hop_timeout))
            .timeout(hop_timeout)
            .redirects(0)
            .build();
        MeshNode {
            node_id,
            successor,
            key,
            grant,
            replay: ReplayWindow::new(replay_window),
            routes: Vec::new(),
            agent,
            hops: Arc::new(Semaphore::new(DEFAULT_MAX_HOPS)),
            hop_timeout,
            counter: AtomicU64::new(0),
            ship: None,
        }
    }

    /// Also allows `X-Route` to name these next hops (base URLs).
    pub fn with_routes(mut self, routes: Vec<String>) -> MeshNode {
        self.routes = routes
            .into_iter()
            .map(|r| r.trim().trim_end_matches('/').to_string())
            .collect();
        self
    }

    /// Ships this node's session states to `replicas` (base URLs holding the same layers;
    /// [`crate::mesh::ship`]) at the end of multi-row forwards and every `every` positions.
    pub fn with_replicas(
        mut self,
        replicas: Vec<String>,
        every: usize,
    ) -> std::io::Result<MeshNode> {
        if !replicas.is_empty() {
            self.ship = Some(crate::mesh::ship::Shipper::start(
                replicas,
                every,
                self.key.clone(),
                self.hop_timeout,
            )?);
        }
        Ok(self)
    }

    /// `open` or `sealed`, as `/health` reports it.
    pub fn mode(&self) -> &'static str {
        if self.key.is_some() {
            "sealed"
        } else {
            "open"
        }
    }

    pub(crate) fn request_id(&self) -> String {
        format!(
            "{:x}-{:x}-{}",
            seal::now_ms(),
            self.counter.fetch_add(1, Ordering::Relaxed),
            std::process::id()
        )
    }
}
