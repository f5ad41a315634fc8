//! Mixture-of-experts FFN (qwen3moe, deepseek2): a router picks `k` of `E` experts per token,
//! each a gated FFN; the token's output is the routing-weighted sum of its experts' outputs,
//! plus, in deepseek2, shared experts every token runs.
//!
//! Routing (llama.cpp's `build_moe_ffn`): router logits -> softmax (or sigmoid, DeepSeek-V3)
//! probabilities; the choice is made on the probabilities plus a selection bias
//! (`exp_probs_b`, V3), restricted with expert groups to the best groups by the sum of each
//! group's top two; the chosen experts' unbiased probabilities are the weights, renormalised
//! when asked, then times the routed scaling factor.
//!
//! Weights: the GGUF stacks the experts of a block in 3-D tensors `[cols, rows, E]`; expert `e`
//! is the 2-D slice at byte offset `e * rows * row_bytes`, viewed in place ([`Linear`] over
//! that slice, so a kernel reads only the chosen experts' rows, and the interleaved copy of an
//! expert is made on its first use).
//!
//! Batches: the tokens routed to one expert are gathered and run through it together, so each
//! chosen expert's weights are read once per batch. Where the experts have 16-row kernels and
//! their interleaved copies (the usual case), the rows are quantized once for all experts and
//! every chosen expert's gate and up run as one parallel pass, then every down as another
//! ([`kernels::linears_each`](super::kernels::linears_each)): two fork-joins per block, not two
//! per expert, the threads spread over all chosen experts' rows; a decoded token's 8 experts
//! no longer each pay a fork-join and an activation quantization of their own.
//!
//! Determinism: each expert output row depends only on its input row (the kernels' contract),
//! and a token's outputs are summed in its top-k order, weight-scaled first (llama.cpp's order),
//! whatever the batch, chunking, thread count or split point.

use std::cell::RefCell;

use knot_format::dtype::QK;

use super::kernels::blocks::BlockQ8A;
use super::kernels::{
    groupable, kernels, linear, linears, linears_each, quantize_q8a, Job, Linear,
};
use super::ops::{dot_f32, exp, geglu_tanh, swiglu};
use super::Activation;

/// One expert: a gated FFN of `expert_ffn` inner width.
pub struct Expert<'a> {
    /// (expert_ffn rows, hidden cols)
    pub gate: Linear<'a>,
    /// (expert_ffn rows, hidden cols)
    pub up: Linear<'a>,
    /// (hidden rows, expert_ffn cols)
    pub down: Linear<'a>,
}

/// How router logits become probabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    /// Each logit through `1 / (1 + e^-x)` on its own (DeepSeek-V3).
    Sigmoid,
    /// Llama 4: experts chosen on the raw logits, each weighted by its logit's sigmoid, and the
    /// weight multiplies the expert's input row instead of its output (llama.cpp's
    /// `weight_before_ffn`; the expert being nonlinear, the two differ).
    SigmoidInput,
}

/// The routed-experts FFN of one block.
pub struct MoeFfn<'a> {
    /// (n_experts rows, hidden cols): `ffn_gate_inp`, token -> expert logits.
    pub router: Linear<'a>,
    /// (n_experts) views into `ffn_{gate,up,down}_exps`.
    pub experts: Vec<Expert<'a>>,
    /// Experts each token runs (top-k).
    pub n_used: usize,
    /// Renormalise the top-k weights to sum to 1.
    pub norm_topk: bool,
    pub gating: Gating,
    /// (n_experts) added to the probabilities for the choice only (`exp_probs_b`).
    pub select_bias: Option<&'a [f32]>,
    /// (groups, groups used): experts chosen only from the best groups.
    pub groups: Option<(usize, usize)>,
    /// Multiplier of the routing weights (1: none).
    pub scale: f32,
    /// Shared experts as one FFN every token runs, added to the routed sum (deepseek2).
    pub shared: Option<Expert<'a>>,
    /// (hidden) the shared expert's output is scaled by `sigmoid(shared_gate · n)` per token
    /// (qwen35moe's `ffn_gate_inp_shexp`).
    pub shared_gate: Option<&'a [f32]>,
}

