//! Mamba's selective state-space layer (`mamba`, and Mamba-2's `mamba2` / `granitehybrid`),
//! and the per-session state it carries between tokens.
//!
//! One layer, for the normed input `n` of each position (llama.cpp `build_mamba_layer` /
//! `build_mamba2_layer`, ggml's `ssm_conv` and `ssm_scan`):
//! - Mamba-1: `[x, z] = in_proj · n`; `x` through a depthwise causal convolution over the last
//!   `conv_kernel` rows (oldest tap first, zeros before the first token) plus its bias, then
//!   SiLU; `[dt_in, B, C] = x_proj · x`; `dt = dt_proj · dt_in + dt_bias`; the selective scan
//!   per channel `i` and state `s`, with `sp = softplus(dt_i)`:
//!   `h[i,s] = h[i,s] * exp(sp * A[i,s]) + B[s] * x_i * sp`, `y_i = sum_s h[i,s] * C[s]`
//!   (`A = -exp(A_log)`, as the GGUF stores it in `ssm_a`); `y += x * D`; `y *= silu(z)`;
//!   the layer's output is `out_proj · y`.
//! - Mamba-2: `[z, xBC, dt] = in_proj · n`; `xBC` through the convolution (bias optional) and
//!   SiLU, then split into `x` (heads of `inner / heads` channels), `B` and `C` (one of
//!   `state` values per group of heads); one scalar decay per head,
//!   `h = h * exp(sp_h * A_h) + B_g * x * sp_h`; `y += x * D_h`; `y *= silu(z)`; an RMS norm
//!   per group of `inner / groups` channels (`ssm_norm`); then `out_proj`.
//!
//! Every position is computed the same way whether it arrives alone or in a chunk (the
//! projections are batch-invariant, the convolution and the scan go row by row in the same
//! order), so chunked prefill equals token by token bit for bit by construction. The scan's
//! inner loops run over channels with the state stored state-major (`[s][channel]`), so each
//! channel (a SIMD lane once the compiler vectorizes them) does exactly the scalar order of
//! operations: the same bits on every ISA, with the portable [`crate::ops::exp`].

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};

use super::kernels::lanes::lane_isa;
use super::kernels::scan::{mamba1_row, mamba2_row, Mamba1Row};
use super::kernels::{linear, Linear};
use super::ops::{exp, rmsnorm_inplace};
use super::shortconv::Checkpoints;

/// Which scan a state-space layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SsmKind {
    /// Mamba-1: a decay per channel and state, `x_proj` and `dt_proj`.
    Mamba1,
    /// Mamba-2 (SSD): a scalar decay per head, groups of B and C, a grouped RMS norm.
    Mamba2,
}

/// A state-space layer's shape (from the file's `ssm.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsmConfig {
    pub kind: SsmKind,
    /// Taps of the causal convolution (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Inner width (`ssm.inner_size`).
    pub inner: usize,
    /// State values per channel (`ssm.state_size`).
    pub state: usize,
    /// Mamba-1: rank of the time-step projection; Mamba-2: the head count.
    pub dt_rank: usize,
    /// Mamba-2's groups of B and C (1 for Mamba-1).
    pub groups: usize,
    /// Mamba-1 variants (FalconMamba) RMS-normalise dt, B and C without weights.
    pub dt_b_c_rms: bool,
}

impl SsmConfig {
    /// Channels the convolution runs over: `inner` (Mamba-1), `inner + 2 groups state`
    /// (Mamba-2: x, B and C together).
    pub fn conv_dim(&self) -> usize {
        match self.kind {
            SsmKind::Mamba1 => self.inner,
            SsmKind::Mamba2 => self.inner + 2 * self.groups * self.state,
        }
    }

    /// Rows of `in_proj`.
    pub fn in_proj_rows(&self) -> usize {
        match self.kind {
            SsmKind::Mamba1 => 2 * self.inner,
            SsmKind::Mamba2 => 2 * self.inner + 2 * self.groups * self.state + self.dt_rank,
        }
    }

