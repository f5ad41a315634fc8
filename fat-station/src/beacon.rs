//! Discovery: stations announce themselves in UDP datagrams; a listener collects them and an
//! ephemeral elector forms chains from what it heard.
//!
//! A beacon is one JSON datagram (at most [`MAX_DATAGRAM`] bytes), sent every interval to a
//! target address: the LAN broadcast (`255.255.255.255:7979`), loopback broadcast
//! (`127.255.255.255:7979`, simulated nodes on one host) or any unicast/multicast address.
//! Contract: `specs/mesh.md`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use knot_format::LayerRange;
use serde::{Deserialize, Serialize};

use crate::replicas::{ChainHop, ChainsFile};

/// Default beacon port.
pub const DEFAULT_PORT: u16 = 7979;
/// Largest datagram read or sent.
pub const MAX_DATAGRAM: usize = 2048;

/// What a station says about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Announcement {
    /// Always `aeon-mesh/1`.
    pub proto: String,
    pub node_id: String,
    pub model_id: String,
    /// Header hash of the whole model.
    pub model_hash: String,
    /// `entry`, `mid`, `exit` or `full`.
    pub role: String,
    /// `a-b` served.
    pub layers: String,
    /// Layers of the whole model.
    pub n_layers: u32,
    /// `http://host:port` to reach the station.
    pub address: String,
    /// Replica chain the node was planned into, when it was.
    #[serde(default)]
    pub chain: Option<u32>,
    /// `open` or `sealed`.
    pub mesh: String,
}

/// Protocol tag of a beacon.
pub const PROTO: &str = "aeon-mesh/1";

/// Sends `ann` to `target` every `interval` until the returned handle is dropped.
pub struct Beacon {
    stop: Arc<AtomicBool>,
}