/// Per-thread buffers of [`MoeFfn::forward`], reused across calls.
#[derive(Default)]
struct MoeScratch {
    /// (seq, n_experts) router logits, then probabilities
    probs: Vec<f32>,
    /// (seq, k) chosen (expert, weight) of each token, in top-k order
    choice: Vec<(u32, f32)>,
    /// slots `t * k + j` routed to the expert being run
    slots: Vec<usize>,
    /// (n, hidden) gathered input rows
    xg: Vec<f32>,
    /// (n, expert_ffn) gate, then the activation
    g: Vec<f32>,
    /// (n, expert_ffn)
    u: Vec<f32>,
    /// (n, hidden) an expert's outputs
    yd: Vec<f32>,
    /// (seq, k, hidden) weighted outputs of every slot
    ys: Vec<f32>,
    /// Grouped path: (seq, hidden / 32) the rows quantized once for every expert
    xq: Vec<BlockQ8A>,
    /// Grouped path: each chosen expert's gathered quantized rows, experts end to end
    xqg: Vec<BlockQ8A>,
    /// Grouped path: the activations quantized for the down projections
    gq: Vec<BlockQ8A>,
    /// Grouped path: (expert, first slot index in `slots`, rows) of each chosen expert
    runs: Vec<(usize, usize, usize)>,
}

/// The experts of each token of one block call, `seq * k` (expert, weight) in top-k order.
pub type Routes = Vec<(u32, f32)>;

thread_local! {
    static MOE: RefCell<MoeScratch> = RefCell::new(MoeScratch::default());
    /// Where [`record_routes`] collects each [`MoeFfn::forward`]'s choices on this thread.
    static ROUTES: RefCell<Option<Vec<Routes>>> = const { RefCell::new(None) };
}

/// Runs `f` and returns, with its result, the expert choice of every MoE block it ran on this
/// thread, one entry per block call in call order, each `seq * k` (expert, weight) pairs as
/// [`MoeFfn::route`] gives them (tools and tests compare routing with llama.cpp's with it).
pub fn record_routes<R>(f: impl FnOnce() -> R) -> (R, Vec<Routes>) {
    let outer = ROUTES.with(|r| r.borrow_mut().replace(Vec::new()));
    let out = f();
    let got = ROUTES.with(|r| std::mem::replace(&mut *r.borrow_mut(), outer));
    (out, got.unwrap_or_default())
}

/// Smallest sum the top-k weights are divided by (llama.cpp clamps to f16's smallest normal).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

