//! Discovery: stations announce themselves in UDP datagrams; a listener collects them and an
//! ephemeral elector forms chains from what it heard.
//!
//! A beacon is one JSON datagram (at most [`MAX_DATAGRAM`] bytes), sent every interval to a
//! target address: the LAN broadcast (`255.255.255.255:7979`), loopback broadcast
//! (`127.255.255.255:7979`, simulated nodes on one host) or any unicast/multicast address.
//!
//! The elector works in one of two ways: [`form`] takes the ranges the stations announce
//! (shards, manifests) and only validates and orders them; [`assign`] gives each node a
//! contiguous range of its own, proportional to the RAM budget it announced (`ram_bytes`),
//! within what it holds. Either way it writes a chains file (and, for [`assign`], node
//! manifests) and exits: nothing of it is in the data path. Contract: `specs/mesh.md`.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use knot_format::LayerRange;
use serde::{Deserialize, Serialize};

use crate::manifest::{NodeManifest, Successor};
use crate::mesh_file::{MeshFile, MeshHop};
use knot_format::Role;

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

/// One node as the elector hears it: the announcement and, when the station gave one, its RAM
/// budget. On the wire `ram_bytes` is one more optional key of the same JSON object, so a
/// beacon without it (an older station) still parses, and an older listener ignores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Heard {
    #[serde(flatten)]
    pub ann: Announcement,
    /// RAM budget in bytes (the station's `--ram` or `AEON_NODE_RAM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_bytes: Option<u64>,
}

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
    /// Starts announcing `ann` with its RAM budget on a background thread.
    pub fn spawn(ann: &Heard, target: SocketAddr, interval: Duration) -> std::io::Result<Beacon> {
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
    Ok(hear(bind, timeout)?.into_iter().map(|h| h.ann).collect())
}

/// Like [`discover`], keeping each node's RAM budget.
pub fn hear(bind: SocketAddr, timeout: Duration) -> std::io::Result<Vec<Heard>> {
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
            Ok((n, from)) => match serde_json::from_slice::<Heard>(&buf[..n]) {
                Ok(a) if a.ann.proto == PROTO => {
                    seen.insert(a.ann.node_id.clone(), a);
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
    #[error("cannot assign ranges: {0}")]
    Assign(String),
}

/// The announcements of one model: the one asked for, or the only one heard.
fn one_model<'a, T>(
    items: &'a [T],
    hash_of: impl Fn(&T) -> &str,
    model_hash: Option<&str>,
) -> Result<Vec<&'a T>, FormError> {
    if items.is_empty() {
        return Err(FormError::Nobody);
    }
    let mut models: BTreeMap<&str, Vec<&T>> = BTreeMap::new();
    for a in items {
        models.entry(hash_of(a)).or_default().push(a);
    }
    match model_hash {
        Some(h) => models
            .remove(h)
            .ok_or_else(|| FormError::NoSuchModel(h.into())),
        None if models.len() == 1 => Ok(models.into_values().next().unwrap_or_default()),
        None => Err(FormError::ManyModels(models.len())),
    }
}

/// The ephemeral elector: validates that announced ranges tile the model and groups the
/// stations into as many disjoint chains (replicas) as they allow. Stations that announced a
/// `chain` are kept in it; the rest are assigned greedily (lowest node id first).
pub fn form(anns: &[Announcement], model_hash: Option<&str>) -> Result<MeshFile, FormError> {
    let nodes = one_model(anns, |a| a.model_hash.as_str(), model_hash)?;
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
        let chain: Vec<MeshHop> = hops
            .iter()
            .map(|&i| MeshHop {
                node_id: pool[i].0.node_id.clone(),
                url: pool[i].0.address.clone(),
                layers: pool[i].0.layers.clone(),
            })
            .collect();
        hops.sort_unstable_by(|a, b| b.cmp(a));
        for i in hops {
            pool.remove(i);
        }
        chains.push(chain);
    }
    Ok(MeshFile {
        model: Some(nodes[0].model_id.clone()),
        model_hash: Some(nodes[0].model_hash.clone()),
        n_layers: Some(n_layers),
        stations: chains[0].clone(),
        chains,
    })
}

/// What the elector is asked to assign.
#[derive(Clone, Debug, Default)]
pub struct AssignRequest {
    /// Only nodes of this model hash (needed when several models announce).
    pub model_hash: Option<String>,
    /// Independent chains (replicas) to spread the nodes over; 0 counts as 1.
    pub replicas: u32,
    /// RAM budget assumed for a node that announced none. Default: the smallest budget
    /// announced; equal shares when no node announced one.
    pub default_ram: Option<u64>,
}