    /// Heads of the scan: one per channel (Mamba-1), `dt_rank` (Mamba-2).
    pub fn heads(&self) -> usize {
        match self.kind {
            SsmKind::Mamba1 => self.inner,
            SsmKind::Mamba2 => self.dt_rank,
        }
    }

    /// Floats of one session's state of one layer: the convolution's last `conv_kernel - 1`
    /// inputs and the scan's `inner x state` values. Constant, however long the conversation.
    pub fn state_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim() + self.inner * self.state
    }
}

/// A state-space layer's tensors (llama.cpp `ssm_*`).
pub struct SsmWeights<'a> {
    /// (in_proj_rows, hidden)
    pub in_proj: Linear<'a>,
    /// (conv_dim, conv_kernel) one causal filter per channel, oldest tap first.
    pub conv: &'a [f32],
    /// (conv_dim) added after the convolution (Mamba-2 files may have none).
    pub conv_bias: Option<&'a [f32]>,
    /// Mamba-1: (dt_rank + 2 state, inner)
    pub x_proj: Option<Linear<'a>>,
    /// Mamba-1: (inner, dt_rank)
    pub dt_proj: Option<Linear<'a>>,
    /// (heads)
    pub dt_bias: &'a [f32],
    /// Mamba-1: `A` transposed to (state, inner), the scan's order (copied once at load);
    /// Mamba-2: (heads).
    pub a: Vec<f32>,
    /// (heads) the skip connection's `D`.
    pub d: &'a [f32],
    /// Mamba-2: (inner) the grouped RMS norm's weights.
    pub norm: Option<&'a [f32]>,
    /// (hidden, inner)
    pub out_proj: Linear<'a>,
}

impl<'a> SsmWeights<'a> {
    /// The layer's matrices, in forward order.
    pub fn matrices(&self) -> Vec<&Linear<'a>> {
        let mut m = vec![&self.in_proj];
        m.extend(self.x_proj.as_ref());
        m.extend(self.dt_proj.as_ref());
        m.push(&self.out_proj);
        m
    }
}

/// How many of the latest forwards' starting states a session keeps (lookup decoding
/// rejects drafts of the last forward; a new chat turn usually cuts back into the last few
/// decode steps).
const RECENT: usize = 2;

/// One state-space layer's state in one session.
///
/// Unlike a KV cache (or LFM2's short window, [`super::ConvState`]), the scan's state folds in
/// every earlier position and cannot be cut back; it is restored from snapshots, each a full
/// copy ([`SsmConfig::state_floats`] floats): at the latest `turns` multiples of `every`
/// positions, at the end of each of the last `turns` multi-row forwards, and at the start of
/// each of the last two forwards: at most `2 turns + 2` states (18 by default). The `window`
/// of [`Checkpoints`] does not apply, nor are older periodic snapshots kept (a snapshot per
/// position, or one every 256 over a long session, would cost a whole state each).
pub struct SsmState {
    cfg: SsmConfig,
    /// (conv_kernel - 1, conv_dim): the latest inputs of the convolution, oldest first.
    conv: Vec<f32>,
    /// The scan's state: Mamba-1 (state, inner); Mamba-2 (heads, state, head_dim).
    h: Vec<f32>,
    /// Positions processed.
    len: usize,
    /// Position -> `conv` then `h` at that position.
    snapshots: BTreeMap<usize, Vec<f32>>,
    /// Positions of the turn-end snapshots, oldest first.
    turn_ends: VecDeque<usize>,
    /// Positions of the latest forwards' starting snapshots, oldest first.
    starts: VecDeque<usize>,
    /// Positions of the periodic snapshots (every `every`), oldest first: the latest
    /// `turns` of them are kept (each costs a whole state).
    periodic: VecDeque<usize>,
    policy: Checkpoints,
    /// The RMS norms' epsilon (the model's).
    eps: f32,
}

impl SsmState {
    /// The state before the first token; `eps` is the model's RMS norm epsilon.
    pub fn new(cfg: SsmConfig, eps: f32, policy: Checkpoints) -> SsmState {
        SsmState {
            eps,
            conv: vec![0.0; (cfg.conv_kernel - 1) * cfg.conv_dim()],
            h: vec![0.0; cfg.inner * cfg.state],
            cfg,
            len: 0,
            snapshots: BTreeMap::new(),
            turn_ends: VecDeque::new(),
            starts: VecDeque::new(),
            periodic: VecDeque::new(),
            policy,
        }
    }

