//! The RAM-aware mesh planner: which node holds which contiguous layer range.
//!
//! A node's size (`aeon_cli::size`: `2.4G` = 2.4 GiB) is read one of two ways ([`Budget`]):
//!
//! - **weights** (`--node-ram`, the R1 Mesh Scaling Plan's "2.4 GB per node"): the RAM the node
//!   can give to resident weights, KV cache, activations and OS headroom already taken off.
//!   Each layer costs its tensor bytes; the exit node also holds the final norm and output head
//!   (for a tied head, the embedding). The token embedding is not resident: the entry reads one
//!   row of it per token from the mapped file (`Model::embed`), so only the rows it touches
//!   are paged in.
//! - **free** (`--node-free`, the planner before issue 18): the node's free RAM. Usable =
//!   free RAM - [`RESERVE_BYTES`] (kernel, system services, the station binary, its runtime
//!   and activation scratch); each layer also costs its KV budget, its f32 KV bytes per
//!   position times `kv_tokens` (`2 (K and V) * kv_dim * 4` for a transformer block; 0 for a
//!   hybrid's recurrent block, whose state does not grow; each head's decompressed key and
//!   value for deepseek2's MLA, or its latent row when the file has split `attn_k_b`), and
//!   the entry node holds the whole token embedding.
//!
//! The rule of thumb for how many nodes a model needs is `ceil(model bytes / usable)` where
//! model bytes = all tensors (+ the KV budget of every layer when free); the planner then assigns
//! whole layers contiguously (a greedy fill gives the node count, which is at least the
//! rule's; the layers are then balanced over that many nodes so that the largest node is as
//! small as possible). A plan that does not fit is refused, naming what is missing, unless
//! `disk_paged`: then a node maps more than its RAM and the plan reports how many bytes each
//! token re-reads from disk (what does not stay resident is streamed once per token).
//!
//! Contract and the scaling table: `specs/mesh.md`.

use std::path::{Path, PathBuf};

use knot_format::{layer_of, ArchConfig, DType, Knot, LayerRange, Role};
use serde::{Deserialize, Serialize};
// The manifest schema's one home: fat-station reads what this writes.
use station_wire::manifest::{NodeManifest, Successor};

/// RAM a node keeps for itself: ~250 MB kernel and system services on a minimal Linux or
/// Android image, ~150 MB station binary, runtime, thread stacks and activation scratch.
pub const RESERVE_BYTES: u64 = 400_000_000;

/// Default KV budget: positions per session the plan reserves cache for.
pub const DEFAULT_KV_TOKENS: u64 = 1024;

/// KV width assumed for synthetic models (8 KV heads of 128, a GQA 7B-class model).
pub const SYNTHETIC_KV_DIM: u64 = 1024;

/// Default first listen port of a plan's nodes.
pub const DEFAULT_BASE_PORT: u16 = 7700;

/// What a node's size means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Budget {
    /// The bytes of weights the node keeps resident (KV, activations and OS headroom already
    /// taken off, as the R1 Mesh Scaling Plan counts); the token embedding is not charged.
    #[default]
    Weights,
    /// The node's free RAM: [`RESERVE_BYTES`] and the KV budget come off, and the entry holds
    /// the whole embedding.
    Free,
}

/// How a plan charges a node: the KV positions budgeted per layer (0 for a weights budget)
/// and whether the token embedding counts as resident.
#[derive(Clone, Copy, Debug)]
struct Cost {
    kv_tokens: u64,
    embed: bool,
}

impl Cost {
    fn of(req: &PlanRequest) -> Cost {
        match req.budget {
            Budget::Weights => Cost {
                kv_tokens: 0,
                embed: false,
            },
            Budget::Free => Cost {
                kv_tokens: req.kv_tokens,
                embed: true,
            },
        }
    }
}

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A size such as `2.4G` did not parse (`aeon_cli::size`).
    #[error("{flag}: {why}")]
    BadSize {
        flag: &'static str,
        /// Not `source`: the message already says it, once.
        why: aeon_cli::size::SizeError,
    },
    /// `--node name=RAM` did not parse.
    #[error("bad --node {0:?}: expected NAME=RAM, e.g. phone1=2.4G")]
    BadNode(String),
    /// The arguments contradict each other or are out of range.
    #[error("{0}")]
    Invalid(String),
    /// The model does not fit the nodes given.
    #[error("the model does not fit: {0}")]
    DoesNotFit(String),
    /// Writing a manifest failed.
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Writing the shards failed.
    #[error(transparent)]
    Shard(#[from] crate::ShardError),
}

/// Parses the size given to `flag` (the workspace's rule, `aeon_cli::size`: `2.4G` =
/// 2.4 GiB, `2.4GB` = 2.4e9 bytes; a bare `2.4` is refused with a hint).
pub fn parse_size(flag: &'static str, s: &str) -> Result<u64, PlanError> {
    aeon_cli::size::parse_size_nonzero(s).map_err(|why| PlanError::BadSize { flag, why })
}

/// `1.23 GiB` style (binary, as `--node-ram 2.4G` reads and the R1 plan counts).
pub fn human(b: u64) -> String {
    const KI: f64 = 1024.0;
    let b = b as f64;
    if b >= KI * KI * KI {
        format!("{:.2} GiB", b / (KI * KI * KI))
    } else if b >= KI * KI {
        format!("{:.1} MiB", b / (KI * KI))
    } else {
        format!("{:.0} KiB", b / KI)
    }
}

