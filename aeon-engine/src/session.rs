//! Per-session state: the KV cache of the held layers and reusable scratch buffers.

use half::f16;

use super::deltanet::DeltaState;
use super::shortconv::{Checkpoints, ConvState};
use super::ssm::SsmState;
use super::{Config, Holdings};

/// How a session stores keys and values: `f32` (default; exact) or `f16` (llama.cpp's
/// default: half the memory per position, keys and values rounded to half precision as they
/// are stored). Within one setting every determinism property holds (threads, chunking,
/// prefill == token by token, a split chain == one process): a token attends to its own
/// key and value as stored, whether it came alone or in a batch. The two settings differ
/// by that rounding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvDtype {
    #[default]
    F32,
    F16,
}

impl KvDtype {
    /// Bytes per stored element.
    pub fn size(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }

    /// `f32` or `f16`.
    pub fn parse(s: &str) -> Option<KvDtype> {
        match s {
            "f32" => Some(KvDtype::F32),
            "f16" => Some(KvDtype::F16),
            _ => None,
        }
    }
}

/// One block's keys (or values): (positions, kv_dim) in the session's [`KvDtype`].
pub enum KvRows {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvRows {
    fn new(dtype: KvDtype) -> KvRows {
        match dtype {
            KvDtype::F32 => KvRows::F32(Vec::new()),
            KvDtype::F16 => KvRows::F16(Vec::new()),
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::F16(v) => v.len(),
        }
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends f32 rows, rounded to the storage type.
    pub fn extend(&mut self, rows: &[f32]) {
        match self {
            KvRows::F32(v) => v.extend_from_slice(rows),
            KvRows::F16(v) => v.extend(rows.iter().map(|&x| f16::from_f32(x))),
        }
    }

    /// Keeps the first `n` elements.
    pub fn truncate(&mut self, n: usize) {
        match self {
            KvRows::F32(v) => v.truncate(n),
            KvRows::F16(v) => v.truncate(n),
        }
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        match self {
            KvRows::F32(v) => v.capacity() * 4,
            KvRows::F16(v) => v.capacity() * 2,
        }
    }
}

/// A recurrent block's per-session state: one kind per block, whichever its mixer is.
pub enum RecurrentState {
    /// A gated short convolution (LFM2).
    Conv(ConvState),
    /// A state-space layer (mamba, mamba2, granitehybrid).
    Ssm(SsmState),
    /// A Gated DeltaNet (Qwen3.5).
    Delta(DeltaState),
}

impl RecurrentState {
    /// Positions processed.
    pub fn len(&self) -> usize {
        match self {
            RecurrentState::Conv(s) => s.len(),
            RecurrentState::Ssm(s) => s.len(),
            RecurrentState::Delta(s) => s.len(),
        }
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held: the live state and its checkpoints.
    pub fn bytes(&self) -> usize {
        match self {
            RecurrentState::Conv(s) => s.bytes(),
            RecurrentState::Ssm(s) => s.bytes(),
            RecurrentState::Delta(s) => s.bytes(),
        }
    }

    /// The latest position `<= p` the state can be cut back to without recomputing.
    pub fn restorable(&self, p: usize) -> usize {
        match self {
            RecurrentState::Conv(s) => s.restorable(p),
            RecurrentState::Ssm(s) => s.restorable(p),
            RecurrentState::Delta(s) => s.restorable(p),
        }
    }

    /// Cuts the state back to [`RecurrentState::restorable`]`(p)`.
    pub fn truncate(&mut self, p: usize) {
        match self {
            RecurrentState::Conv(s) => s.truncate(p),
            RecurrentState::Ssm(s) => s.truncate(p),
            RecurrentState::Delta(s) => s.truncate(p),
        }
    }

    /// Floats of the live state (what a shipped checkpoint carries per block).
    pub(crate) fn live_floats(&self) -> usize {
        match self {
            RecurrentState::Conv(s) => s.live_floats(),
            RecurrentState::Ssm(s) => s.live_floats(),
            RecurrentState::Delta(s) => s.live_floats(),
        }
    }

    /// The live state at [`RecurrentState::len`].
    pub(crate) fn live(&self) -> Vec<f32> {
        match self {
            RecurrentState::Conv(s) => s.live(),
            RecurrentState::Ssm(s) => s.live(),
            RecurrentState::Delta(s) => s.live(),
        }
    }

    /// Takes a shipped live state at `pos` ([`RecurrentState::live_floats`] floats).
    pub(crate) fn set_live(&mut self, pos: usize, state: &[f32]) {
        match self {
            RecurrentState::Conv(s) => s.set_live(pos, state),
            RecurrentState::Ssm(s) => s.set_live(pos, state),
            RecurrentState::Delta(s) => s.set_live(pos, state),
        }
    }
}

/// Keys and values of one block, one row of `kv_dim` per position; or, for a recurrent
/// block, its state (and no keys or values).
pub struct LayerCache {
    /// (positions, kv_dim)
    pub k: KvRows,
    /// (positions, kv_dim)
    pub v: KvRows,
    /// A recurrent block's state (none for attention).
    pub state: Option<RecurrentState>,
}

impl LayerCache {
    /// An empty cache storing `dtype`.
    pub fn new(dtype: KvDtype) -> LayerCache {
        LayerCache {
            k: KvRows::new(dtype),
            v: KvRows::new(dtype),
            state: None,
        }
    }