    /// Positions processed.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True before the first token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Snapshots held.
    pub fn checkpoint_count(&self) -> usize {
        self.snapshots.len()
    }

    /// Bytes allocated: the state and its snapshots.
    pub fn bytes(&self) -> usize {
        (self.conv.capacity() + self.h.capacity()) * 4
            + self
                .snapshots
                .values()
                .map(|c| c.capacity() * 4)
                .sum::<usize>()
    }

    /// The latest position `<= p` this state can be cut back to without recomputing: its
    /// length, or the latest snapshot, else 0 (the empty state).
    pub fn restorable(&self, p: usize) -> usize {
        let p = p.min(self.len);
        if p == self.len {
            return p;
        }
        self.snapshots
            .range(..=p)
            .next_back()
            .map(|(&c, _)| c)
            .unwrap_or(0)
    }

    /// Cuts the state back to position `p`, which must be [`SsmState::restorable`] (the
    /// session checks); anything else restores the latest state before it.
    pub fn truncate(&mut self, p: usize) {
        let p = self.restorable(p);
        if p == self.len {
            return;
        }
        match self.snapshots.get(&p) {
            Some(snap) => {
                let (c, h) = snap.split_at(self.conv.len());
                self.conv.copy_from_slice(c);
                self.h.copy_from_slice(h);
            }
            None => {
                // p == 0: the empty state.
                self.conv.fill(0.0);
                self.h.fill(0.0);
            }
        }
        self.len = p;
        self.snapshots.retain(|&c, _| c <= p);
        self.turn_ends.retain(|&c| c <= p);
        self.starts.retain(|&c| c <= p);
        self.periodic.retain(|&c| c <= p);
    }

    /// Floats of the live state ([`SsmState::live`]): the convolution window, then the scan's.
    pub(crate) fn live_floats(&self) -> usize {
        self.conv.len() + self.h.len()
    }