/// What the planner knows of a model: bytes per layer and the entry/exit extras.
#[derive(Clone, Debug, Serialize)]
pub struct ModelCosts {
    pub model_id: String,
    /// Header hash of the whole model (`Knot::model_hash`); `synthetic` for a synthetic model.
    pub model_hash: String,
    /// Tensor bytes of each block.
    pub layer_bytes: Vec<u64>,
    /// Of `layer_bytes`, what one decoded token reads: everything but the experts it does not
    /// run (mixture of experts: `k / E` of the stacked `*_exps` tensors); a dense block's
    /// whole bytes.
    pub layer_active_bytes: Vec<u64>,
    /// Token embedding (+ anything outside the blocks that is not the head).
    pub entry_bytes: u64,
    /// Of `entry_bytes`, the token embedding (read one row per token, not resident under a
    /// weights budget).
    pub embed_bytes: u64,
    /// Final norm + output head (the embedding again when tied).
    pub exit_bytes: u64,
    /// `n_kv_heads * head_dim`.
    pub kv_dim: u64,
    /// f32 KV-cache bytes one position costs in each block, as a station stores them by
    /// default: keys and values of an attention block (MLA: every head's decompressed key and
    /// value, or the latent row for a split-`attn_k_b` file); 0 for a recurrent block.
    pub layer_kv_bytes: Vec<u64>,
    /// deepseek2: the same with MLA's latent cache (`fat-station --mla-latent-cache`).
    pub latent_kv_bytes: Option<Vec<u64>>,
    /// The head is the embedding: `exit_bytes` holds a copy of `embed_bytes` that the file
    /// stores once.
    pub tied: bool,
}

impl ModelCosts {
    /// Reads the tensor table of a whole model.
    pub fn from_knot(knot: &Knot) -> ModelCosts {
        let a = knot.arch();
        let mut layer_bytes = vec![0u64; a.n_layers as usize];
        let mut layer_active_bytes = vec![0u64; a.n_layers as usize];
        let (mut entry, mut exit) = (0u64, 0u64);
        let mut embed = 0u64;
        for t in knot.tensors() {
            let len = t.entry.len;
            match (layer_of(t.name()), t.name()) {
                (Some(l), name) if (l as usize) < layer_bytes.len() => {
                    layer_bytes[l as usize] += len;
                    layer_active_bytes[l as usize] += match &a.moe {
                        Some(m) if name.contains("_exps.") => {
                            (len as u128 * m.n_experts_used as u128 / m.n_experts as u128) as u64
                        }
                        _ => len,
                    };
                }
                (_, "output.weight" | "output_norm.weight" | "token_embd_norm.weight") => {
                    exit += len
                }
                (_, "token_embd.weight") => {
                    embed = len;
                    entry += len
                }
                _ => entry += len,
            }
        }
        let tied = a.tied_embeddings && knot.tensor("output.weight").is_none();
        if tied {
            exit += embed;
        }
        let (layer_kv_bytes, latent_kv_bytes) = kv_bytes_per_layer(a);
        ModelCosts {
            model_id: knot.header().model_id.clone(),
            model_hash: knot.model_hash().to_string(),
            layer_bytes,
            layer_active_bytes,
            entry_bytes: entry,
            embed_bytes: embed,
            exit_bytes: exit,
            kv_dim: a.n_kv_heads as u64 * a.head_dim as u64,
            layer_kv_bytes,
            latent_kv_bytes,
            tied,
        }
    }

    /// What a llama-family file of header `a`'s shape holds when every matrix is stored as
    /// `dtype` and norms and biases as F32 (as llama.cpp's `Q8_0` files are written): the
    /// planner's view of a model known by its shape only (no weights), per tensor as
    /// [`ModelCosts::from_knot`] reads a file. `None` when a matrix is not whole blocks of
    /// `dtype` or a size overflows.
    pub fn from_arch(model_id: &str, a: &ArchConfig, dtype: DType) -> Option<ModelCosts> {
        let (h, ffn, vocab) = (a.hidden as u64, a.ffn as u64, a.vocab as u64);
        let q = a.n_heads as u64 * a.head_dim as u64;
        let kv = a.n_kv_heads as u64 * a.head_dim as u64;
        let f32s = |n: u64| n.checked_mul(4);
        let mut layer = 0u64;
        for n in [h * q, h * kv, h * kv, q * h] {
            layer = layer.checked_add(dtype.bytes_for(n)?)?;
        }
        // The FFN: dense, or E experts of which a token runs k, plus the F32 router.
        let (ffn_bytes, ffn_active) = match &a.moe {
            None => {
                let b = dtype.bytes_for(3 * h * ffn)?;
                (b, b)
            }
            Some(m) => {
                let one = dtype.bytes_for(3 * h * m.expert_ffn as u64)?;
                let router = f32s(h * m.n_experts as u64)?;
                (
                    one.checked_mul(m.n_experts as u64)?.checked_add(router)?,
                    one.checked_mul(m.n_experts_used as u64)?
                        .checked_add(router)?,
                )
            }
        };
        // attn_norm, ffn_norm; q/k/v biases (qwen2); q/k head norms (qwen3).
        let mut vectors = 2 * h;
        if a.qkv_bias {
            vectors += q + 2 * kv;
        }
        if a.qk_norm {
            vectors += 2 * a.head_dim as u64;
        }
        layer = layer.checked_add(f32s(vectors)?)?;
        let embed = dtype.bytes_for(vocab.checked_mul(h)?)?;
        Some(ModelCosts {
            model_id: model_id.into(),
            model_hash: "synthetic".into(),
            layer_bytes: vec![layer.checked_add(ffn_bytes)?; a.n_layers as usize],
            layer_active_bytes: vec![layer.checked_add(ffn_active)?; a.n_layers as usize],
            entry_bytes: embed,
            embed_bytes: embed,
            // output_norm + the head (the embedding again when tied, as `from_knot` counts it).
            exit_bytes: f32s(h)?.checked_add(embed)?,
            kv_dim: kv,
            layer_kv_bytes: vec![f32s(2 * kv)?; a.n_layers as usize],
            latent_kv_bytes: None,
            tied: a.tied_embeddings,
        })
    }