    /// Positions this block has seen.
    pub fn positions(&self, kv_dim: usize) -> usize {
        match &self.state {
            Some(s) => s.len(),
            None => self.k.len() / kv_dim.max(1),
        }
    }

    /// Bytes held: keys and values, or the recurrent state with its checkpoints.
    pub fn bytes(&self) -> usize {
        self.k.bytes() + self.v.bytes() + self.state.as_ref().map_or(0, RecurrentState::bytes)
    }

    /// Whether the block carries a recurrent state (and no keys or values).
    pub fn is_recurrent(&self) -> bool {
        self.state.is_some()
    }

    /// The latest position `<= p` the block's recurrent state can be cut back to (`p` for
    /// attention).
    pub fn restorable(&self, p: usize) -> usize {
        self.state.as_ref().map_or(p, |s| s.restorable(p))
    }
}

/// Scratch a session keeps between calls: enough for decode steps and short chunks. A larger
/// forward (a long prefill) allocates its scratch for that call only, so a session is not left
/// holding its peak (a 4096-row forward of a 0.5B model needs about 230 MB).
pub const SCRATCH_KEEP_BYTES: usize = 8 << 20;

/// Activations for a chunk of `seq` tokens; grown on demand, reused across calls up to
/// [`SCRATCH_KEEP_BYTES`].
#[derive(Default)]
pub struct Scratch {
    /// (seq, hidden) normed input of the current sub-block
    pub xb: Vec<f32>,
    /// (seq, hidden) output of a projection added back into the residual
    pub xb2: Vec<f32>,
    /// (seq, q_dim)
    pub q: Vec<f32>,
    /// (seq, kv_dim)
    pub k: Vec<f32>,
    /// (seq, kv_dim)
    pub v: Vec<f32>,
    /// (seq, q_dim) attention output, all heads
    pub att: Vec<f32>,
    /// (seq, ffn) gate, then silu(gate) * up
    pub hb: Vec<f32>,
    /// (seq, ffn) up
    pub hb2: Vec<f32>,
    /// (seq, 4 * hidden) a short convolution's `b, c, x`, then its gated output (empty
    /// without recurrent layers)
    pub bcx: Vec<f32>,
    /// A Gated DeltaNet's projections, convolution and outputs (empty without one)
    pub dn: Vec<f32>,
    /// MLA (deepseek2; empty otherwise): (seq, kv_lora_rank + rope) the latent rows,
    /// (seq, kv_lora_rank) the normed latent, (seq, n_heads * (nope + v_head)) the
    /// decompressed keys and values, (seq, q_lora_rank) q's low-rank input.
    pub mla_latent: Vec<f32>,
    pub mla_c: Vec<f32>,
    pub mla_kvb: Vec<f32>,
    pub mla_qa: Vec<f32>,
}

impl Scratch {
    pub(crate) fn fit(&mut self, cfg: &Config, seq: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.xb, seq * cfg.hidden);
        fit(&mut self.xb2, seq * cfg.hidden);
        fit(&mut self.q, seq * cfg.q_dim());
        fit(&mut self.k, seq * cfg.kv_dim());
        fit(&mut self.v, seq * cfg.v_dim());
        let att = cfg.mla.as_ref().map_or(0, |m| m.n_heads * m.v_head);
        fit(&mut self.att, seq * cfg.q_dim().max(att));
        // A mixture-of-experts block keeps its own buffers (crate::moe); deepseek2's leading
        // dense blocks and llama4's interleaved ones need the dense width.
        let ffn = match &cfg.moe {
            Some(m) if m.leading_dense == 0 && m.interleave <= 1 => 0,
            _ => cfg.ffn,
        };
        fit(&mut self.hb, seq * ffn);
        fit(&mut self.hb2, seq * ffn);
        // Only LFM2's short convolutions use it (a DeltaNet and a state-space layer keep
        // their own buffers).
        if cfg.conv_kernel > 0 && cfg.delta_net.is_none() && cfg.ssm.is_none() {
            fit(&mut self.bcx, seq * 4 * cfg.hidden);
        }
        // A DeltaNet's buffers; gated attention's query-and-gate rows, then the gate alone.
        let dn = cfg
            .delta_net
            .as_ref()
            .map_or(0, |d| DeltaState::scratch_len(d, seq));
        let gated = if cfg.recipe.attn_output_gate {
            seq * 3 * cfg.q_dim()
        } else {
            0
        };
        if dn.max(gated) > 0 {
            fit(&mut self.dn, dn.max(gated));
        }
        if let Some(m) = &cfg.mla {
            fit(&mut self.mla_latent, seq * m.latent());
            fit(&mut self.mla_c, seq * m.kv_lora_rank);
            fit(&mut self.mla_kvb, seq * m.kv_b_rows());
            fit(&mut self.mla_qa, seq * m.q_lora_rank);
        }
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        [
            &self.xb,
            &self.xb2,
            &self.q,
            &self.k,
            &self.v,
            &self.att,
            &self.hb,
            &self.hb2,
            &self.bcx,
            &self.dn,
            &self.mla_latent,
            &self.mla_c,
            &self.mla_kvb,
            &self.mla_qa,
        ]
        .iter()
        .map(|v| v.capacity() * 4)
        .sum()
    }
}

/// One conversation's state on one station: the KV cache of every held block.
///
/// Each block keeps its own length, so a chain that runs blocks 0..12 and 12..24 in two
/// requests advances both halves correctly; a forward over `a..b` starts at block `a`'s length.
pub struct Session {
    /// Original index of `caches[0]`.
    first_layer: usize,
    /// One per held block.
    pub(crate) caches: Vec<LayerCache>,
    /// Most positions this session may hold.
    max_positions: usize,
    pub(crate) scratch: Scratch,
}

impl Session {
    /// An empty session over the held blocks, bounded to `max_positions`, storing keys and
    /// values as `dtype`.
    pub fn new(holdings: &Holdings, max_positions: usize, dtype: KvDtype) -> Self {
        let n = holdings.layers.len() as usize;
        Session {
            first_layer: holdings.layers.start as usize,
            caches: (0..n).map(|_| LayerCache::new(dtype)).collect(),
            max_positions,
            scratch: Scratch::default(),
        }
    }

