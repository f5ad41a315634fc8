//! Per-session state: the KV cache of the held layers and reusable scratch buffers.

use super::{Config, Holdings};

/// Keys and values of one block, one row of `kv_dim` per position.
#[derive(Default)]
pub struct LayerCache {
    /// (positions, kv_dim)
    pub k: Vec<f32>,
    /// (positions, kv_dim)
    pub v: Vec<f32>,
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
}

impl Scratch {
    pub(crate) fn fit(&mut self, cfg: &Config, seq: usize) {
        let fit = |v: &mut Vec<f32>, n: usize| v.resize(n, 0.0);
        fit(&mut self.xb, seq * cfg.hidden);
        fit(&mut self.xb2, seq * cfg.hidden);
        fit(&mut self.q, seq * cfg.q_dim());
        fit(&mut self.k, seq * cfg.kv_dim());
        fit(&mut self.v, seq * cfg.kv_dim());
        fit(&mut self.att, seq * cfg.q_dim());
        fit(&mut self.hb, seq * cfg.ffn);
        fit(&mut self.hb2, seq * cfg.ffn);
    }

    /// Bytes allocated.
    pub fn bytes(&self) -> usize {
        [
            &self.xb, &self.xb2, &self.q, &self.k, &self.v, &self.att, &self.hb, &self.hb2,
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
    /// An empty session over the held blocks, bounded to `max_positions`.
    pub fn new(holdings: &Holdings, max_positions: usize) -> Self {
        let n = holdings.layers.len() as usize;
        Session {
            first_layer: holdings.layers.start as usize,
            caches: (0..n).map(|_| LayerCache::default()).collect(),
            max_positions,
            scratch: Scratch::default(),
        }
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
        self.cache(layer).map(|c| c.k.len() / kv_dim.max(1))
    }

    /// Most positions this session may hold.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Bytes held by the KV cache.
    pub fn kv_bytes(&self) -> usize {
        self.caches
            .iter()
            .map(|c| (c.k.capacity() + c.v.capacity()) * 4)
            .sum()
    }

    /// Bytes held by the scratch buffers (at most [`SCRATCH_KEEP_BYTES`] between calls).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// Forgets positions from `pos` on in every block (rewind for a retried or edited turn).
    pub fn truncate(&mut self, pos: usize, kv_dim: usize) {
        for c in &mut self.caches {
            c.k.truncate(pos * kv_dim);
            c.v.truncate(pos * kv_dim);
        }
    }
}