    /// A synthetic model of `bytes` spread evenly over `layers` blocks (no separate
    /// embedding or head), for the scaling table.
    pub fn synthetic(bytes: u64, layers: u32, kv_dim: u64) -> ModelCosts {
        let n = layers.max(1) as u64;
        let mut layer_bytes = vec![bytes / n; n as usize];
        layer_bytes[0] += bytes % n;
        ModelCosts {
            model_id: format!("synthetic-{}", human(bytes).replace(' ', "")),
            model_hash: "synthetic".into(),
            layer_active_bytes: layer_bytes.clone(),
            layer_bytes,
            entry_bytes: 0,
            embed_bytes: 0,
            exit_bytes: 0,
            kv_dim,
            layer_kv_bytes: vec![2 * kv_dim * 4; n as usize],
            latent_kv_bytes: None,
            tied: false,
        }
    }

    /// Tensor bytes of the whole model, a tied head counted twice (entry and exit each hold
    /// the embedding).
    pub fn weight_bytes(&self) -> u64 {
        self.layer_bytes.iter().sum::<u64>() + self.entry_bytes + self.exit_bytes
    }

    /// Tensor bytes as the file stores them (a tied head once): what the R1 plan's rule of
    /// thumb divides by the budget.
    pub fn file_bytes(&self) -> u64 {
        self.weight_bytes() - if self.tied { self.embed_bytes } else { 0 }
    }
}

/// A node's RAM as given on the command line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeSpec {
    pub name: String,
    pub ram: u64,
}

/// What to plan for.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// Size of every node when `nodes` is not a list.
    pub node_ram: Option<u64>,
    /// What the node sizes (`node_ram`, `node_list`) mean.
    pub budget: Budget,
    /// Exactly this many identical nodes (else as many as needed).
    pub nodes: Option<u32>,
    /// Named nodes with their own RAM, in chain order.
    pub node_list: Vec<NodeSpec>,
    /// Independent chains.
    pub replicas: u32,
    /// Allow nodes to hold more than their RAM through demand paging.
    pub disk_paged: bool,
    /// KV positions budgeted per layer (free budgets only).
    pub kv_tokens: u64,
}

/// One node of a plan.
#[derive(Clone, Debug, Serialize)]
pub struct PlannedNode {
    pub node_id: String,
    pub chain: u32,
    pub role: Role,
    pub layers: LayerRange,
    pub ram: u64,
    pub usable: u64,
    /// Weights + KV + entry/exit extras this node holds.
    pub bytes: u64,
    /// Of which KV budget.
    pub kv_bytes: u64,
    /// f32 KV-cache bytes one position of a session costs on this node.
    pub kv_bytes_per_position: u64,
    /// Bytes over `usable` (re-read from disk every token; only with `disk_paged`).
    pub paged_bytes: u64,
    /// Weight bytes this node reads per decoded token: its blocks' active bytes (the chosen
    /// experts only) and, on the exit, the head (the embedding row the entry reads is not
    /// counted).
    pub active_bytes: u64,
}

/// A whole plan.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub model_id: String,
    pub model_hash: String,
    pub n_layers: u32,
    /// All tensor bytes.
    pub weight_bytes: u64,
    /// KV budget of all layers.
    pub kv_bytes: u64,
    pub kv_tokens: u64,
    /// What the node sizes meant.
    pub budget: Budget,
    pub reserve_bytes: u64,
    /// The rule: `ceil((weights + KV) / usable)` (per chain; identical nodes only).
    pub nodes_needed: Option<u32>,
    /// Nodes per chain actually planned.
    pub nodes_per_chain: u32,
    pub replicas: u32,
    /// Why that many nodes, in words.
    pub why: String,
    /// Disk bytes each token re-reads (0 unless disk-paged and over RAM).
    pub disk_bytes_per_token: u64,
    /// Weight bytes one chain reads per decoded token (sum of its nodes' `active_bytes`).
    pub active_bytes_per_token: u64,
    /// f32 KV-cache bytes one position of a session costs over the whole chain.
    pub kv_bytes_per_position: u64,
    /// deepseek2: the same with MLA's latent cache (`fat-station --mla-latent-cache`).
    pub latent_kv_bytes_per_position: Option<u64>,
    pub nodes: Vec<PlannedNode>,
}

fn layer_cost(m: &ModelCosts, l: usize, cost: Cost) -> u64 {
    m.layer_bytes[l] + kv_layer(m, l, cost)
}

fn kv_layer(m: &ModelCosts, l: usize, cost: Cost) -> u64 {
    m.layer_kv_bytes[l] * cost.kv_tokens
}

/// f32 KV bytes per position of each block of header `a` (see [`ModelCosts::layer_kv_bytes`]),
/// and with MLA's latent cache for deepseek2.
fn kv_bytes_per_layer(a: &ArchConfig) -> (Vec<u64>, Option<Vec<u64>>) {
    let n = a.n_layers as usize;
    let recurrent = |l: usize| a.recurrent.as_ref().is_some_and(|r| r.layers[l]);
    let per = |bytes: u64| -> Vec<u64> {
        (0..n)
            .map(|l| if recurrent(l) { 0 } else { bytes })
            .collect()
    };
    match &a.mla {
        Some(m) => {
            let heads = a.n_heads as u64;
            let latent = (m.kv_lora_rank as u64 + m.rope_dim as u64) * 4;
            let full = heads * (a.head_dim as u64 + m.v_head_dim as u64) * 4;
            (
                per(if m.split_kv_b { latent } else { full }),
                Some(per(latent)),
            )
        }
        None => (per(2 * a.n_kv_heads as u64 * a.head_dim as u64 * 4), None),
    }
}