impl MoeFfn<'_> {
    /// Experts in the block.
    pub fn n_experts(&self) -> usize {
        self.experts.len()
    }

    /// The chosen experts of each of the `seq` normed rows `xn` (seq, hidden): `seq * k`
    /// pairs (expert, weight), each token's in top-k order.
    pub fn route(&self, xn: &[f32], seq: usize) -> Routes {
        let mut probs = Vec::new();
        let mut choice = Vec::new();
        self.route_into(xn, seq, &mut probs, &mut choice);
        choice
    }

    fn route_into(
        &self,
        xn: &[f32],
        seq: usize,
        probs: &mut Vec<f32>,
        choice: &mut Vec<(u32, f32)>,
    ) {
        let (ne, k) = (self.n_experts(), self.n_used);
        probs.resize(seq * ne, 0.0);
        linear(&self.router, xn, seq, probs);
        choice.clear();
        let mut order: Vec<u32> = Vec::with_capacity(ne);
        let mut sel: Vec<f32> = Vec::new();
        for p in probs.chunks_exact_mut(ne) {
            // What the choice is made on: the probabilities (llama4: the logits), biased,
            // outside the best groups -inf.
            sel.clear();
            if self.gating == Gating::SigmoidInput {
                sel.extend_from_slice(p);
            }
            match self.gating {
                Gating::Softmax => softmax(p),
                Gating::Sigmoid | Gating::SigmoidInput => {
                    p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + exp(-*v)))
                }
            }
            if self.gating != Gating::SigmoidInput {
                sel.extend_from_slice(p);
            }
            if let Some(b) = self.select_bias {
                sel.iter_mut().zip(b).for_each(|(s, &b)| *s += b);
            }
            if let Some((n_groups, used)) = self.groups {
                mask_groups(&mut sel, n_groups, used);
            }
            // Highest first; equal ones by expert index (a fixed rule, so a tie picks the
            // same experts on every node).
            order.clear();
            order.extend(0..ne as u32);
            order.sort_by(|&a, &b| sel[b as usize].total_cmp(&sel[a as usize]).then(a.cmp(&b)));
            let top = &order[..k];
            let norm = if self.norm_topk {
                let sum: f32 = top.iter().map(|&e| p[e as usize]).sum();
                1.0 / sum.max(MIN_WEIGHT_SUM)
            } else {
                1.0
            };
            choice.extend(top.iter().map(|&e| {
                let mut w = p[e as usize];
                if self.norm_topk {
                    w *= norm;
                }
                if self.scale != 1.0 {
                    w *= self.scale;
                }
                (e, w)
            }));
        }
    }

    /// `out = sum_j w_j * expert_j(xn)` for each of the `seq` normed rows `xn` (seq, hidden);
    /// `out` is (seq, hidden).
    pub fn forward(&self, xn: &[f32], seq: usize, act: Activation, out: &mut [f32]) {
        let mut s = MOE.with(|m| std::mem::take(&mut *m.borrow_mut()));
        let k = self.n_used;
        let h = self.router.cols;
        let mut probs = std::mem::take(&mut s.probs);
        let mut choice = std::mem::take(&mut s.choice);
        self.route_into(xn, seq, &mut probs, &mut choice);
        ROUTES.with(|r| {
            if let Some(v) = r.borrow_mut().as_mut() {
                v.push(choice.clone());
            }
        });
        s.ys.resize(seq * k * h, 0.0);
        if self.grouped(&choice) {
            self.experts_grouped(xn, seq, act, &choice, &mut s);
        } else {
            self.experts_each(xn, act, &choice, &mut s);
        }
        for (o, ys) in out[..seq * h]
            .chunks_exact_mut(h)
            .zip(s.ys.chunks_exact(k * h))
        {
            o.copy_from_slice(&ys[..h]);
            for y in ys[h..].chunks_exact(h) {
                o.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
            }
        }
        if let Some(ex) = &self.shared {
            let f = ex.gate.rows;
            s.g.resize(seq * f, 0.0);
            s.u.resize(seq * f, 0.0);
            linears(
                &mut [(&ex.gate, &mut s.g[..]), (&ex.up, &mut s.u[..])],
                &xn[..seq * h],
                seq,
            );
            match act {
                Activation::Silu => swiglu(&mut s.g, &s.u),
                Activation::GeluTanh => geglu_tanh(&mut s.g, &s.u),
            }
            s.yd.resize(seq * h, 0.0);
            linear(&ex.down, &s.g, seq, &mut s.yd);
            if let Some(gw) = self.shared_gate {
                for (y, x) in s.yd.chunks_exact_mut(h).zip(xn.chunks_exact(h)) {
                    let g = 1.0 / (1.0 + exp(-dot_f32(gw, x)));
                    y.iter_mut().for_each(|v| *v *= g);
                }
            }
            out[..seq * h]
                .iter_mut()
                .zip(&s.yd)
                .for_each(|(o, &y)| *o += y);
        }
        s.probs = probs;
        s.choice = choice;
        // A long prefill's buffers are let go, as the session's scratch is (a small node keeps
        // no tens of MB for the next one-token step).
        let floats = [&s.probs, &s.xg, &s.g, &s.u, &s.yd, &s.ys]
            .iter()
            .map(|v| v.capacity())
            .sum::<usize>();
        let blocks = s.xq.capacity() + s.xqg.capacity() + s.gq.capacity();
        let bytes = floats * 4
            + blocks * std::mem::size_of::<BlockQ8A>()
            + s.choice.capacity() * 8
            + (s.slots.capacity() + 3 * s.runs.capacity()) * 8;
        if bytes <= super::SCRATCH_KEEP_BYTES {
            MOE.with(|m| *m.borrow_mut() = s);
        }
    }
}