/// One node's place in an assigned mesh.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Assigned {
    pub node_id: String,
    /// `http://host:port`, as announced.
    pub address: String,
    /// Replica chain.
    pub chain: u32,
    /// The range it is to run.
    pub layers: LayerRange,
    /// What the range makes it: `entry` (embeds), `mid`, `exit` (runs the head) or `full`.
    pub role: Role,
    /// The range it announced holding (the assigned range lies within it).
    pub held: LayerRange,
    /// RAM budget the split used, bytes.
    pub ram_bytes: u64,
    /// Whether that budget was announced (else assumed, see [`AssignRequest::default_ram`]).
    pub ram_announced: bool,
}

/// What [`assign`] decided: every chain's nodes in layer order.
#[derive(Clone, Debug, Serialize)]
pub struct Assignment {
    pub model_id: String,
    pub model_hash: String,
    pub n_layers: u32,
    pub chains: Vec<Vec<Assigned>>,
}

impl Assignment {
    /// The chains file (`moonshine --mesh`, `moonshine mesh generate --mesh`): each hop with
    /// its assigned range.
    pub fn chains_file(&self) -> MeshFile {
        let chains: Vec<Vec<MeshHop>> = self
            .chains
            .iter()
            .map(|c| {
                c.iter()
                    .map(|a| MeshHop {
                        node_id: a.node_id.clone(),
                        url: a.address.clone(),
                        layers: dash(a.layers),
                    })
                    .collect()
            })
            .collect();
        MeshFile {
            model: Some(self.model_id.clone()),
            model_hash: Some(self.model_hash.clone()),
            n_layers: Some(self.n_layers),
            stations: chains.first().cloned().unwrap_or_default(),
            chains,
        }
    }

    /// One manifest per node (`fat-station --manifest`): its assigned role and range, its
    /// successor in the chain, `listen` from its announced address. `shard` names the file the
    /// node serves from (`{node_id}` is replaced by the node's id), relative to the manifest.
    pub fn manifests(&self, shard: &str) -> Vec<NodeManifest> {
        let mut out = Vec::new();
        for c in &self.chains {
            for (i, a) in c.iter().enumerate() {
                out.push(NodeManifest {
                    node_id: a.node_id.clone(),
                    model_id: self.model_id.clone(),
                    model_hash: self.model_hash.clone(),
                    role: a.role,
                    layers: dash(a.layers),
                    successor: c.get(i + 1).map(|nx| Successor {
                        node_id: nx.node_id.clone(),
                        url: nx.address.clone(),
                        layers: dash(nx.layers),
                    }),
                    listen: a
                        .address
                        .trim_start_matches("http://")
                        .trim_end_matches('/')
                        .to_string(),
                    shard: shard.replace("{node_id}", &a.node_id),
                    chain: a.chain,
                });
            }
        }
        out
    }
}

fn dash(r: LayerRange) -> String {
    format!("{}-{}", r.start, r.end)
}

/// A node the elector may place.
struct Candidate<'a> {
    heard: &'a Heard,
    held: LayerRange,
    embed: bool,
    head: bool,
    ram: u64,
}