/// Bytes a node holding `r` costs.
fn range_cost(m: &ModelCosts, r: LayerRange, cost: Cost) -> u64 {
    let n = m.layer_bytes.len() as u32;
    let mut c: u64 = (r.start..r.end)
        .map(|l| layer_cost(m, l as usize, cost))
        .sum();
    if r.start == 0 {
        c += if cost.embed {
            m.entry_bytes
        } else {
            m.entry_bytes - m.embed_bytes
        };
    }
    if r.end == n {
        c += m.exit_bytes;
    }
    c
}

/// Greedy contiguous fill of `caps` (usable bytes per node, in order); returns the ranges
/// and, when layers are left over, the first unplaced layer.
fn greedy(m: &ModelCosts, caps: &[u64], kv_tokens: Cost) -> (Vec<LayerRange>, Option<u32>) {
    let n = m.layer_bytes.len() as u32;
    let mut out = Vec::new();
    let mut next = 0u32;
    for &cap in caps {
        if next == n {
            break;
        }
        let mut end = next;
        while end < n && range_cost(m, LayerRange::new(next, end + 1), kv_tokens) <= cap {
            end += 1;
        }
        if end == next {
            return (out, Some(next));
        }
        out.push(LayerRange::new(next, end));
        next = end;
    }
    (out, (next < n).then_some(next))
}

/// Contiguous split of the layers into exactly `k` non-empty ranges minimising the largest
/// node cost (binary search on the bound, greedy check).
fn balanced(m: &ModelCosts, k: u32, kv_tokens: Cost) -> Vec<LayerRange> {
    let n = m.layer_bytes.len() as u32;
    let k = k.clamp(1, n.max(1));
    let fits = |bound: u64| -> Option<Vec<LayerRange>> {
        let mut out = Vec::new();
        let mut next = 0u32;
        while next < n {
            let left_nodes = k - out.len() as u32;
            if left_nodes == 0 {
                return None;
            }
            // Leave at least one layer for each remaining node.
            let max_end = n - (left_nodes - 1);
            let mut end = next;
            while end < max_end && range_cost(m, LayerRange::new(next, end + 1), kv_tokens) <= bound
            {
                end += 1;
            }
            if end == next {
                return None;
            }
            out.push(LayerRange::new(next, end));
            next = end;
        }
        (out.len() as u32 == k).then_some(out)
    };
    let (mut lo, mut hi) = (0u64, range_cost(m, LayerRange::new(0, n), kv_tokens));
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid).is_some() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    fits(lo).unwrap_or_else(|| crate::even_ranges(n, k).unwrap_or_default())
}