    /// The live state at [`SsmState::len`]: the convolution window, then the scan's state.
    pub(crate) fn live(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.live_floats());
        v.extend_from_slice(&self.conv);
        v.extend_from_slice(&self.h);
        v
    }

    /// Takes a live state shipped from another node at `pos` (of [`SsmState::live_floats`]
    /// floats; the caller checks): earlier snapshots go, `pos` becomes one (a turn end), so a
    /// later rewind to it is exact.
    pub(crate) fn set_live(&mut self, pos: usize, state: &[f32]) {
        let (c, h) = state.split_at(self.conv.len());
        self.conv.copy_from_slice(c);
        self.h.copy_from_slice(h);
        self.len = pos;
        self.snapshots.clear();
        self.turn_ends.clear();
        self.starts.clear();
        self.periodic.clear();
        if pos > 0 {
            self.snapshots.insert(pos, state.to_vec());
            self.turn_ends.push_back(pos);
        }
    }

    fn snapshot(&mut self) {
        let conv = std::mem::take(&mut self.conv);
        self.snapshot_with(&conv);
        self.conv = conv;
    }

    /// A snapshot at the current length whose convolution window is `conv` (within a
    /// forward, the window of that position, not yet `self.conv`).
    fn snapshot_with(&mut self, conv: &[f32]) {
        let mut s = Vec::with_capacity(conv.len() + self.h.len());
        s.extend_from_slice(conv);
        s.extend_from_slice(&self.h);
        self.snapshots.insert(self.len, s);
    }

    /// Whether the snapshot at `p` is still wanted (after `p` left one of the lists).
    fn kept(&self, p: usize) -> bool {
        self.periodic.contains(&p) || self.turn_ends.contains(&p) || self.starts.contains(&p)
    }

    /// Runs the layer over `seq` normed rows `xn` (seq, hidden) at positions
    /// `len..len + seq`, advancing the state; writes the layer's output to `out`
    /// (seq, hidden).
    pub fn forward(&mut self, w: &SsmWeights<'_>, xn: &[f32], seq: usize, out: &mut [f32]) {
        // The state before this forward (lookup decoding's rollback point).
        if self.len > 0 && !self.snapshots.contains_key(&self.len) {
            self.snapshot();
        }
        self.starts.push_back(self.len);
        while self.starts.len() > RECENT {
            if let Some(old) = self.starts.pop_front() {
                if !self.kept(old) {
                    self.snapshots.remove(&old);
                }
            }
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            match self.cfg.kind {
                SsmKind::Mamba1 => self.mamba1(w, xn, seq, &mut s, out),
                SsmKind::Mamba2 => self.mamba2(w, xn, seq, &mut s, out),
            }
        });
        if seq > 1 && self.policy.turns > 0 {
            if !self.snapshots.contains_key(&self.len) {
                self.snapshot();
            }
            self.turn_ends.push_back(self.len);
            while self.turn_ends.len() > self.policy.turns {
                if let Some(old) = self.turn_ends.pop_front() {
                    if !self.kept(old) {
                        self.snapshots.remove(&old);
                    }
                }
            }
        }
    }

    /// The convolution of rows `xs` (seq, conv_dim, taken in place) over the kept inputs,
    /// plus bias, then SiLU; advances `self.conv` to the last inputs.
    fn convolve(&mut self, w: &SsmWeights<'_>, xs: &mut [f32], seq: usize, cat: &mut Vec<f32>) {
        let (cd, keep) = (self.cfg.conv_dim(), self.cfg.conv_kernel - 1);
        let kernel = keep + 1;
        cat.clear();
        cat.extend_from_slice(&self.conv);
        cat.extend_from_slice(&xs[..seq * cd]);
        for t in 0..seq {
            let win = &cat[t * cd..(t + kernel) * cd];
            for (ch, o) in xs[t * cd..(t + 1) * cd].iter_mut().enumerate() {
                let taps = &w.conv[ch * kernel..(ch + 1) * kernel];
                let mut sum = 0.0f32;
                for (k, &tap) in taps.iter().enumerate() {
                    sum += win[k * cd + ch] * tap;
                }
                if let Some(b) = w.conv_bias {
                    sum += b[ch];
                }
                *o = silu(sum);
            }
        }
        self.conv.copy_from_slice(&cat[seq * cd..(seq + keep) * cd]);
    }

    /// Row `t` of a forward is done: snapshots due at the position reached (every `every`
    /// positions), with that position's convolution window (rows `t + 1 ..= t + keep` of
    /// the forward's `cat`).
    fn step_done(&mut self, t: usize, cat: &[f32]) {
        self.len += 1;
        let every = self.policy.every;
        if every > 0 && self.len.is_multiple_of(every) {
            let cd = self.cfg.conv_dim();
            let keep = self.cfg.conv_kernel - 1;
            self.snapshot_with(&cat[(t + 1) * cd..(t + 1 + keep) * cd]);
            self.periodic.push_back(self.len);
            while self.periodic.len() > self.policy.turns.max(1) {
                if let Some(old) = self.periodic.pop_front() {
                    if !self.kept(old) {
                        self.snapshots.remove(&old);
                    }
                }
            }
        }
    }

    fn mamba1(
        &mut self,
        w: &SsmWeights<'_>,
        xn: &[f32],
        seq: usize,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        let c = self.cfg;
        let (di, ds, r) = (c.inner, c.state, c.dt_rank);
        let (Some(x_proj), Some(dt_proj)) = (&w.x_proj, &w.dt_proj) else {
            unreachable!("a Mamba-1 layer loads x_proj and dt_proj");
        };
        s.fit(
            seq * 2 * di,
            seq * di,
            seq * (r + 2 * ds),
            seq * r,
            seq * di,
        );
        linear(&w.in_proj, xn, seq, &mut s.proj);
        // x to its own rows for the convolution; z stays in `proj`.
        for t in 0..seq {
            s.x[t * di..(t + 1) * di].copy_from_slice(&s.proj[t * 2 * di..t * 2 * di + di]);
        }
        self.convolve(w, &mut s.x, seq, &mut s.cat);
        linear(x_proj, &s.x, seq, &mut s.xdb);
        let n = r + 2 * ds;
        if c.dt_b_c_rms {
            let ones = vec![1.0f32; r.max(ds)];
            for row in s.xdb.chunks_exact_mut(n).take(seq) {
                let (dt, bc) = row.split_at_mut(r);
                let (b, cc) = bc.split_at_mut(ds);
                rmsnorm_inplace(dt, &ones[..r], self.eps);
                rmsnorm_inplace(b, &ones[..ds], self.eps);
                rmsnorm_inplace(cc, &ones[..ds], self.eps);
            }
        }
        for t in 0..seq {
            s.dt_in[t * r..(t + 1) * r].copy_from_slice(&s.xdb[t * n..t * n + r]);
        }
        linear(dt_proj, &s.dt_in, seq, &mut s.y);
        // s.y holds dt until the scan overwrites each row with its output.
        for t in 0..seq {
            let dt = &mut s.y[t * di..(t + 1) * di];
            let x = &s.x[t * di..(t + 1) * di];
            let bc = &s.xdb[t * n + r..(t + 1) * n];
            scan_mamba1(&mut self.h, &w.a, w.dt_bias, x, bc, ds, &mut s.sp, dt);
            // y = (y + x D) * silu(z)
            let z = &s.proj[t * 2 * di + di..(t + 1) * 2 * di];
            for (((y, &x), &d), &z) in dt.iter_mut().zip(x).zip(w.d).zip(z) {
                *y = (*y + x * d) * silu(z);
            }
            self.step_done(t, &s.cat);
        }
        linear(&w.out_proj, &s.y, seq, out);
    }

    fn mamba2(
        &mut self,
        w: &SsmWeights<'_>,
        xn: &[f32],
        seq: usize,
        s: &mut Scratch,
        out: &mut [f32],
    ) {
        let c = self.cfg;
        let (di, ds, nh, ng) = (c.inner, c.state, c.dt_rank, c.groups);
        let (cd, rows) = (c.conv_dim(), c.in_proj_rows());
        s.fit(seq * rows, seq * cd, 0, 0, seq * di);
        linear(&w.in_proj, xn, seq, &mut s.proj);
        for t in 0..seq {
            s.x[t * cd..(t + 1) * cd].copy_from_slice(&s.proj[t * rows + di..t * rows + di + cd]);
        }
        self.convolve(w, &mut s.x, seq, &mut s.cat);
        let norm = w
            .norm
            .unwrap_or_else(|| unreachable!("a Mamba-2 layer loads its norm"));
        for t in 0..seq {
            let xbc = &s.x[t * cd..(t + 1) * cd];
            let dt = &s.proj[t * rows + di + cd..(t + 1) * rows];
            let y = &mut s.y[t * di..(t + 1) * di];
            scan_mamba2(&mut self.h, &w.a, w.dt_bias, xbc, dt, (di, ds, nh, ng), y);
            let hd = di / nh;
            let z = &s.proj[t * rows..t * rows + di];
            for (i, (y, &z)) in y.iter_mut().zip(z).enumerate() {
                *y = (*y + xbc[i] * w.d[i / hd]) * silu(z);
            }
            let gw = di / ng;
            for (yg, ng_w) in y.chunks_exact_mut(gw).zip(norm.chunks_exact(gw)) {
                rmsnorm_inplace(yg, ng_w, self.eps);
            }
            self.step_done(t, &s.cat);
        }
        linear(&w.out_proj, &s.y, seq, out);
    }
}