    /// Gives the recurrent blocks among the held ones (`cfg.recurrent_layers`) their state,
    /// keeping earlier states as `policy` says.
    pub fn with_recurrent(mut self, cfg: &Config, policy: Checkpoints) -> Self {
        for (i, c) in self.caches.iter_mut().enumerate() {
            if cfg.is_recurrent(self.first_layer + i) {
                c.state = Some(match (cfg.ssm, &cfg.delta_net) {
                    (Some(s), _) => RecurrentState::Ssm(SsmState::new(s, cfg.norm_eps, policy)),
                    (None, Some(d)) => {
                        RecurrentState::Delta(DeltaState::new(d, cfg.conv_kernel, policy))
                    }
                    (None, None) => {
                        RecurrentState::Conv(ConvState::new(cfg.hidden, cfg.conv_kernel, policy))
                    }
                });
            }
        }
        self
    }

    /// Original index of the first held block.
    pub fn first_layer(&self) -> usize {
        self.first_layer
    }

    /// The cache of original block `layer`, if this session covers it.
    pub fn cache(&self, layer: usize) -> Option<&LayerCache> {
        layer
            .checked_sub(self.first_layer)
            .and_then(|i| self.caches.get(i))
    }

    pub(crate) fn cache_mut(&mut self, layer: usize) -> Option<&mut LayerCache> {
        layer
            .checked_sub(self.first_layer)
            .and_then(|i| self.caches.get_mut(i))
    }

    /// Positions block `layer` has seen (its cache length), if covered.
    pub fn positions(&self, layer: usize, kv_dim: usize) -> Option<usize> {
        self.cache(layer).map(|c| c.positions(kv_dim))
    }

    /// Most positions this session may hold.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Bytes held by the KV cache and the recurrent states (with their checkpoints).
    pub fn kv_bytes(&self) -> usize {
        self.caches.iter().map(LayerCache::bytes).sum()
    }

    /// The scratch buffers kept between calls.
    pub fn scratch(&self) -> &Scratch {
        &self.scratch
    }

    /// Bytes held by the scratch buffers (at most [`SCRATCH_KEEP_BYTES`] between calls).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// The latest position `<= pos` every block can be cut back to without recomputing:
    /// `pos` for a transformer; for a hybrid, where its recurrent states' checkpoints allow
    /// (see [`Checkpoints`]).
    pub fn restorable(&self, pos: usize) -> usize {
        let mut p = pos;
        // Each state's answer is <= what it was asked; repeat until all agree.
        loop {
            let q = self
                .caches
                .iter()
                .filter(|c| c.is_recurrent())
                .map(|c| c.restorable(p))
                .min()
                .unwrap_or(p);
            if q == p {
                return p;
            }
            p = q;
        }
    }

    /// Forgets positions from `pos` on in every block (rewind for a retried or edited turn,
    /// rejected drafts, a new turn sharing a prefix). Returns the positions the session holds
    /// now: `pos`, or less when a recurrent state can only go back to an earlier checkpoint
    /// ([`Session::restorable`]); the caller then feeds the tokens from there again.
    pub fn truncate(&mut self, pos: usize, kv_dim: usize) -> usize {
        let pos = self.restorable(pos);
        for c in &mut self.caches {
            // A value row may be narrower than a key row (MLA): cut at the same position.
            let held = c.positions(kv_dim);
            let v_row = c.v.len().checked_div(held).unwrap_or(kv_dim);
            c.k.truncate(pos * kv_dim);
            c.v.truncate(pos * v_row);
            if let Some(s) = &mut c.state {
                s.truncate(pos);
            }
        }
        pos
    }
}