/// The ephemeral elector assigning ranges: spreads the nodes of one model over
/// `req.replicas` chains and gives each node of a chain a contiguous range proportional to
/// its RAM budget, within what it holds (a full-model station can run any range; a shard
/// station only a part of its own). The first node of a chain must hold the embedding and
/// layer 0, the last the head and the last layer. Announced `chain` labels are not kept: the
/// elector decides the chains.
///
/// Nodes are ordered by (held start, embedding first, head last, node id) and dealt to the
/// chains round-robin; when every node holds the whole model, they are dealt to balance the
/// chains' RAM instead (largest first, to the chain with the least), each chain in node-id
/// order. A chain's boundaries start at the RAM-proportional ideal
/// (`round(n_layers * cumulative RAM / chain RAM)`), each moved the least needed to keep
/// every range non-empty and inside its node's holdings; when no boundary can, the error
/// names the two nodes.
pub fn assign(heard: &[Heard], req: &AssignRequest) -> Result<Assignment, FormError> {
    let nodes = one_model(
        heard,
        |h| h.ann.model_hash.as_str(),
        req.model_hash.as_deref(),
    )?;
    let n_layers = nodes[0].ann.n_layers;
    let bad = |why: String| FormError::Assign(why);
    if n_layers == 0 {
        return Err(bad("the model announces 0 layers".into()));
    }
    let smallest = nodes
        .iter()
        .filter_map(|h| h.ram_bytes)
        .filter(|&b| b > 0)
        .min();
    let fallback = req.default_ram.or(smallest).unwrap_or(1).max(1);
    let mut cands = Vec::with_capacity(nodes.len());
    for &h in &nodes {
        let a = &h.ann;
        if a.n_layers != n_layers {
            return Err(bad(format!(
                "node {} announces {} layers, node {} {n_layers}",
                a.node_id, a.n_layers, nodes[0].ann.node_id
            )));
        }
        let held = LayerRange::parse(&a.layers)
            .filter(|r| !r.is_empty() && r.end <= n_layers)
            .ok_or_else(|| {
                bad(format!(
                    "node {} announces layers {:?}, not a range within 0-{n_layers}",
                    a.node_id, a.layers
                ))
            })?;
        cands.push(Candidate {
            heard: h,
            held,
            embed: a.role == "entry" || a.role == "full",
            head: a.role == "exit" || a.role == "full",
            ram: h.ram_bytes.filter(|&b| b > 0).unwrap_or(fallback),
        });
    }
    let replicas = req.replicas.max(1) as usize;
    if cands.len() < replicas {
        return Err(bad(format!(
            "{} node(s) cannot make {replicas} chains",
            cands.len()
        )));
    }
    cands.sort_by(|x, y| {
        (x.held.start, !x.embed, x.head, &x.heard.ann.node_id).cmp(&(
            y.held.start,
            !y.embed,
            y.head,
            &y.heard.ann.node_id,
        ))
    });
    let mut groups: Vec<Vec<&Candidate>> = vec![Vec::new(); replicas];
    if cands
        .iter()
        .all(|c| c.embed && c.head && c.held.len() == n_layers)
    {
        // Full-model nodes can go anywhere: balance the chains' RAM (largest node first, to
        // the chain with the least so far), then order each chain by node id.
        let mut by_ram: Vec<&Candidate> = cands.iter().collect();
        by_ram.sort_by(|x, y| {
            y.ram
                .cmp(&x.ram)
                .then(x.heard.ann.node_id.cmp(&y.heard.ann.node_id))
        });
        let mut total = vec![0u128; replicas];
        for c in by_ram {
            let to = (0..replicas)
                .min_by_key(|&i| (total[i], groups[i].len(), i))
                .unwrap_or(0);
            total[to] += c.ram as u128;
            groups[to].push(c);
        }
        for g in &mut groups {
            g.sort_by(|x, y| x.heard.ann.node_id.cmp(&y.heard.ann.node_id));
        }
    } else {
        for (i, c) in cands.iter().enumerate() {
            groups[i % replicas].push(c);
        }
    }
    let mut chains = Vec::with_capacity(replicas);
    for (ci, g) in groups.iter().enumerate() {
        let ranges = split_chain(g, n_layers).map_err(|why| bad(format!("chain {ci}: {why}")))?;
        let k = g.len();
        chains.push(
            g.iter()
                .zip(ranges)
                .enumerate()
                .map(|(i, (c, layers))| Assigned {
                    node_id: c.heard.ann.node_id.clone(),
                    address: c.heard.ann.address.clone(),
                    chain: ci as u32,
                    layers,
                    role: match (i == 0, i + 1 == k) {
                        (true, true) => Role::Full,
                        (true, false) => Role::Entry,
                        (false, true) => Role::Exit,
                        (false, false) => Role::Mid,
                    },
                    held: c.held,
                    ram_bytes: c.ram,
                    ram_announced: c.heard.ram_bytes.is_some_and(|b| b > 0),
                })
                .collect(),
        );
    }
    Ok(Assignment {
        model_id: nodes[0].ann.model_id.clone(),
        model_hash: nodes[0].ann.model_hash.clone(),
        n_layers,
        chains,
    })
}