/// `x * sigmoid(x)`, ggml's form.
#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `ln(1 + e^x)`, or `x` above 20 (ggml's `ggml_compute_softplus_f32`), with a portable log:
/// the same bits on every target.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        return x;
    }
    ln_f64(1.0 + exp(x) as f64) as f32
}

/// `ln(v)` for a positive finite f64, from IEEE operations only: `v = m 2^e` with `m` in
/// [sqrt(1/2), sqrt(2)), `ln m = 2 atanh(u)`, `u = (m - 1) / (m + 1)` (|u| <= 0.172), the
/// series to `u^23` (truncation < 1e-17 relative).
fn ln_f64(v: f64) -> f64 {
    let bits = v.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023;
    let mut m = f64::from_bits((bits & ((1u64 << 52) - 1)) | (1023u64 << 52));
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    let u = (m - 1.0) / (m + 1.0);
    let u2 = u * u;
    let mut p = 1.0 / 23.0;
    for k in (1..=10).rev() {
        p = p * u2 + 1.0 / (2 * k + 1) as f64;
    }
    p = p * u2 + 1.0;
    2.0 * u * p + e as f64 * std::f64::consts::LN_2
}

/// One Mamba-1 step: `h` (state, inner), `a` (state, inner), `x` the convolved input,
/// `bc` B then C (state each), `dt` (inner) the raw time steps in, the outputs out.
#[allow(clippy::too_many_arguments)]
fn scan_mamba1(
    h: &mut [f32],
    a: &[f32],
    dt_bias: &[f32],
    x: &[f32],
    bc: &[f32],
    ds: usize,
    sp: &mut Vec<f32>,
    dt: &mut [f32],
) {
    let di = x.len();
    sp.resize(2 * di, 0.0);
    let (spv, xdt) = sp.split_at_mut(di);
    for i in 0..di {
        spv[i] = softplus(dt[i] + dt_bias[i]);
        xdt[i] = x[i] * spv[i];
    }
    let y = dt;
    y.fill(0.0);
    let (b, c) = bc.split_at(ds);
    let isa = lane_isa();
    for s in 0..ds {
        // One lane per channel: the same operations in the same order as one channel alone.
        let r = Mamba1Row {
            a: &a[s * di..(s + 1) * di],
            sp: spv,
            xdt,
            b: b[s],
            c: c[s],
        };
        mamba1_row(isa, r, &mut h[s * di..(s + 1) * di], y);
    }
}