/// Makes a plan.
pub fn plan(m: &ModelCosts, req: &PlanRequest) -> Result<Plan, PlanError> {
    let n = m.layer_bytes.len() as u32;
    if n == 0 {
        return Err(PlanError::Invalid("the model has no layers".into()));
    }
    if req.replicas == 0 {
        return Err(PlanError::Invalid("--replicas must be at least 1".into()));
    }
    let kv = Cost::of(req);
    let free = req.budget == Budget::Free;
    let kv_total = (0..n as usize).map(|l| kv_layer(m, l, kv)).sum();
    let weights = if free {
        m.weight_bytes()
    } else {
        m.file_bytes()
    };
    let total = weights + kv_total;
    let reserve = if free { RESERVE_BYTES } else { 0 };
    let usable_of = |ram: u64| ram.saturating_sub(reserve);
    // What a node needs to hold `bytes`, in the units it was given.
    let size_for = |bytes: u64| {
        if free {
            format!("at least {} free RAM", human(bytes + reserve))
        } else {
            format!("a weight budget of at least {}", human(bytes))
        }
    };

    // Per-node RAM, in chain order (a list) or identical nodes.
    let (ranges, rams, nodes_needed, why): (Vec<LayerRange>, Vec<u64>, Option<u32>, String) =
        if !req.node_list.is_empty() {
            if req.nodes.is_some() {
                return Err(PlanError::Invalid(
                    "give either --nodes or --node NAME=RAM, not both".into(),
                ));
            }
            let caps: Vec<u64> = req.node_list.iter().map(|s| usable_of(s.ram)).collect();
            let (mut ranges, left) = greedy(m, &caps, kv);
            if let Some(first) = left {
                if !req.disk_paged {
                    let missing = range_cost(m, LayerRange::new(first, n), kv);
                    return Err(PlanError::DoesNotFit(format!(
                    "{} nodes ({}) hold layers 0-{first}; layers {first}-{n} ({}) are left over: add a node with {}, or pass --disk-paged",
                    req.node_list.len(),
                    req.node_list.iter().map(|s| format!("{}={}", s.name, human(s.ram))).collect::<Vec<_>>().join(", "),
                    human(missing),
                    size_for(missing),
                )));
                }
                // Disk-paged: spread what is left by RAM share over all the nodes.
                ranges = weighted_ranges(n, &caps);
            } else if ranges.len() < req.node_list.len() {
                // Fewer nodes suffice: spread over all given nodes anyway, weighted by RAM.
                ranges = weighted_ranges(n, &caps);
                if ranges
                    .iter()
                    .zip(&caps)
                    .any(|(r, &c)| range_cost(m, *r, kv) > c)
                {
                    ranges = greedy(m, &caps, kv).0;
                }
            }
            let why = format!(
                "{} named nodes with {} usable in all for {} of {}",
                req.node_list.len(),
                human(caps.iter().sum()),
                human(total),
                if free { "weights + KV" } else { "weights" }
            );
            let rams = req.node_list.iter().map(|s| s.ram).collect();
            (ranges, rams, None, why)
        } else {
            let ram = req.node_ram.ok_or_else(|| {
                PlanError::Invalid(
                    "give --node-ram SIZE, --node-free SIZE or --node NAME=SIZE ...".into(),
                )
            })?;
            let usable = usable_of(ram);
            if usable == 0 {
                return Err(PlanError::DoesNotFit(format!(
                    "a node of {} RAM has nothing left after the {} reserve",
                    human(ram),
                    human(RESERVE_BYTES)
                )));
            }
            let rule = total.div_ceil(usable) as u32;
            // The largest single-node piece: the layer (with the entry or exit extra) that must fit.
            let biggest = (0..n)
                .map(|l| range_cost(m, LayerRange::new(l, l + 1), kv))
                .max()
                .unwrap_or(0);
            let mut why = if free {
                format!(
                    "ceil(({} weights + {} KV for {} tokens) / {} usable per node ({} RAM - {} reserve)) = {rule}",
                    human(weights),
                    human(kv_total),
                    kv.kv_tokens,
                    human(usable),
                    human(ram),
                    human(RESERVE_BYTES)
                )
            } else {
                format!(
                    "ceil({} weights / {} weight budget per node) = {rule}",
                    human(weights),
                    human(usable),
                )
            };
            let k = match req.nodes {
                Some(0) => return Err(PlanError::Invalid("--nodes must be at least 1".into())),
                Some(k) if k > n => {
                    return Err(PlanError::Invalid(format!(
                        "--nodes {k} is more than the model's {n} layers"
                    )))
                }
                Some(k) => {
                    let r = balanced(m, k, kv);
                    let worst = r.iter().map(|r| range_cost(m, *r, kv)).max().unwrap_or(0);
                    if worst > usable && !req.disk_paged {
                        let (g, left) = greedy(m, &vec![usable; n as usize], kv);
                        let need = if left.is_some() { None } else { Some(g.len()) };
                        return Err(PlanError::DoesNotFit(format!(
                        "{k} nodes of {}: the largest node needs {} but has {} usable ({} short){}; pass --disk-paged to page from disk",
                        human(ram),
                        human(worst),
                        human(usable),
                        human(worst - usable),
                        match need {
                            Some(g) => format!("; {g} nodes would fit"),
                            None => format!("; a single layer needs up to {} so no number of these nodes fits", human(biggest)),
                        }
                    )));
                    }
                    why.push_str(&format!("; {k} nodes requested"));
                    r
                }
                None => {
                    let (g, left) = greedy(m, &vec![usable; n as usize], kv);
                    if let Some(l) = left {
                        let c = range_cost(m, LayerRange::new(l, l + 1), kv);
                        if !req.disk_paged {
                            return Err(PlanError::DoesNotFit(format!(
                            "layer {l} alone needs {} ({}{}) but a node has {} usable: use nodes with {}, or pass --disk-paged",
                            human(c),
                            if free { "weights + KV" } else { "weights" },
                            if l == 0 && free { " + embedding" } else if l + 1 == n { " + head" } else { "" },
                            human(usable),
                            size_for(c)
                        )));
                        }
                        why.push_str(
                            "; a single layer exceeds a node: one layer per node, paged from disk",
                        );
                        (0..n).map(|l| LayerRange::new(l, l + 1)).collect()
                    } else {
                        let k = g.len() as u32;
                        if k > rule {
                            why.push_str(&format!(
                            "; whole layers only: the largest layer costs {}, so {k} nodes (not {rule}) hold every layer",
                            human(biggest)
                        ));
                        }
                        balanced(m, k, kv)
                    }
                }
            };
            let rams = vec![ram; k.len()];
            (k, rams, Some(rule), why)
        };

    let mut nodes = Vec::new();
    let mut disk = 0u64;
    let mut active_total = 0u64;
    let per_chain = ranges.len() as u32;
    for chain in 0..req.replicas {
        for (i, (r, &ram)) in ranges.iter().zip(&rams).enumerate() {
            let bytes = range_cost(m, *r, kv);
            let active = m.layer_active_bytes[r.start as usize..r.end as usize]
                .iter()
                .sum::<u64>()
                + if r.end == n { m.exit_bytes } else { 0 };
            if chain == 0 {
                active_total += active;
            }
            let usable = usable_of(ram);
            let paged = bytes.saturating_sub(usable);
            if chain == 0 {
                disk += paged;
            }
            let base = if req.node_list.is_empty() {
                format!("n{i}")
            } else {
                req.node_list[i].name.clone()
            };
            nodes.push(PlannedNode {
                node_id: if req.replicas > 1 {
                    format!("r{chain}-{base}")
                } else {
                    base
                },
                chain,
                role: crate::role_for(*r, n),
                layers: *r,
                ram,
                usable,
                bytes,
                kv_bytes: (r.start..r.end).map(|l| kv_layer(m, l as usize, kv)).sum(),
                kv_bytes_per_position: m.layer_kv_bytes[r.start as usize..r.end as usize]
                    .iter()
                    .sum(),
                paged_bytes: paged,
                active_bytes: active,
            });
        }
    }
    Ok(Plan {
        model_id: m.model_id.clone(),
        model_hash: m.model_hash.clone(),
        n_layers: n,
        weight_bytes: weights,
        kv_bytes: kv_total,
        kv_tokens: kv.kv_tokens,
        budget: req.budget,
        reserve_bytes: reserve,
        nodes_needed,
        nodes_per_chain: per_chain,
        replicas: req.replicas,
        why,
        disk_bytes_per_token: disk,
        active_bytes_per_token: active_total,
        kv_bytes_per_position: m.layer_kv_bytes.iter().sum(),
        latent_kv_bytes_per_position: m.latent_kv_bytes.as_ref().map(|v| v.iter().sum()),
        nodes,
    })
}