/// Contiguous ranges tiling `0..n` over the chain's nodes in order (see [`assign`]).
fn split_chain(c: &[&Candidate], n: u32) -> Result<Vec<LayerRange>, String> {
    let k = c.len();
    let id = |i: usize| &c[i].heard.ann.node_id;
    let holds = |i: usize| {
        format!(
            "node {} (holds {}, {})",
            id(i),
            dash(c[i].held),
            c[i].heard.ann.role
        )
    };
    if k as u64 > n as u64 {
        return Err(format!(
            "{k} nodes for {n} layers: a node needs at least one layer (ask for more replicas)"
        ));
    }
    if c[0].held.start != 0 || !c[0].embed {
        return Err(format!(
            "its first node must hold the embedding and layer 0, but the first is {}",
            holds(0)
        ));
    }
    if c[k - 1].held.end != n || !c[k - 1].head {
        return Err(format!(
            "its last node must hold layer {} and the head, but the last is {}",
            n - 1,
            holds(k - 1)
        ));
    }
    let total: u128 = c.iter().map(|x| x.ram as u128).sum::<u128>().max(1);
    let mut acc = 0u128;
    let mut bounds = vec![0u32];
    for i in 1..k {
        acc += c[i - 1].ram as u128;
        let ideal = ((2 * n as u128 * acc + total) / (2 * total)) as u32;
        let prev = bounds[i - 1];
        let lo = c[i].held.start.max(prev + 1);
        let hi = c[i - 1]
            .held
            .end
            .min(c[i].held.end - 1)
            .min(n - (k - i) as u32);
        if lo > hi {
            return Err(format!(
                "no layer boundary between {} and {} after layer {prev}",
                holds(i - 1),
                holds(i)
            ));
        }
        bounds.push(ideal.clamp(lo, hi));
    }
    bounds.push(n);
    Ok(bounds
        .windows(2)
        .map(|w| LayerRange::new(w[0], w[1]))
        .collect())
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

    fn full(id: &str, ram: Option<&str>) -> Heard {
        let mut a = ann(id, "0-24", None);
        a.role = "full".into();
        Heard {
            ann: a,
            ram_bytes: ram.map(|r| aeon_cli::size::parse_size(r).unwrap()),
        }
    }

    fn shard(id: &str, role: &str, layers: &str) -> Heard {
        let mut a = ann(id, layers, None);
        a.role = role.into();
        Heard {
            ann: a,
            ram_bytes: None,
        }
    }

    fn layout(a: &Assignment) -> Vec<Vec<String>> {
        a.chains
            .iter()
            .map(|c| {
                c.iter()
                    .map(|x| format!("{}={}-{}", x.node_id, x.layers.start, x.layers.end))
                    .collect()
            })
            .collect()
    }

    #[test]
    fn elector_assigns_ranges_by_announced_ram() {
        let one = AssignRequest::default();
        let nodes = [
            full("n0", Some("1G")),
            full("n1", Some("2G")),
            full("n2", Some("1G")),
        ];
        let a = assign(&nodes, &one).unwrap();
        assert_eq!(layout(&a), vec![vec!["n0=0-6", "n1=6-18", "n2=18-24"]]);
        let roles: Vec<Role> = a.chains[0].iter().map(|x| x.role).collect();
        assert_eq!(roles, vec![Role::Entry, Role::Mid, Role::Exit]);
        // The chains file carries the assigned ranges, the manifests the successors.
        let f = a.chains_file();
        assert_eq!(f.stations[1].layers, "6-18");
        assert_eq!(f.chains.len(), 1);
        let m = a.manifests("m-{node_id}.knot");
        assert_eq!(m[0].listen, "n0");
        assert_eq!(m[0].shard, "m-n0.knot");
        let s = m[0].successor.as_ref().unwrap();
        assert_eq!(
            (s.node_id.as_str(), s.url.as_str(), s.layers.as_str()),
            ("n1", "http://n1", "6-18")
        );
        assert_eq!(m[2].successor, None);
        assert_eq!(m[1].role, Role::Mid);
        // A node without a budget counts as the smallest announced; nobody announcing one
        // gives equal shares.
        let nodes = [
            full("n0", Some("1G")),
            full("n1", Some("3G")),
            full("n2", None),
        ];
        let a = assign(&nodes, &one).unwrap();
        assert_eq!(layout(&a), vec![vec!["n0=0-5", "n1=5-19", "n2=19-24"]]);
        assert!(!a.chains[0][2].ram_announced && a.chains[0][2].ram_bytes == 1 << 30);
        let nodes = [full("n0", None), full("n1", None), full("n2", None)];
        let a = assign(&nodes, &one).unwrap();
        assert_eq!(layout(&a), vec![vec!["n0=0-8", "n1=8-16", "n2=16-24"]]);
        // One node alone is a full chain.
        let a = assign(&nodes[..1], &one).unwrap();
        assert_eq!(a.chains[0][0].role, Role::Full);
        // A tiny budget still gets one layer.
        let nodes = [full("n0", Some("1M")), full("n1", Some("100G"))];
        let a = assign(&nodes, &one).unwrap();
        assert_eq!(layout(&a), vec![vec!["n0=0-1", "n1=1-24"]]);
    }

    #[test]
    fn elector_makes_replicas_and_respects_what_shards_hold() {
        let two = AssignRequest {
            replicas: 2,
            ..Default::default()
        };
        let nodes = [
            full("n0", None),
            full("n1", None),
            full("n2", None),
            full("n3", None),
        ];
        let a = assign(&nodes, &two).unwrap();
        assert_eq!(
            layout(&a),
            vec![vec!["n0=0-12", "n2=12-24"], vec!["n1=0-12", "n3=12-24"]]
        );
        assert_eq!(a.chains_file().chains.len(), 2);
        // Full nodes of different budgets: the chains get equal RAM (4 GB each).
        let nodes = [
            full("n0", Some("1G")),
            full("n1", Some("3G")),
            full("n2", Some("2G")),
            full("n3", Some("2G")),
        ];
        let a = assign(&nodes, &two).unwrap();
        assert_eq!(
            layout(&a),
            vec![vec!["n0=0-6", "n1=6-24"], vec!["n2=0-12", "n3=12-24"]]
        );
        assert!(assign(&nodes[..1], &two)
            .unwrap_err()
            .to_string()
            .contains("cannot make 2 chains"));
        // Shards can only run parts of what they hold; a full node fills in.
        let nodes = [
            shard("x", "exit", "12-24"),
            full("f", None),
            shard("e", "entry", "0-12"),
        ];
        let a = assign(&nodes, &AssignRequest::default()).unwrap();
        assert_eq!(layout(&a), vec![vec!["e=0-8", "f=8-16", "x=16-24"]]);
        let nodes = [shard("e", "entry", "0-12"), shard("x", "exit", "12-24")];
        let a = assign(&nodes, &AssignRequest::default()).unwrap();
        assert_eq!(layout(&a), vec![vec!["e=0-12", "x=12-24"]]);
        // A gap, a chain without an embedding, one without a head: named.
        let e = assign(
            &[shard("e", "entry", "0-8"), shard("x", "exit", "16-24")],
            &AssignRequest::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("between node e (holds 0-8, entry) and node x (holds 16-24, exit)"),
            "{e}"
        );
        let e = assign(&[shard("m", "mid", "0-24")], &AssignRequest::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("first node must hold the embedding"), "{e}");
        let e = assign(&[shard("e", "entry", "0-24")], &AssignRequest::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("last node must hold layer 23 and the head"),
            "{e}"
        );
        let many: Vec<Heard> = (0..25).map(|i| full(&format!("n{i:02}"), None)).collect();
        let e = assign(&many, &AssignRequest::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("25 nodes for 24 layers"), "{e}");
    }

    #[test]
    fn ram_budget_on_the_wire_is_backward_compatible() {
        let h = full("n0", Some("2.4GB"));
        let wire = serde_json::to_string(&h).unwrap();
        assert!(wire.contains(r#""ram_bytes":2400000000"#), "{wire}");
        // An older listener reads the announcement and ignores the budget.
        let old: Announcement = serde_json::from_str(&wire).unwrap();
        assert_eq!(old, h.ann);
        // An older station's beacon (no budget) is heard without one.
        let from_old: Heard =
            serde_json::from_str(&serde_json::to_string(&h.ann).unwrap()).unwrap();
        assert_eq!(from_old.ram_bytes, None);
        assert_eq!(from_old.ann, h.ann);
    }

    #[test]
    fn beacons_are_heard_over_loopback() {
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = probe.local_addr().unwrap().port();
        drop(probe);
        let target: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let plain = |a| Heard {
            ann: a,
            ram_bytes: None,
        };
        let every = Duration::from_millis(50);
        let _b1 = Beacon::spawn(&plain(ann("n1", "0-12", None)), target, every).unwrap();
        let _b2 = Beacon::spawn(&plain(ann("n2", "12-24", None)), target, every).unwrap();
        let _b3 = Beacon::spawn(
            &Heard {
                ann: ann("n3", "0-24", None),
                ram_bytes: Some(7),
            },
            target,
            Duration::from_millis(50),
        )
        .unwrap();
        let heard = hear(target, Duration::from_millis(600)).unwrap();
        let ids: Vec<(&str, Option<u64>)> = heard
            .iter()
            .map(|a| (a.ann.node_id.as_str(), a.ram_bytes))
            .collect();
        assert_eq!(ids, vec![("n1", None), ("n2", None), ("n3", Some(7))]);
    }
}