/// One Mamba-2 step: `h` (heads, state, head_dim), `a` and `dt_bias` (heads), `xbc` the
/// convolved x, B, C; `dt` (heads) the raw time steps; `y` (inner) out.
fn scan_mamba2(
    h: &mut [f32],
    a: &[f32],
    dt_bias: &[f32],
    xbc: &[f32],
    dt: &[f32],
    (di, ds, nh, ng): (usize, usize, usize, usize),
    y: &mut [f32],
) {
    let hd = di / nh;
    let (x, bc) = xbc.split_at(di);
    let (b, c) = bc.split_at(ng * ds);
    y.fill(0.0);
    let isa = lane_isa();
    for head in 0..nh {
        let sp = softplus(dt[head] + dt_bias[head]);
        let da = exp(sp * a[head]);
        let g = head / (nh / ng);
        let xh = &x[head * hd..(head + 1) * hd];
        let yh = &mut y[head * hd..(head + 1) * hd];
        let hh = &mut h[head * ds * hd..(head + 1) * ds * hd];
        for s in 0..ds {
            let (bs, cs) = (b[g * ds + s], c[g * ds + s]);
            mamba2_row(isa, (da, sp, bs, cs), xh, &mut hh[s * hd..(s + 1) * hd], yh);
        }
    }
}

/// Per-thread buffers of a forward.
#[derive(Default)]
struct Scratch {
    /// (seq, in_proj_rows)
    proj: Vec<f32>,
    /// (seq, conv_dim) the convolution's input, then its output
    x: Vec<f32>,
    /// (seq, dt_rank + 2 state) Mamba-1's x_proj output
    xdb: Vec<f32>,
    /// (seq, dt_rank)
    dt_in: Vec<f32>,
    /// (seq, inner) the scan's output
    y: Vec<f32>,
    /// (conv_kernel - 1 + seq, conv_dim)
    cat: Vec<f32>,
    /// (2 inner) softplus(dt) and x dt of one row
    sp: Vec<f32>,
}

impl Scratch {
    fn fit(&mut self, proj: usize, x: usize, xdb: usize, dt_in: usize, y: usize) {
        self.proj.resize(proj, 0.0);
        self.x.resize(x, 0.0);
        self.xdb.resize(xdb, 0.0);
        self.dt_in.resize(dt_in, 0.0);
        self.y.resize(y, 0.0);
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}
