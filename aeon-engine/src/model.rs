//! The forward pass: embedding, transformer blocks over a layer range, LM head.

use std::cell::RefCell;

use super::kernels::{dequantize_row, linear, linears};
use super::ops::{
    add_inplace, attention, geglu_tanh, gelu_tanh, layernorm, rms_scale_inplace, rmsnorm,
    rmsnorm_inplace, rope_angles, rope_inv_freq, rope_rotate, rope_scale_freqs, softcap, swiglu,
    AttnShape,
};
use super::weights::{AttnWeights, Mixer};
use super::{
    Activation, Checkpoints, Config, EngineError, Ffn, Holdings, KvDtype, KvRows, RecurrentState,
    Session, Weights,
};
use knot_format::{Knot, LayerRange, Role};

/// A loaded model (or a station's slice of one) over a mmapped KNOT.
pub struct Model<'a> {
    pub cfg: Config,
    pub weights: Weights<'a>,
    knot: &'a Knot,
    /// (head_dim / 2) RoPE inverse frequencies, computed once (see [`rope_inv_freq`]).
    inv_freq: Vec<f64>,
    /// (head_dim / 2) the same for local (sliding-window) layers, from `rope_base_swa`.
    inv_freq_swa: Vec<f64>,
    /// How new sessions store keys and values (`--kv-dtype`).
    kv_dtype: KvDtype,
    /// Which earlier states new sessions keep for their recurrent layers.
    checkpoints: Checkpoints,
}

/// Forward-pass scratch that is not per session: reused by every call on this thread.
#[derive(Default)]
struct FwdScratch {
    /// (seq, head_dim) RoPE cosines then sines of each row's position
    rope: Vec<f32>,
    /// (seq, head_dim) the same at the local layers' RoPE base (sliding-window models)
    rope_swa: Vec<f32>,
    /// (positions) attention scores of one head when attention runs on this thread
    scores: Vec<f32>,
    /// (rows, hidden) the normed last rows for the output head
    xn: Vec<f32>,
}

thread_local! {
    static FWD: RefCell<FwdScratch> = RefCell::new(FwdScratch::default());
}

impl<'a> Model<'a> {
    /// Resolves the tensors `holdings` needs; with `None`, what the file holds (a shard's
    /// role and range, or the whole model). Reads no weight bytes: the mmap pages on demand.
    pub fn load(knot: &'a Knot, holdings: Option<Holdings>) -> Result<Self, EngineError> {
        let cfg = Config::try_from(knot.arch())?;
        let held = file_holdings(knot, &cfg);
        let holdings = holdings.unwrap_or(held);
        if holdings.layers.end as usize > cfg.n_layers
            || holdings.layers.start > holdings.layers.end
        {
            return Err(EngineError::BadRange {
                requested: holdings.layers,
                held: held.layers,
            });
        }
        if !held.layers.contains_range(&holdings.layers) && !holdings.layers.is_empty() {
            return Err(EngineError::NotHeld {
                what: format!("layers {}", holdings.layers),
                held: held.layers,
            });
        }
        if (holdings.embed && !held.embed) || (holdings.head && !held.head) {
            return Err(EngineError::NotHeld {
                what: if holdings.embed && !held.embed {
                    "the token embedding"
                } else {
                    "the output head"
                }
                .into(),
                held: held.layers,
            });
        }
        let weights = Weights::load(knot, &cfg, holdings)?;
        let (inv_freq, inv_freq_swa) = rope_tables(knot, &cfg, None)?;
        Ok(Model {
            cfg,
            weights,
            knot,
            inv_freq,
            inv_freq_swa,
            kv_dtype: KvDtype::default(),
            checkpoints: Checkpoints::default(),
        })
    }

    /// Sets the context (most positions a session holds) the RoPE tables are made for: a
    /// Phi-3 LongRoPE file then rotates with its long factors beyond its original context,
    /// as llama.cpp does for an `n_ctx` above it; other files are unchanged. Without it, the
    /// short factors.
    pub fn with_context(mut self, context: usize) -> Result<Self, EngineError> {
        (self.inv_freq, self.inv_freq_swa) = rope_tables(self.knot, &self.cfg, Some(context))?;
        Ok(self)
    }