/// Ranges proportional to each node's share of `caps` (at least one layer each).
fn weighted_ranges(n: u32, caps: &[u64]) -> Vec<LayerRange> {
    let k = (caps.len() as u32).min(n);
    let sum: u64 = caps.iter().take(k as usize).sum::<u64>().max(1);
    let mut out = Vec::new();
    let mut start = 0u32;
    let mut acc = 0u64;
    for (i, &c) in caps.iter().take(k as usize).enumerate() {
        acc += c;
        let left = k - i as u32 - 1;
        let mut end = ((n as u128 * acc as u128) / sum as u128) as u32;
        end = end.clamp(start + 1, n - left);
        if i as u32 == k - 1 {
            end = n;
        }
        out.push(LayerRange::new(start, end));
        start = end;
    }
    out
}

/// Builds each node's manifest. Node `i` of chain `c` listens on `host:base_port + c*per_chain + i`.
pub fn manifests(
    p: &Plan,
    host: &str,
    base_port: u16,
    shard_name: &dyn Fn(LayerRange) -> String,
) -> Vec<NodeManifest> {
    let addr = |i: usize| format!("{host}:{}", base_port as usize + i);
    p.nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let next = p.nodes.get(i + 1).filter(|nx| nx.chain == node.chain);
            NodeManifest {
                node_id: node.node_id.clone(),
                model_id: p.model_id.clone(),
                model_hash: p.model_hash.clone(),
                role: node.role,
                layers: format!("{}-{}", node.layers.start, node.layers.end),
                successor: next.map(|nx| Successor {
                    node_id: nx.node_id.clone(),
                    url: format!("http://{}", addr(i + 1)),
                    layers: format!("{}-{}", nx.layers.start, nx.layers.end),
                }),
                listen: addr(i),
                shard: shard_name(node.layers),
                chain: node.chain,
            }
        })
        .collect()
}

/// Writes `v` as pretty JSON atomically (temp file + rename).
pub fn write_json_atomic<T: Serialize>(path: &Path, v: &T) -> Result<(), PlanError> {
    let werr = |source| PlanError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = serde_json::to_vec_pretty(v).map_err(|e| werr(std::io::Error::other(e)))?;
    bytes.push(b'\n');
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, &bytes).map_err(werr)?;
    std::fs::rename(&tmp, path).map_err(werr)
}