impl MoeFfn<'_> {
    /// Whether the chosen experts can run as [`Self::experts_grouped`]: every one of their
    /// matrices has a 16-row kernel and its interleaved copy (not where the station keeps the
    /// weights in the file).
    fn grouped(&self, choice: &[(u32, f32)]) -> bool {
        let k = kernels();
        choice.iter().all(|&(e, _)| {
            let ex = &self.experts[e as usize];
            groupable(k, &ex.gate) && groupable(k, &ex.up) && groupable(k, &ex.down)
        })
    }

    /// The chosen experts of all `seq` rows in two parallel passes (every expert's gate and up,
    /// then every expert's down), the rows quantized once for all experts and each expert's
    /// activations once: a decoded token forks and joins twice per block, not twice per
    /// expert. Fills `s.ys` (slot `t * k + j` = w_j * expert_j(row t)) with the bits of
    /// [`Self::experts_each`]: quantization is per 32-value block and a kernel output depends
    /// only on its weight row and activation row.
    fn experts_grouped(
        &self,
        xn: &[f32],
        seq: usize,
        act: Activation,
        choice: &[(u32, f32)],
        s: &mut MoeScratch,
    ) {
        let k = self.n_used;
        let h = self.router.cols;
        let f = self.experts[0].gate.rows;
        let (nbh, nbf) = (h / QK, f / QK);
        // Slots grouped by expert, experts in index order, each expert's slots in order (a
        // stable sort).
        s.slots.clear();
        s.slots.extend(0..choice.len());
        s.slots.sort_by_key(|&i| choice[i].0);
        s.runs.clear();
        for (i, &slot) in s.slots.iter().enumerate() {
            let e = choice[slot].0 as usize;
            match s.runs.last_mut() {
                Some((last, _, rows)) if *last == e => *rows += 1,
                _ => s.runs.push((e, i, 1)),
            }
        }
        let n = s.slots.len();
        // llama4 scales each expert's input by its weight: those rows differ per slot and are
        // quantized per slot, as experts_each's scaled rows are; otherwise a token's row is
        // quantized once and shared by its experts.
        let before = self.gating == Gating::SigmoidInput;
        if before {
            s.xg.clear();
            for &slot in &s.slots {
                let (t, w) = (slot / k, choice[slot].1);
                s.xg.extend(xn[t * h..(t + 1) * h].iter().map(|v| v * w));
            }
            quantize_q8a(&s.xg, &mut s.xqg);
        } else {
            quantize_q8a(&xn[..seq * h], &mut s.xq);
            s.xqg.clear();
            for &slot in &s.slots {
                let t = slot / k;
                s.xqg.extend_from_slice(&s.xq[t * nbh..(t + 1) * nbh]);
            }
        }
        s.g.resize(n * f, 0.0);
        s.u.resize(n * f, 0.0);
        {
            let mut jobs = Vec::with_capacity(2 * s.runs.len());
            let mut g = &mut s.g[..];
            let mut u = &mut s.u[..];
            for &(e, first, rows) in &s.runs {
                let ex = &self.experts[e];
                let (gh, gt) = std::mem::take(&mut g).split_at_mut(rows * f);
                let (uh, ut) = std::mem::take(&mut u).split_at_mut(rows * f);
                (g, u) = (gt, ut);
                let xq = &s.xqg[first * nbh..(first + rows) * nbh];
                jobs.push(Job {
                    w: &ex.gate,
                    xq,
                    n_tok: rows,
                    out: gh,
                });
                jobs.push(Job {
                    w: &ex.up,
                    xq,
                    n_tok: rows,
                    out: uh,
                });
            }
            linears_each(kernels(), &mut jobs);
        }
        match act {
            Activation::Silu => swiglu(&mut s.g, &s.u),
            Activation::GeluTanh => geglu_tanh(&mut s.g, &s.u),
        }
        quantize_q8a(&s.g, &mut s.gq);
        s.yd.resize(n * h, 0.0);
        {
            let mut jobs = Vec::with_capacity(s.runs.len());
            let mut y = &mut s.yd[..];
            for &(e, first, rows) in &s.runs {
                let (yh, yt) = std::mem::take(&mut y).split_at_mut(rows * h);
                y = yt;
                let xq = &s.gq[first * nbf..(first + rows) * nbf];
                jobs.push(Job {
                    w: &self.experts[e].down,
                    xq,
                    n_tok: rows,
                    out: yh,
                });
            }
            linears_each(kernels(), &mut jobs);
        }
        for (y, &slot) in s.yd.chunks_exact(h).zip(&s.slots) {
            let w = if before { 1.0 } else { choice[slot].1 };
            for (o, &v) in s.ys[slot * h..(slot + 1) * h].iter_mut().zip(y) {
                *o = v * w;
            }
        }
    }

    /// The chosen experts one at a time (matrices without a 16-row kernel or kept in the
    /// file): each expert's gathered rows through [`linears`] (gate, up) and [`linear`] (down).
    fn experts_each(&self, xn: &[f32], act: Activation, choice: &[(u32, f32)], s: &mut MoeScratch) {
        let k = self.n_used;
        let h = self.router.cols;
        for (e, ex) in self.experts.iter().enumerate() {
            s.slots.clear();
            s.slots.extend(
                choice
                    .iter()
                    .enumerate()
                    .filter(|(_, &(c, _))| c as usize == e)
                    .map(|(i, _)| i),
            );
            let n = s.slots.len();
            if n == 0 {
                continue;
            }
            let f = ex.gate.rows;
            let before = self.gating == Gating::SigmoidInput;
            s.xg.resize(n * h, 0.0);
            for (row, &slot) in s.xg.chunks_exact_mut(h).zip(&s.slots) {
                let t = slot / k;
                row.copy_from_slice(&xn[t * h..(t + 1) * h]);
                if before {
                    let w = choice[slot].1;
                    row.iter_mut().for_each(|v| *v *= w);
                }
            }
            s.g.resize(n * f, 0.0);
            s.u.resize(n * f, 0.0);
            linears(
                &mut [(&ex.gate, &mut s.g[..]), (&ex.up, &mut s.u[..])],
                &s.xg,
                n,
            );
            match act {
                Activation::Silu => swiglu(&mut s.g, &s.u),
                Activation::GeluTanh => geglu_tanh(&mut s.g, &s.u),
            }
            s.yd.resize(n * h, 0.0);
            linear(&ex.down, &s.g, n, &mut s.yd);
            for (y, &slot) in s.yd.chunks_exact(h).zip(&s.slots) {
                let w = if before { 1.0 } else { choice[slot].1 };
                for (o, &v) in s.ys[slot * h..(slot + 1) * h].iter_mut().zip(y) {
                    *o = v * w;
                }
            }
        }
    }
}