    /// The file this model reads.
    pub fn knot(&self) -> &'a Knot {
        self.knot
    }

    /// What this model serves.
    pub fn holdings(&self) -> Holdings {
        self.weights.holdings
    }

    /// Builds the kernels' interleaved weight copies now instead of on first use (a station
    /// does it in the background once it is ready, so the first token does not pay for it).
    pub fn prepare(&self) {
        let k = super::kernels::kernels();
        self.matrices().for_each(|w| {
            w.interleaved(k);
        });
    }

    /// Bytes [`Model::prepare`] would copy into interleaved (anonymous) memory with this
    /// process's kernels; the held weights' mapped pages are released as they are copied.
    pub fn packable_bytes(&self) -> usize {
        let k = super::kernels::kernels();
        self.matrices().map(|w| w.packable_bytes(k)).sum()
    }

    /// Keep every matrix in the mapped file (no interleaved copies; see
    /// [`super::kernels::Linear::keep_in_file`]): for a node whose memory is below its
    /// weights, which then pages them from storage instead of being killed. Call before the
    /// first forward pass or [`Model::prepare`].
    pub fn keep_weights_in_file(&self) {
        self.matrices().for_each(|w| w.keep_in_file());
    }

    /// Pins weight matrices in memory, in forward order, each that still fits in what is left
    /// of `budget` bytes (see [`knot_format::Knot::lock`]): with the weights kept in the file, each token then
    /// re-reads only the matrices left unpinned, instead of nearly all of them (the page
    /// cache's LRU against a cyclic scan larger than it). Returns the bytes pinned; stops at
    /// the first refusal (no privilege, memlock limit).
    pub fn lock_weights(&self, budget: u64) -> u64 {
        let mut locked = 0u64;
        for w in self.matrices() {
            let len = w.q.data.len() as u64;
            if locked + len > budget {
                continue;
            }
            if let Err(e) = self.knot.lock(w.q.data) {
                tracing::warn!("pinning weights in memory: {e}; the rest stay pageable");
                break;
            }
            locked += len;
        }
        locked
    }

    /// The matrices of the held blocks and the head.
    fn matrices(&self) -> impl Iterator<Item = &super::kernels::Linear<'a>> {
        self.weights
            .layers
            .iter()
            .flat_map(|l| l.matrices())
            .chain(self.weights.output.as_ref())
    }

    /// A fresh session over the held blocks, storing keys and values as
    /// [`Model::kv_dtype`].
    pub fn new_session(&self, max_positions: usize) -> Session {
        Session::new(&self.weights.holdings, max_positions, self.kv_dtype)
            .with_recurrent(&self.cfg, self.checkpoints)
    }

    /// Sets which earlier states new sessions keep for recurrent layers.
    pub fn with_checkpoints(mut self, policy: Checkpoints) -> Self {
        self.checkpoints = policy;
        self
    }

    /// Which earlier states new sessions keep for recurrent layers.
    pub fn checkpoints(&self) -> Checkpoints {
        self.checkpoints
    }

    /// How new sessions store keys and values.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// deepseek2: whether sessions cache MLA's latent rows (kv_lora_rank + rope floats per
    /// position, the absorbed form) instead of per-head keys and values (llama.cpp's layout
    /// for `attn_kv_b` files, the default). Set before making sessions: a session holds one
    /// layout. A file with split `attn_k_b` / `attn_v_b` always caches the latent (as
    /// llama.cpp does); other architectures ignore it.
    pub fn with_mla_latent_cache(mut self, on: bool) -> Self {
        if let Some(m) = &mut self.cfg.mla {
            m.latent_cache = on || m.split_kv_b;
        }
        self
    }

    /// Bytes a session's cache grows by per position over the held blocks: each attention
    /// block's key and value rows as stored ([`Config::kv_dim`] + [`Config::v_dim`] elements
    /// of [`Model::kv_dtype`]); recurrent blocks keep a constant state instead.
    pub fn kv_bytes_per_position(&self) -> usize {
        let h = self.weights.holdings.layers;
        let attn = (h.start as usize..h.end as usize)
            .filter(|&l| !self.cfg.is_recurrent(l))
            .count();
        attn * (self.cfg.kv_dim() + self.cfg.v_dim()) * self.kv_dtype.size()
    }

    /// Sets how new sessions store keys and values (f32 unless set).
    pub fn with_kv_dtype(mut self, dtype: KvDtype) -> Self {
        self.kv_dtype = dtype;
        self
    }

    /// Token ids -> residual rows `(tokens.len(), hidden)`, scaled by `embed_scale` (gemma).
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let emb = self.weights.embed.as_ref().ok_or(EngineError::NotHeld {
            what: "the token embedding".into(),
            held: self.weights.holdings.layers,
        })?;
        let h = self.cfg.hidden;
        let mut x = vec![0.0f32; tokens.len() * h];
        for (row, &t) in x.chunks_exact_mut(h).zip(tokens) {
            if t as usize >= self.cfg.vocab {
                return Err(EngineError::BadToken {
                    id: t,
                    vocab: self.cfg.vocab,
                });
            }
            dequantize_row(emb.dtype, emb.row(t as usize), row);
            if self.cfg.embed_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= self.cfg.embed_scale);
            }
        }
        Ok(x)
    }

    /// Runs blocks `range` over residual rows `x` (seq, hidden) in place, appending their
    /// keys and values to `session`. Returns the position of the first row.
    pub fn forward(
        &self,
        session: &mut Session,
        x: &mut [f32],
        range: LayerRange,
    ) -> Result<usize, EngineError> {
        let cfg = &self.cfg;
        let held = self.weights.holdings.layers;
        if range.is_empty() || !held.contains_range(&range) {
            return Err(EngineError::NotHeld {
                what: format!("layers {range}"),
                held,
            });
        }
        if x.is_empty() || !x.len().is_multiple_of(cfg.hidden) {
            return Err(EngineError::BadResidual {
                len: x.len(),
                hidden: cfg.hidden,
            });
        }
        let seq = x.len() / cfg.hidden;
        let kv_dim = cfg.kv_dim();
        let pos = session
            .positions(range.start as usize, kv_dim)
            .ok_or(EngineError::NotHeld {
                what: format!("layers {range} in this session"),
                held,
            })?;
        for l in range.start..range.end {
            if session.positions(l as usize, kv_dim) != Some(pos) {
                return Err(EngineError::SessionMismatch(format!(
                    "block {l} is at position {:?}, block {} at {pos}",
                    session.positions(l as usize, kv_dim),
                    range.start
                )));
            }
        }
        for l in range.start as usize..range.end as usize {
            let has_state = session.cache(l).is_some_and(|c| c.is_recurrent());
            if has_state != cfg.is_recurrent(l) {
                return Err(EngineError::SessionMismatch(format!(
                    "block {l} is {} but the session {} a recurrent state for it",
                    if cfg.is_recurrent(l) {
                        "recurrent"
                    } else {
                        "attention"
                    },
                    if has_state { "holds" } else { "has no" },
                )));
            }
        }
        if pos + seq > session.max_positions() {
            return Err(EngineError::ContextFull {
                have: pos,
                adding: seq,
                max: session.max_positions(),
            });
        }
        let mut scratch = std::mem::take(&mut session.scratch);
        scratch.fit(cfg, seq);
        // Taken, not borrowed, so a nested call on this thread (never expected) still works.
        let mut fwd = FWD.with(|f| std::mem::take(&mut *f.borrow_mut()));
        // RoPE angles of every row, once for all blocks and heads (none for a pure
        // state-space model, whose head_dim is 0).
        let hd = cfg.rope_dim.max(1);
        fwd.rope.resize(seq * cfg.rope_dim, 0.0);
        for (t, cs) in fwd.rope.chunks_exact_mut(hd).enumerate() {
            rope_angles(cs, &self.inv_freq, pos + t);
        }
        let mscale = cfg.rope_attn_factor;
        if mscale != 1.0 {
            fwd.rope.iter_mut().for_each(|c| *c *= mscale);
        }
        if (range.start..range.end).any(|l| cfg.is_local(l as usize)) {
            fwd.rope_swa.resize(seq * cfg.rope_dim, 0.0);
            for (t, cs) in fwd.rope_swa.chunks_exact_mut(hd).enumerate() {
                rope_angles(cs, &self.inv_freq_swa, pos + t);
            }
            if mscale != 1.0 {
                fwd.rope_swa.iter_mut().for_each(|c| *c *= mscale);
            }
        }
        let mut result = Ok(pos);
        for l in range.start..range.end {
            let (Some(w), Some(cache)) = (
                self.weights.layer(l as usize),
                session.cache_mut(l as usize),
            ) else {
                result = Err(EngineError::NotHeld {
                    what: format!("block {l}"),
                    held,
                });
                break;
            };
            self.block(l as usize, w, cache, &mut scratch, &mut fwd, x, seq, pos);
        }
        FWD.with(|f| *f.borrow_mut() = fwd);
        if scratch.bytes() <= super::session::SCRATCH_KEEP_BYTES {
            session.scratch = scratch;
        }
        result
    }

    /// Transformer block `layer` over `seq` rows starting at position `pos`.
    #[allow(clippy::too_many_arguments)]
    fn block(
        &self,
        layer: usize,
        w: &super::LayerWeights<'_>,
        cache: &mut super::session::LayerCache,
        s: &mut super::session::Scratch,
        f: &mut FwdScratch,
        x: &mut [f32],
        seq: usize,
        pos: usize,
    ) {
        let cfg = &self.cfg;
        let h = cfg.hidden;
        for (o, xi) in s.xb.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
            self.norm(o, xi, w.attn_norm, w.attn_norm_b);
        }
        // The mixer reads the normed rows in `s.xb` and leaves its output in `s.xb2`.
        match &w.mixer {
            Mixer::Attention(a) => self.attention(layer, a, cache, s, f, seq, pos),
            Mixer::Mla(a) => {
                let Some(shape) = &cfg.mla else {
                    unreachable!("MLA weights are loaded only with an MLA config");
                };
                a.forward(
                    shape,
                    cfg.norm_eps,
                    cfg.attn_scale,
                    &f.rope,
                    cache,
                    s,
                    seq,
                    pos,
                );
            }
            Mixer::ShortConv(c) => {
                let Some(RecurrentState::Conv(state)) = cache.state.as_mut() else {
                    unreachable!("forward checked that every recurrent block has its state");
                };
                let (bcx, y) = s.bcx.split_at_mut(seq * 3 * h);
                state.forward(c, &s.xb, seq, bcx, y, &mut s.xb2);
            }
            Mixer::Ssm(m) => {
                let Some(RecurrentState::Ssm(state)) = cache.state.as_mut() else {
                    unreachable!("forward checked that every recurrent block has its state");
                };
                state.forward(m, &s.xb[..seq * h], seq, &mut s.xb2[..seq * h]);
            }
            Mixer::DeltaNet(d) => {
                let Some(RecurrentState::Delta(state)) = cache.state.as_mut() else {
                    unreachable!("forward checked that every recurrent block has its state");
                };
                state.forward(d, &s.xb, seq, cfg.norm_eps, &mut s.dn, &mut s.xb2);
            }
        }

        post_norm(&mut s.xb2[..seq * h], w.post_attn_norm, h, cfg.norm_eps);
        residual_scale(&mut s.xb2[..seq * h], cfg.residual_scale);
        add_inplace(x, &s.xb2[..seq * h]);

        // FFN: gated (SwiGLU or GeGLU), gate and up sharing one quantization of the normed
        // input; or routed experts; or none (mamba).
        if matches!(w.ffn, Ffn::None) {
            return;
        }
        for (o, xi) in s.xb.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
            self.norm(o, xi, w.ffn_norm, w.ffn_norm_b);
        }
        match &w.ffn {
            Ffn::Dense { gate, up, down } => {
                linears(
                    &mut [(gate, &mut s.hb[..]), (up, &mut s.hb2[..])],
                    &s.xb,
                    seq,
                );
                let (g, u) = (&mut s.hb[..seq * cfg.ffn], &s.hb2[..seq * cfg.ffn]);
                match cfg.recipe.activation {
                    Activation::Silu => swiglu(g, u),
                    Activation::GeluTanh => geglu_tanh(g, u),
                }
                linear(down, &s.hb, seq, &mut s.xb2);
            }
            Ffn::Moe(m) => m.forward(&s.xb[..seq * h], seq, cfg.recipe.activation, &mut s.xb2),
            Ffn::Ungated {
                up,
                up_b,
                down,
                down_b,
            } => {
                linear(up, &s.xb, seq, &mut s.hb);
                for r in s.hb[..seq * cfg.ffn].chunks_exact_mut(cfg.ffn) {
                    if let Some(b) = up_b {
                        add_inplace(r, b);
                    }
                    gelu_tanh(r);
                }
                linear(down, &s.hb, seq, &mut s.xb2);
                add_bias(&mut s.xb2[..seq * h], *down_b);
            }
            Ffn::None => {}
        }
        post_norm(&mut s.xb2[..seq * h], w.post_ffn_norm, h, cfg.norm_eps);
        residual_scale(&mut s.xb2[..seq * h], cfg.residual_scale);
        add_inplace(x, &s.xb2[..seq * h]);
    }

    /// Self-attention of block `layer` over the normed rows in `s.xb`; output in `s.xb2`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: usize,
        w: &AttnWeights<'_>,
        cache: &mut super::session::LayerCache,
        s: &mut super::session::Scratch,
        f: &mut FwdScratch,
        seq: usize,
        pos: usize,
    ) {
        let cfg = &self.cfg;
        let (hd, q_dim, kv_dim, rd) = (cfg.head_dim, cfg.q_dim(), cfg.kv_dim(), cfg.rope_dim);
        // A local layer sees the last `window` positions (or its chunk's), rotated at its own
        // RoPE base.
        let (window, chunk) = (cfg.window(layer), cfg.chunk(layer));
        let rope = if window.is_some() || chunk.is_some() {
            &f.rope_swa
        } else {
            &f.rope
        };

        // Normed input -> q, k, v projections (+ biases), one shared quantization.
        let gated = cfg.recipe.attn_output_gate;
        let (qg, gate) = s.dn.split_at_mut(if gated { seq * 2 * q_dim } else { 0 });
        linears(
            &mut [
                (&w.wq, if gated { &mut *qg } else { &mut s.q[..] }),
                (&w.wk, &mut s.k[..]),
                (&w.wv, &mut s.v[..]),
            ],
            &s.xb,
            seq,
        );
        if gated {
            // Each head's query, then its gate (qwen35): split into q and the gates.
            for ((src, q), g) in qg
                .chunks_exact(2 * hd)
                .zip(s.q.chunks_exact_mut(hd))
                .zip(gate.chunks_exact_mut(hd))
            {
                q.copy_from_slice(&src[..hd]);
                g.copy_from_slice(&src[hd..]);
            }
        }
        for t in 0..seq {
            let (q, k, v) = (
                &mut s.q[t * q_dim..(t + 1) * q_dim],
                &mut s.k[t * kv_dim..(t + 1) * kv_dim],
                &mut s.v[t * kv_dim..(t + 1) * kv_dim],
            );
            if let (Some(bq), Some(bk), Some(bv)) = (w.bq, w.bk, w.bv) {
                add_inplace(q, bq);
                add_inplace(k, bk);
                add_inplace(v, bv);
            }
            // Per-head QK RMSNorm (qwen3, gemma3) comes before RoPE.
            if let (Some(qn), Some(kn)) = (w.q_norm, w.k_norm) {
                q.chunks_exact_mut(hd)
                    .for_each(|hq| rmsnorm_inplace(hq, qn, cfg.norm_eps));
                k.chunks_exact_mut(hd)
                    .for_each(|hk| rmsnorm_inplace(hk, kn, cfg.norm_eps));
            }
            if cfg.has_rope(layer) {
                let cs = &rope[t * rd..(t + 1) * rd];
                if rd == hd {
                    rope_rotate(q, cs, cfg.rope_style);
                    rope_rotate(k, cs, cfg.rope_style);
                } else {
                    // Partial RoPE (glm4, qwen35): the first `rd` dimensions of each head.
                    for head in q.chunks_exact_mut(hd).chain(k.chunks_exact_mut(hd)) {
                        rope_rotate(&mut head[..rd], cs, cfg.rope_style);
                    }
                }
                // llama4: q and k L2-normed after RoPE (llama.cpp's order).
                if cfg.kq_l2_norm {
                    q.chunks_exact_mut(hd)
                        .chain(k.chunks_exact_mut(hd))
                        .for_each(|h| rms_scale_inplace(h, cfg.norm_eps));
                }
            } else if cfg.nope_temperature.is_some() {
                let m = cfg.query_temperature(pos + t);
                q.iter_mut().for_each(|v| *v *= m);
            }
        }
        // Stored first, then read back: a row attends to its own key and value as stored
        // (rounded, with an f16 cache), alone or in a batch.
        cache.k.extend(&s.k[..seq * kv_dim]);
        cache.v.extend(&s.v[..seq * kv_dim]);

        // Causal GQA over the cache (serial at decode, parallel over heads for long prefill).
        let shape = AttnShape {
            seq,
            pos,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            head_dim: hd,
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap,
            window,
            chunk,
        };
        match (&cache.k, &cache.v) {
            (KvRows::F32(k), KvRows::F32(v)) => {
                attention(&mut s.att, &s.q, k, v, shape, &mut f.scores)
            }
            (KvRows::F16(k), KvRows::F16(v)) => {
                attention(&mut s.att, &s.q, k, v, shape, &mut f.scores)
            }
            _ => unreachable!("a session stores keys and values in one type"),
        }
        if gated {
            let g = &s.dn[seq * 2 * q_dim..seq * 3 * q_dim];
            for (a, &g) in s.att[..seq * q_dim].iter_mut().zip(g) {
                *a *= 1.0 / (1.0 + super::ops::exp(-g));
            }
        }
        linear(&w.wo, &s.att, seq, &mut s.xb2);
        add_bias(&mut s.xb2[..seq * cfg.hidden], w.bo);
    }

    /// The architecture's norm of one row: RMSNorm, or LayerNorm with its bias (starcoder2).
    fn norm(&self, out: &mut [f32], x: &[f32], w: &[f32], b: Option<&[f32]>) {
        match self.cfg.recipe.layer_norm {
            true => layernorm(out, x, w, b, self.cfg.norm_eps),
            false => rmsnorm(out, x, w, self.cfg.norm_eps),
        }
    }

    /// Final norm + output head on the LAST row of `x` (seq, hidden) -> logits (vocab).
    pub fn lm_head(&self, x: &[f32]) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::new();
        self.lm_head_into(x, &mut logits)?;
        Ok(logits)
    }

    /// [`Model::lm_head`] into `logits` (resized to vocab), so a decode loop that keeps the
    /// buffer allocates nothing per token.
    pub fn lm_head_into(&self, x: &[f32], logits: &mut Vec<f32>) -> Result<(), EngineError> {
        self.lm_head_rows_into(x, 1, logits)
    }

    /// Final norm + output head on the last `rows` rows of `x` (seq, hidden) -> logits
    /// (rows, vocab), row-major: what verifying `rows - 1` drafted tokens needs. Each row's
    /// logits are bit-identical to [`Model::lm_head`] on that row alone (the kernels'
    /// batching contract). `rows` must be in `1..=seq`.
    pub fn lm_head_rows(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, EngineError> {
        let mut logits = Vec::new();
        self.lm_head_rows_into(x, rows, &mut logits)?;
        Ok(logits)
    }

    fn lm_head_rows_into(
        &self,
        x: &[f32],
        rows: usize,
        logits: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let h = self.cfg.hidden;
        let (Some(norm), Some(out)) = (self.weights.output_norm, self.weights.output.as_ref())
        else {
            return Err(EngineError::NotHeld {
                what: "the output head".into(),
                held: self.weights.holdings.layers,
            });
        };
        if x.is_empty() || !x.len().is_multiple_of(h) {
            return Err(EngineError::BadResidual {
                len: x.len(),
                hidden: h,
            });
        }
        if rows == 0 || rows > x.len() / h {
            return Err(EngineError::BadRows {
                rows,
                seq: x.len() / h,
            });
        }
        let last = &x[x.len() - rows * h..];
        let mut f = FWD.with(|f| std::mem::take(&mut *f.borrow_mut()));
        f.xn.resize(rows * h, 0.0);
        for (o, xi) in f.xn.chunks_exact_mut(h).zip(last.chunks_exact(h)) {
            self.norm(o, xi, norm, self.weights.output_norm_b);
        }
        logits.resize(rows * self.cfg.vocab, 0.0);
        linear(out, &f.xn, rows, logits);
        if let Some(m) = self.cfg.logit_mul {
            logits.iter_mut().for_each(|l| *l *= m);
        }
        if let Some(cap) = self.cfg.final_logit_softcap {
            softcap(logits, cap);
        }
        FWD.with(|c| *c.borrow_mut() = f);
        Ok(())
    }

    /// The final hidden state of every row of `x` (seq, hidden): each row through the output
    /// norm, as the head sees it (what an embedding is pooled from; llama.cpp's embeddings are
    /// the same normed rows). Needs only the output norm of the head.
    pub fn final_hidden(&self, x: &[f32]) -> Result<Vec<f32>, EngineError> {
        let h = self.cfg.hidden;
        let Some(norm) = self.weights.output_norm else {
            return Err(EngineError::NotHeld {
                what: "the output norm".into(),
                held: self.weights.holdings.layers,
            });
        };
        if x.is_empty() || !x.len().is_multiple_of(h) {
            return Err(EngineError::BadResidual {
                len: x.len(),
                hidden: h,
            });
        }
        let mut out = vec![0.0; x.len()];
        for (o, xi) in out.chunks_exact_mut(h).zip(x.chunks_exact(h)) {
            self.norm(o, xi, norm, self.weights.output_norm_b);
        }
        Ok(out)
    }

    /// Tokens -> logits of the last position, through every held block, in one session.
    /// Needs the whole model (embedding, all blocks, head).
    pub fn logits(&self, session: &mut Session, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut x = self.embed(tokens)?;
        self.forward(session, &mut x, self.weights.holdings.layers)?;
        self.lm_head(&x)
    }
}