/// `shard-knot plan`: plan node layer ranges by node RAM; with `-o DIR`, write one manifest
/// per node and (for a real model) the shards.
#[derive(Clone, Debug, clap::Args)]
pub struct PlanArgs {
    /// The whole model (.knot). Omit with --model-bytes for a synthetic model.
    pub knot: Option<PathBuf>,
    /// Weight budget of every node: the RAM it keeps for resident weights, with KV cache,
    /// activations and OS headroom already taken off (the R1 Mesh Scaling Plan's "2.4 GB per
    /// node": --node-ram 2.4G). Sizes: K/M/G/T binary, KB/MB/GB/TB decimal.
    #[arg(long, value_name = "SIZE", conflicts_with = "node_free")]
    pub node_ram: Option<String>,
    /// Free RAM of every node: the planner takes off a 400 MB reserve and the KV budget
    /// (--kv-tokens) itself, and counts the whole embedding on the entry node.
    #[arg(long, value_name = "SIZE")]
    pub node_free: Option<String>,
    /// Use exactly N identical nodes per chain (default: as few as fit).
    #[arg(long)]
    pub nodes: Option<u32>,
    /// A named node and its weight budget, NAME=SIZE, in chain order (repeat for each node).
    #[arg(long = "node", value_name = "NAME=SIZE")]
    pub node: Vec<String>,
    /// Read the --node sizes as free RAM (as --node-free does), not weight budgets.
    #[arg(long, requires = "node")]
    pub free: bool,
    /// Independent chains (replicas) for throughput and failover.
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Allow a node to hold more than its RAM (mmap demand paging); reports the disk bytes
    /// each token re-reads.
    #[arg(long)]
    pub disk_paged: bool,
    /// KV positions budgeted per layer with free-RAM sizes (each costs 2 * kv_dim * 4 bytes).
    #[arg(long, default_value_t = DEFAULT_KV_TOKENS)]
    pub kv_tokens: u64,
    /// Synthetic model size instead of a file (e.g. 7G), spread evenly over --layers.
    #[arg(long, requires = "layers")]
    pub model_bytes: Option<String>,
    /// Layers of the synthetic model (1..=65536, KNOT's cap on `n_layers`).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(knot_format::header::MAX_LAYERS)))]
    pub layers: Option<u32>,
    /// KV width (n_kv_heads * head_dim) of the synthetic model.
    #[arg(long, default_value_t = SYNTHETIC_KV_DIM)]
    pub kv_dim: u64,
    /// Write the manifests (node-ID.json) and shards into DIR.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Host the nodes listen on (manifests' `listen` and successor URLs).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// First listen port; node i listens on PORT + i.
    #[arg(long, default_value_t = DEFAULT_BASE_PORT)]
    pub base_port: u16,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs `shard-knot plan`.
pub fn run(args: PlanArgs) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context;
    use std::io::Write;
    let node_list = args
        .node
        .iter()
        .map(|s| {
            let (name, ram) = s
                .split_once('=')
                .ok_or_else(|| PlanError::BadNode(s.clone()))?;
            if name.is_empty()
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            {
                return Err(PlanError::BadNode(s.clone()));
            }
            Ok(NodeSpec {
                name: name.into(),
                ram: parse_size("--node", ram)?,
            })
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    let (node_ram, budget) = match (&args.node_ram, &args.node_free) {
        (Some(s), _) => (Some(parse_size("--node-ram", s)?), Budget::Weights),
        (None, Some(s)) => (Some(parse_size("--node-free", s)?), Budget::Free),
        (None, None) if args.free => (None, Budget::Free),
        (None, None) => (None, Budget::Weights),
    };
    let req = PlanRequest {
        node_ram,
        budget,
        nodes: args.nodes,
        node_list,
        replicas: args.replicas,
        disk_paged: args.disk_paged,
        kv_tokens: args.kv_tokens,
    };
    let knot = match (&args.knot, &args.model_bytes) {
        // The error names the file itself.
        (Some(p), None) => Some(Knot::open(p)?),
        (None, Some(_)) => None,
        (Some(_), Some(_)) => anyhow::bail!("give a model file or --model-bytes, not both"),
        (None, None) => {
            anyhow::bail!("give a model file (M.knot) or --model-bytes SIZE --layers N")
        }
    };
    let costs = match (&knot, &args.model_bytes) {
        (Some(k), _) => ModelCosts::from_knot(k),
        (None, Some(b)) => ModelCosts::synthetic(
            parse_size("--model-bytes", b)?,
            args.layers.unwrap_or(0),
            args.kv_dim,
        ),
        _ => unreachable!("checked above"),
    };
    let p = plan(&costs, &req)?;
    if let Some(dir) = &args.output {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let stem = args
            .knot
            .as_ref()
            .and_then(|p| p.file_stem())
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| costs.model_id.clone());
        let n = p.n_layers;
        if let Some(k) = &knot {
            let ranges: Vec<LayerRange> = p
                .nodes
                .iter()
                .filter(|x| x.chain == 0)
                .map(|x| x.layers)
                .collect();
            crate::split(k, &ranges, dir, &stem, &mut |_| {}).context("writing the shards")?;
        }
        let name = |r: LayerRange| crate::shard_file_name(&stem, r, n);
        for m in manifests(&p, &args.host, args.base_port, &name) {
            let path = dir.join(format!("{}.json", m.node_id));
            write_json_atomic(&path, &m)?;
        }
    }
    let mut o = std::io::stdout().lock();
    if args.json {
        writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&p).context("encoding the plan")?
        )?;
    } else {
        print_plan(&mut o, &p, args.output.as_deref())?;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn print_plan(o: &mut dyn std::io::Write, p: &Plan, out: Option<&Path>) -> std::io::Result<()> {
    match p.budget {
        Budget::Free => writeln!(
            o,
            "{}: {} layers, {} weights + {} KV ({} tokens)",
            p.model_id,
            p.n_layers,
            human(p.weight_bytes),
            human(p.kv_bytes),
            p.kv_tokens
        )?,
        Budget::Weights => writeln!(
            o,
            "{}: {} layers, {} weights (weight budgets: KV, activations and headroom are outside them)",
            p.model_id,
            p.n_layers,
            human(p.weight_bytes),
        )?,
    }
    if let Some(r) = p.nodes_needed {
        writeln!(o, "nodes needed: {r} ({})", p.why)?;
    } else {
        writeln!(o, "nodes: {}", p.why)?;
    }
    writeln!(
        o,
        "planned: {} node(s) per chain x {} chain(s)",
        p.nodes_per_chain, p.replicas
    )?;
    for n in &p.nodes {
        writeln!(
            o,
            "  {:<10} chain {} {:<5} layers {:>3}-{:<3} {:>10} of {:>10} usable, {:>10} read per token{}",
            n.node_id,
            n.chain,
            format!("{:?}", n.role).to_lowercase(),
            n.layers.start,
            n.layers.end,
            human(n.bytes),
            human(n.usable),
            human(n.active_bytes),
            if n.paged_bytes > 0 {
                format!("  ({} paged from disk per token)", human(n.paged_bytes))
            } else {
                String::new()
            }
        )?;
    }
    writeln!(
        o,
        "read per decoded token: {} per chain (the blocks' active weights and the head; a \
         mixture of experts reads only the experts a token runs)",
        human(p.active_bytes_per_token)
    )?;
    let attn = p
        .nodes
        .iter()
        .filter(|n| n.chain == 0)
        .map(|n| n.kv_bytes_per_position);
    writeln!(
        o,
        "KV cache per position: {} per chain (f32; largest node {}){}",
        human(p.kv_bytes_per_position),
        human(attn.max().unwrap_or(0)),
        match p.latent_kv_bytes_per_position {
            Some(l) if l != p.kv_bytes_per_position => format!(
                "; {} with MLA's latent cache (fat-station --mla-latent-cache)",
                human(l)
            ),
            Some(_) => "; MLA's latent rows (split attn_k_b / attn_v_b)".into(),
            None => String::new(),
        }
    )?;
    if p.disk_bytes_per_token > 0 {
        writeln!(
            o,
            "disk re-read per token: {}",
            human(p.disk_bytes_per_token)
        )?;
    }
    if let Some(d) = out {
        writeln!(
            o,
            "wrote manifests{} to {}",
            if p.model_hash == "synthetic" {
                ""
            } else {
                " and shards"
            },
            d.display()
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Identical nodes of `ram` free RAM (the planner's semantics before issue 18).
    fn req(ram: &str) -> PlanRequest {
        PlanRequest {
            node_ram: Some(parse_size("--node-free", ram).unwrap()),
            budget: Budget::Free,
            nodes: None,
            node_list: vec![],
            replicas: 1,
            disk_paged: false,
            kv_tokens: DEFAULT_KV_TOKENS,
        }
    }

    #[test]
    fn sizes_parse_decimal_and_binary() {
        assert_eq!(parse_size("--node-ram", "2.4GB").unwrap(), 2_400_000_000);
        assert_eq!(parse_size("--node-ram", "2.4G").unwrap(), 2_576_980_378);
        assert_eq!(parse_size("--node-ram", "1Gi").unwrap(), 1 << 30);
        assert!(parse_size("--node-ram", "lots").is_err());
    }

    /// The free-RAM table of specs/mesh.md (`--node-free 2.4GB`): today's figures stay reachable.
    #[test]
    fn free_ram_table_node_counts() {
        let r = req("2.4GB");
        let cases = [
            (4_000_000_000u64, 32u32, 3u32, 3u32),
            (7_000_000_000, 32, 4, 4),
            (70_000_000_000, 80, 36, 40),
        ];
        for (bytes, layers, rule, planned) in cases {
            let p = plan(&ModelCosts::synthetic(bytes, layers, SYNTHETIC_KV_DIM), &r).unwrap();
            assert_eq!(
                p.nodes_needed,
                Some(rule),
                "{bytes} bytes: rule ({})",
                p.why
            );
            assert_eq!(
                p.nodes_per_chain, planned,
                "{bytes} bytes: planned ({})",
                p.why
            );
            assert!(
                p.nodes.iter().all(|n| n.bytes <= n.usable),
                "every node fits"
            );
            // Contiguous tiling.
            let mut next = 0;
            for n in &p.nodes {
                assert_eq!(n.layers.start, next);
                next = n.layers.end;
            }
            assert_eq!(next, layers);
        }
    }

    #[test]
    fn half_a_gigabyte_model_fits_one_node() {
        // Qwen2.5-0.5B q4_k_m-like: 24 layers, ~490 MB, kv_dim 128.
        let mut m = ModelCosts::synthetic(360_000_000, 24, 128);
        m.entry_bytes = 70_000_000;
        m.exit_bytes = 60_000_000;
        let p = plan(&m, &req("2.4GB")).unwrap();
        assert_eq!((p.nodes_needed, p.nodes_per_chain), (Some(1), 1));
        assert_eq!(p.nodes[0].role, Role::Full);
    }

    #[test]
    fn refuses_what_does_not_fit_and_pages_when_asked() {
        let m = ModelCosts::synthetic(7_000_000_000, 32, SYNTHETIC_KV_DIM);
        let mut r = req("2.4GB");
        r.nodes = Some(2);
        let e = plan(&m, &r).unwrap_err().to_string();
        assert!(
            e.contains("does not fit") && e.contains("short") && e.contains("4 nodes would fit"),
            "{e}"
        );
        r.disk_paged = true;
        let p = plan(&m, &r).unwrap();
        assert_eq!(p.nodes_per_chain, 2);
        assert!(p.disk_bytes_per_token > 0);
        let expect: u64 = p.nodes.iter().map(|n| n.bytes - n.usable).sum();
        assert_eq!(p.disk_bytes_per_token, expect);
    }

    #[test]
    fn a_layer_bigger_than_a_node_is_named() {
        let m = ModelCosts::synthetic(70_000_000_000, 32, SYNTHETIC_KV_DIM);
        let e = plan(&m, &req("2.4GB")).unwrap_err().to_string();
        assert!(e.contains("layer 0 alone needs"), "{e}");
    }

    #[test]
    fn named_nodes_and_replicas_make_manifests_with_successors() {
        let m = ModelCosts::synthetic(3_000_000_000, 30, SYNTHETIC_KV_DIM);
        let r = PlanRequest {
            node_ram: None,
            budget: Budget::Free,
            nodes: None,
            node_list: vec![
                NodeSpec {
                    name: "a".into(),
                    ram: 2_400_000_000,
                },
                NodeSpec {
                    name: "b".into(),
                    ram: 1_600_000_000,
                },
            ],
            replicas: 2,
            disk_paged: false,
            kv_tokens: 256,
        };
        let p = plan(&m, &r).unwrap();
        assert_eq!(p.nodes.len(), 4);
        assert!(
            p.nodes[0].layers.len() > p.nodes[1].layers.len(),
            "the bigger node holds more"
        );
        let ms = manifests(&p, "127.0.0.1", 7700, &|r| {
            format!("s{}-{}.knot", r.start, r.end)
        });
        assert_eq!(
            ms[0].successor.as_ref().unwrap().url,
            "http://127.0.0.1:7701"
        );
        assert!(ms[1].successor.is_none(), "exit of chain 0");
        assert_eq!(ms[2].node_id, "r1-a");
        assert_eq!(ms[2].successor.as_ref().unwrap().node_id, "r1-b");
        // Too little RAM in all: refused, naming the leftover layers.
        let small = PlanRequest {
            node_list: vec![NodeSpec {
                name: "a".into(),
                ram: 1_000_000_000,
            }],
            replicas: 1,
            ..r
        };
        let e = plan(&m, &small).unwrap_err().to_string();
        assert!(e.contains("left over"), "{e}");
    }
}