impl Drop for Beacon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl Beacon {
    /// Starts announcing on a background thread.
    pub fn spawn(
        ann: &Announcement,
        target: SocketAddr,
        interval: Duration,
    ) -> std::io::Result<Beacon> {
        let bind: SocketAddr = if target.is_ipv4() {
            "0.0.0.0:0".parse()
        } else {
            "[::]:0".parse()
        }
        .map_err(std::io::Error::other)?;
        let sock = UdpSocket::bind(bind)?;
        sock.set_broadcast(true)?;
        let msg = serde_json::to_vec(ann).map_err(std::io::Error::other)?;
        if msg.len() > MAX_DATAGRAM {
            return Err(std::io::Error::other(format!(
                "announcement of {} bytes exceeds {MAX_DATAGRAM}",
                msg.len()
            )));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        std::thread::Builder::new()
            .name("beacon".into())
            .spawn(move || {
                while !s2.load(Ordering::Relaxed) {
                    if let Err(e) = sock.send_to(&msg, target) {
                        tracing::debug!("beacon to {target}: {e}");
                    }
                    std::thread::sleep(interval);
                }
            })?;
        Ok(Beacon { stop })
    }
}

/// Listens on `bind` for `timeout`; returns the latest announcement of each node, by node id.
pub fn discover(bind: SocketAddr, timeout: Duration) -> std::io::Result<Vec<Announcement>> {
    let sock = UdpSocket::bind(bind)?;
    let deadline = Instant::now() + timeout;
    let mut seen = BTreeMap::new();
    let mut buf = [0u8; MAX_DATAGRAM];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match sock.recv_from(&mut buf) {
            Ok((n, from)) => match serde_json::from_slice::<Announcement>(&buf[..n]) {
                Ok(a) if a.proto == PROTO => {
                    seen.insert(a.node_id.clone(), a);
                }
                Ok(_) => tracing::debug!("beacon from {from}: unknown protocol"),
                Err(e) => tracing::debug!("beacon from {from}: {e}"),
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(e) => return Err(e),
        }
    }
    Ok(seen.into_values().collect())
}

/// Why announcements could not be formed into a chain.
#[derive(Debug, thiserror::Error)]
pub enum FormError {
    #[error("no station announced itself")]
    Nobody,
    #[error("stations serve {0} different models; pick one with --model HASH")]
    ManyModels(usize),
    #[error("no station of model {0}")]
    NoSuchModel(String),
    #[error("the announced ranges do not tile 0-{n_layers}: {why}")]
    Gap { n_layers: u32, why: String },
}

/// The ephemeral elector: validates that announced ranges tile the model and groups the
/// stations into as many disjoint chains (replicas) as they allow. Stations that announced a
/// `chain` are kept in it; the rest are assigned greedily (lowest node id first).
pub fn form(anns: &[Announcement], model_hash: Option<&str>) -> Result<ChainsFile, FormError> {
    if anns.is_empty() {
        return Err(FormError::Nobody);
    }
    let mut models: BTreeMap<&str, Vec<&Announcement>> = BTreeMap::new();
    for a in anns {
        models.entry(a.model_hash.as_str()).or_default().push(a);
    }
    let nodes = match model_hash {
        Some(h) => models
            .get(h)
            .cloned()
            .ok_or_else(|| FormError::NoSuchModel(h.into()))?,
        None if models.len() == 1 => models.into_values().next().unwrap_or_default(),
        None => return Err(FormError::ManyModels(models.len())),
    };
    let n_layers = nodes[0].n_layers;
    let mut pool: Vec<(&Announcement, LayerRange)> = nodes
        .iter()
        .filter_map(|a| {
            LayerRange::parse(&a.layers)
                .filter(|r| !r.is_empty())
                .map(|r| (*a, r))
        })
        .collect();
    pool.sort_by(|a, b| {
        (a.0.chain, a.1.start, &a.0.node_id).cmp(&(b.0.chain, b.1.start, &b.0.node_id))
    });
    let mut chains = Vec::new();
    loop {
        // Build one chain: from layer 0, take the next unused node starting where we are,
        // preferring the chain label of the chain's first node.
        let mut hops: Vec<usize> = Vec::new();
        let mut at = 0u32;
        let mut label = None;
        while at < n_layers {
            let pick = pool
                .iter()
                .enumerate()
                .filter(|(_, (_, r))| r.start == at && r.end <= n_layers)
                .min_by_key(|(_, (a, _))| {
                    (
                        !hops.is_empty() && a.chain != label,
                        a.chain,
                        a.node_id.clone(),
                    )
                })
                .map(|(i, _)| i);
            match pick {
                Some(i) => {
                    if hops.is_empty() {
                        label = pool[i].0.chain;
                    }
                    at = pool[i].1.end;
                    hops.push(i);
                }
                None => break,
            }
        }
        if at != n_layers || hops.is_empty() {
            if chains.is_empty() {
                let covered: Vec<String> = pool
                    .iter()
                    .map(|(a, r)| format!("{}={}-{}", a.node_id, r.start, r.end))
                    .collect();
                return Err(FormError::Gap {
                    n_layers,
                    why: format!(
                        "nothing starts at layer {at} (heard: {})",
                        covered.join(", ")
                    ),
                });
            }
            break;
        }
        let chain: Vec<ChainHop> = hops
            .iter()
            .map(|&i| ChainHop {
                node_id: pool[i].0.node_id.clone(),
                url: pool[i].0.address.clone(),
                layers: pool[i].0.layers.clone(),
            })
            .collect();
        let mut hops = hops;
        hops.sort_unstable_by(|a, b| b.cmp(a));
        for i in hops {
            pool.remove(i);
        }
        chains.push(chain);
    }
    Ok(ChainsFile {
        model: Some(nodes[0].model_id.clone()),
        model_hash: Some(nodes[0].model_hash.clone()),
        n_layers: Some(n_layers),
        stations: chains[0].clone(),
        chains,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(id: &str, layers: &str, chain: Option<u32>) -> Announcement {
        Announcement {
            proto: PROTO.into(),
            node_id: id.into(),
            model_id: "m".into(),
            model_hash: "h".into(),
            role: "mid".into(),
            layers: layers.into(),
            n_layers: 24,
            address: format!("http://{id}"),
            chain,
            mesh: "open".into(),
        }
    }

    #[test]
    fn forms_replica_chains_and_names_gaps() {
        let a = [
            ann("b0", "0-8", None),
            ann("b1", "8-16", None),
            ann("b2", "16-24", None),
            ann("a0", "0-12", None),
            ann("a1", "12-24", None),
            ann("x", "3-5", None),
        ];
        let f = form(&a, None).unwrap();
        assert_eq!(f.chains.len(), 2);
        let ids: Vec<Vec<&str>> = f
            .chains
            .iter()
            .map(|c| c.iter().map(|h| h.node_id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a0", "a1"], vec!["b0", "b1", "b2"]]);
        // Chain labels are honoured.
        let l = [
            ann("p", "0-8", Some(1)),
            ann("q", "0-8", Some(0)),
            ann("r", "8-24", Some(0)),
            ann("s", "8-24", Some(1)),
        ];
        let f = form(&l, None).unwrap();
        let ids: Vec<Vec<&str>> = f
            .chains
            .iter()
            .map(|c| c.iter().map(|h| h.node_id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["q", "r"], vec!["p", "s"]]);
        let e = form(&[ann("a", "0-8", None), ann("c", "16-24", None)], None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("nothing starts at layer 8"), "{e}");
        assert!(matches!(form(&[], None), Err(FormError::Nobody)));
    }

    #[test]
    fn beacons_are_heard_over_loopback() {
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let _b1 =
            Beacon::spawn(&ann("n1", "0-12", None), target, Duration::from_millis(50)).unwrap();
        let _b2 =
            Beacon::spawn(&ann("n2", "12-24", None), target, Duration::from_millis(50)).unwrap();
        let heard = discover(target, Duration::from_millis(600)).unwrap();
        let ids: Vec<&str> = heard.iter().map(|a| a.node_id.as_str()).collect();
        assert_eq!(ids, vec!["n1", "n2"]);
    }
}