/// RMSNorm of each `h`-wide row of a sub-block's output, when the architecture has a
/// post-norm there (gemma3's `post_attention_norm`, `post_ffw_norm`).
fn post_norm(rows: &mut [f32], norm: Option<&[f32]>, h: usize, eps: f32) {
    if let Some(w) = norm {
        rows.chunks_exact_mut(h)
            .for_each(|r| rmsnorm_inplace(r, w, eps));
    }
}

/// Adds a projection's bias to each of its rows, when the file has one.
fn add_bias(rows: &mut [f32], bias: Option<&[f32]>) {
    if let Some(b) = bias {
        rows.chunks_exact_mut(b.len())
            .for_each(|r| add_inplace(r, b));
    }
}

/// A sub-block's output times the residual multiplier, when the architecture has one
/// (granite's `residual_scale`).
fn residual_scale(rows: &mut [f32], scale: Option<f32>) {
    if let Some(m) = scale {
        rows.iter_mut().for_each(|v| *v *= m);
    }
}

/// RoPE's inverse frequencies of global and local layers for a session context of `context`
/// positions (`None`: unknown, LongRoPE's short factors).
fn rope_tables(
    knot: &Knot,
    cfg: &Config,
    context: Option<usize>,
) -> Result<(Vec<f64>, Vec<f64>), EngineError> {
    let mut inv_freq = rope_inv_freq(cfg.rope_dim, cfg.rope_base);
    let mut inv_freq_swa = rope_inv_freq(cfg.rope_dim, cfg.rope_base_swa);
    // Frequency factors (llama3, Phi-3 LongRoPE) divide each frequency, as llama.cpp's
    // `theta / ff` does, on every layer.
    if let Some(f) = super::weights::rope_factors(knot, cfg, context)? {
        for inv in [&mut inv_freq, &mut inv_freq_swa] {
            inv.iter_mut().zip(f).for_each(|(i, &d)| *i /= d as f64);
        }
    }
    if cfg.rope_scale != super::RopeScale::NONE {
        rope_scale_freqs(&mut inv_freq, cfg.rope_base, cfg.rope_scale);
        rope_scale_freqs(&mut inv_freq_swa, cfg.rope_base_swa, cfg.rope_scale);
    }
    Ok((inv_freq, inv_freq_swa))
}

/// What the file itself holds: a shard's role and range, or everything.
fn file_holdings(knot: &Knot, cfg: &Config) -> Holdings {
    match knot.shard() {
        Some(s) => Holdings {
            embed: matches!(s.role, Role::Entry | Role::Full),
            layers: s.layers,
            head: matches!(s.role, Role::Exit | Role::Full),
        },
        None => Holdings::full(cfg.n_layers),
    }
}