/// Sets every expert outside the `used` best of `n_groups` equal groups to -inf; a group's
/// score is the sum of its two highest entries (DeepSeek-V3's rule, llama.cpp's order: the
/// higher first). Equal scores: the lower group first.
fn mask_groups(sel: &mut [f32], n_groups: usize, used: usize) {
    let per = sel.len() / n_groups;
    let score = |g: &[f32]| {
        let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &v in g {
            if v > a {
                (a, b) = (v, a);
            } else if v > b {
                b = v;
            }
        }
        if per == 1 {
            a
        } else {
            a + b
        }
    };
    let scores: Vec<f32> = sel.chunks_exact(per).map(score).collect();
    let mut order: Vec<usize> = (0..n_groups).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    for &g in &order[used..] {
        sel[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
    }
}

/// In-place softmax, the max subtracted first; the sum in f64, in index order.
fn softmax(p: &mut [f32]) {
    let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in p.iter_mut() {
        *v = exp(*v - max);
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    p.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::QMatrix;
    use knot_format::DType;

    fn f32_matrix(rows: usize, cols: usize, v: &[f32]) -> Linear<'_> {
        Linear::new(QMatrix::new(DType::F32, rows, cols, bytemuck::cast_slice(v)).unwrap())
    }

    /// The grouped path (every chosen expert's gate and up in one pass, then every down, the
    /// rows quantized once) gives the bits of the one-expert-at-a-time path, on quantized
    /// experts (Q4_K gate / up with a Q6_K down, and all Q8_0), for a batch and for each token
    /// alone, at 1 and 3 threads.
    #[test]
    fn grouped_experts_give_the_bits_of_one_expert_at_a_time() {
        use crate::kernels::tests::{random_row, random_x, Rng};
        let (h, f, ne, k, seq) = (256, 256, 8, 3, 5);
        let mut rng = Rng::new(34);
        for (gu, dn) in [(DType::Q4_K, DType::Q6_K), (DType::Q8_0, DType::Q8_0)] {
            let router: Vec<f32> = (0..ne * h).map(|_| rng.f32() * 0.5).collect();
            let mats: Vec<[Vec<u8>; 3]> = (0..ne)
                .map(|_| {
                    [
                        random_row(gu, f * h, &mut rng),
                        random_row(gu, f * h, &mut rng),
                        random_row(dn, h * f, &mut rng),
                    ]
                })
                .collect();
            fn q(t: DType, r: usize, c: usize, d: &[u8]) -> Linear<'_> {
                Linear::new(QMatrix::new(t, r, c, d).unwrap())
            }
            let moe = MoeFfn {
                router: f32_matrix(ne, h, &router),
                experts: mats
                    .iter()
                    .map(|[g, u, d]| Expert {
                        gate: q(gu, f, h, g),
                        up: q(gu, f, h, u),
                        down: q(dn, h, f, d),
                    })
                    .collect(),
                n_used: k,
                norm_topk: true,
                gating: Gating::Softmax,
                select_bias: None,
                groups: None,
                scale: 1.0,
                shared: None,
                shared_gate: None,
            };
            let x = random_x(seq * h, &mut rng);
            let choice = moe.route(&x, seq);
            let experts: std::collections::BTreeSet<u32> = choice.iter().map(|c| c.0).collect();
            assert!(
                experts.len() > k,
                "{gu}: the tokens share some experts, not all"
            );
            if !moe.grouped(&choice) {
                eprintln!("{gu}: no 16-row kernels on this CPU: the grouped path is not taken");
                continue;
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            let mut each = MoeScratch::default();
            each.ys.resize(seq * k * h, 0.0);
            moe.experts_each(&x, Activation::Silu, &choice, &mut each);
            for threads in [1, 3] {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut grouped = MoeScratch::default();
                grouped.ys.resize(seq * k * h, 0.0);
                pool.install(|| {
                    moe.experts_grouped(&x, seq, Activation::Silu, &choice, &mut grouped)
                });
                assert_eq!(
                    bits(&grouped.ys),
                    bits(&each.ys),
                    "{gu}: grouped vs each, {threads} threads"
                );
                let mut batch = vec![0f32; seq * h];
                pool.install(|| moe.forward(&x, seq, Activation::Silu, &mut batch));
                for t in 0..seq {
                    let mut one = vec![0f32; h];
                    pool.install(|| {
                        moe.forward(&x[t * h..(t + 1) * h], 1, Activation::Silu, &mut one)
                    });
                    assert_eq!(
                        bits(&one),
                        bits(&batch[t * h..(t + 1) * h]),
                        "{gu}: token {t} alone"
                    );
                }
            }
            assert!(each.ys.iter().any(|v| *v != 0.0));
            // llama4's gating scales each expert's input by its weight: the grouped path too.
            let moe = MoeFfn {
                gating: Gating::SigmoidInput,
                ..moe
            };
            let choice = moe.route(&x, seq);
            let mut each = MoeScratch::default();
            each.ys.resize(seq * k * h, 0.0);
            moe.experts_each(&x, Activation::Silu, &choice, &mut each);
            let mut grouped = MoeScratch::default();
            grouped.ys.resize(seq * k * h, 0.0);
            moe.experts_grouped(&x, seq, Activation::Silu, &choice, &mut grouped);
            assert_eq!(
                bits(&grouped.ys),
                bits(&each.ys),
                "{gu}: grouped vs each, input-weighted"
            );
        }
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut p = [1.0f32, 3.0, 2.0, -100.0];
        softmax(&mut p);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[1] > p[2] && p[2] > p[0] && p[0] > p[3]);
    }

    /// Two experts of width 32 over hidden 32, each the identity scaled (gate rows large so
    /// silu(g) ~ g): routing picks by the router's logits, renormalises, and the output is
    /// the weighted sum, for each token alone and in a batch, bit for bit.
    #[test]
    fn routes_top_k_and_sums_weighted_experts_batch_invariant() {
        let h = 32;
        let ne = 4;
        // Router: expert e's logit is x[e] * 4.
        let mut router = vec![0f32; ne * h];
        for e in 0..ne {
            router[e * h + e] = 4.0;
        }
        let eye = |s: f32| -> Vec<f32> {
            let mut m = vec![0f32; h * h];
            for i in 0..h {
                m[i * h + i] = s;
            }
            m
        };
        let mats: Vec<[Vec<f32>; 3]> = (0..ne)
            .map(|e| [eye(1.0), eye(1.0), eye((e + 1) as f32)])
            .collect();
        let moe = MoeFfn {
            router: f32_matrix(ne, h, &router),
            experts: mats
                .iter()
                .map(|[g, u, d]| Expert {
                    gate: f32_matrix(h, h, g),
                    up: f32_matrix(h, h, u),
                    down: f32_matrix(h, h, d),
                })
                .collect(),
            n_used: 2,
            norm_topk: true,
            gating: Gating::Softmax,
            select_bias: None,
            groups: None,
            scale: 1.0,
            shared: None,
            shared_gate: None,
        };
        let mut x = vec![0f32; 3 * h];
        // token 0 prefers experts 2 then 0; token 1: 1 then 3; token 2: 3 then 2
        for (t, (a, b)) in [(2, 0), (1, 3), (3, 2)].into_iter().enumerate() {
            x[t * h + a] = 1.0;
            x[t * h + b] = 0.5;
            x[t * h + 10] = 2.0;
        }
        let choice = moe.route(&x, 3);
        let picked: Vec<u32> = choice.iter().map(|c| c.0).collect();
        assert_eq!(picked, [2, 0, 1, 3, 3, 2]);
        for t in 0..3 {
            let s = choice[2 * t].1 + choice[2 * t + 1].1;
            assert!((s - 1.0).abs() < 1e-6, "weights of token {t} sum to {s}");
            assert!(choice[2 * t].1 > choice[2 * t + 1].1);
        }
        let mut batch = vec![0f32; 3 * h];
        moe.forward(&x, 3, Activation::Silu, &mut batch);
        for t in 0..3 {
            let mut one = vec![0f32; h];
            moe.forward(&x[t * h..(t + 1) * h], 1, Activation::Silu, &mut one);
            assert_eq!(
                one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                batch[t * h..(t + 1) * h]
                    .iter()
                    .map(|v| v.to_bits())
                    .collect::<Vec<_>>()
            );
            // Column 10: silu(2) * 2 through each chosen expert, scaled by (e + 1).
            let v = 2.0f32 / (1.0 + (-2.0f32).exp()) * 2.0;
            let (c0, c1) = (choice[2 * t], choice[2 * t + 1]);
            let want = c0.1 * v * (c0.0 + 1) as f32 + c1.1 * v * (c1.0 + 1) as f32;
            assert!((one[10] - want).abs() < 1e-4, "{} vs {want}", one[10]);
        }
    }
}
