//! Qwen3.5's Gated DeltaNet and the per-session state it carries between tokens.
//!
//! One layer, for the normed input `n` of each position (llama.cpp `qwen35`,
//! `build_layer_attn_linear` with the fused `ggml_gated_delta_net`):
//! `[q, k, v] = silu(conv(attn_qkv · n))`, a depthwise causal convolution over the last
//! `kernel` projections (oldest tap first, zeros before the first token); `q` and `k`
//! L2-normed per head; `beta = sigmoid(ssm_beta · n)`, `g = ssm_a * softplus(ssm_alpha · n +
//! ssm_dt)` per value head. Each value head `h` (reading key head `h % k_heads`) keeps a
//! `d x d` matrix `S` (row `j` of `M` here is column `j` of `S`) and per token:
//! `S *= exp(g)`; `delta = (v - S^T k) * beta`; `S += k delta^T`; `o = S^T q / sqrt(d)`.
//! The output `rmsnorm(o) * silu(z)` (`z = attn_gate · n`) goes through `ssm_out`.
//!
//! Every position runs the same arithmetic in the same order whether it arrives alone or in a
//! chunk (the projections are row-independent, the convolution and the recurrence go token by
//! token), so chunked prefill equals token by token bit for bit, by construction.
//!
//! The state cannot be cut back like a KV cache, and unlike a short convolution's it cannot be
//! rebuilt from recent inputs: [`DeltaState`] keeps whole snapshots (the convolution's rows and
//! every head's matrix) at the positions [`Checkpoints`] names, and the start of the latest
//! forward (a rejected draft rolls back to it). A snapshot costs
//! `4 * ((kernel - 1) * channels + v_heads * d * d)` bytes per layer; `window` does not apply
//! (a snapshot per recent position would cost as much as a long KV cache).

use std::collections::{BTreeMap, VecDeque};

use super::kernels::{linear, linears};
use super::ops::{dot_f32, exp, rmsnorm_inplace};
use super::shortconv::Checkpoints;
use super::weights::DeltaNetWeights;
use knot_format::DeltaNetShape;

/// One Gated DeltaNet layer's state in one session.
pub struct DeltaState {
    d: usize,
    k_heads: usize,
    v_heads: usize,
    kernel: usize,
    /// The convolution's channels: q, k, v.
    channels: usize,
    /// `(kernel - 1, channels)`: the projections of the last positions, oldest first.
    conv: Vec<f32>,
    /// `(v_heads, d, d)`: each head's matrix, `M[h][j][i] = S_h[i][j]`.
    s: Vec<f32>,
    /// Positions processed.
    len: usize,
    /// Position -> `conv` then `s` as they were there.
    checkpoints: BTreeMap<usize, Vec<f32>>,
    /// Positions of the turn-end checkpoints, oldest first.
    turn_ends: VecDeque<usize>,
    /// The state at the start of the latest forward.
    last_start: Option<(usize, Vec<f32>)>,
    policy: Checkpoints,
}

impl DeltaState {
    /// The state before the first token.
    pub fn new(shape: &DeltaNetShape, kernel: usize, policy: Checkpoints) -> DeltaState {
        let (d, kh, vh) = (
            shape.head_dim as usize,
            shape.k_heads as usize,
            shape.v_heads as usize,
        );
        let channels = (2 * kh + vh) * d;
        DeltaState {
            d,
            k_heads: kh,
            v_heads: vh,
            kernel,
            channels,
            conv: vec![0.0; kernel.saturating_sub(1) * channels],
            s: vec![0.0; vh * d * d],
            len: 0,
            checkpoints: BTreeMap::new(),
            turn_ends: VecDeque::new(),
            last_start: None,
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

    /// Checkpoints held (the start of the latest forward aside).
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.len()
    }

    /// Bytes of one snapshot (what each checkpoint costs).
    pub fn snapshot_bytes(&self) -> usize {
        (self.conv.len() + self.s.len()) * 4
    }

    /// Bytes allocated: the live state and every snapshot.
    pub fn bytes(&self) -> usize {
        (self.conv.capacity() + self.s.capacity()) * 4
            + self
                .checkpoints
                .values()
                .chain(self.last_start.as_ref().map(|(_, v)| v))
                .map(|c| c.capacity() * 4)
                .sum::<usize>()
    }

    fn snapshot(&self) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.conv.len() + self.s.len());
        v.extend_from_slice(&self.conv);
        v.extend_from_slice(&self.s);
        v
    }

    /// Floats of the live state ([`DeltaState::live`]): the convolution's rows, then every
    /// head's matrix.
    pub(crate) fn live_floats(&self) -> usize {
        self.conv.len() + self.s.len()
    }

    /// The live state at [`DeltaState::len`].
    pub(crate) fn live(&self) -> Vec<f32> {
        self.snapshot()
    }

    /// Takes a live state shipped from another node at `pos` (of [`DeltaState::live_floats`]
    /// floats; the caller checks): earlier checkpoints go, `pos` becomes one (a turn end), so
    /// a later rewind to it is exact.
    pub(crate) fn set_live(&mut self, pos: usize, state: &[f32]) {
        let (c, s) = state.split_at(self.conv.len());
        self.conv.copy_from_slice(c);
        self.s.copy_from_slice(s);
        self.len = pos;
        self.checkpoints.clear();
        self.turn_ends.clear();
        self.last_start = None;
        if pos > 0 {
            self.checkpoints.insert(pos, state.to_vec());
            self.turn_ends.push_back(pos);
        }
    }

    /// The latest position `<= p` this state can be cut back to without recomputing: its
    /// length, the start of the latest forward, a checkpoint, or 0.
    pub fn restorable(&self, p: usize) -> usize {
        if p >= self.len {
            return self.len;
        }
        let cp = self.checkpoints.range(..=p).next_back().map(|(&c, _)| c);
        let start = self
            .last_start
            .as_ref()
            .map(|(c, _)| *c)
            .filter(|&c| c <= p);
        cp.max(start).unwrap_or(0)
    }

    /// Cuts the state back to [`DeltaState::restorable`]`(p)`.
    pub fn truncate(&mut self, p: usize) {
        let p = self.restorable(p);
        if p == self.len {
            return;
        }
        let snap = match (&self.last_start, self.checkpoints.get(&p)) {
            (_, Some(v)) => Some(v.clone()),
            (Some((c, v)), None) if *c == p => Some(v.clone()),
            _ => None,
        };
        match snap {
            Some(v) => {
                let (c, s) = v.split_at(self.conv.len());
                self.conv.copy_from_slice(c);
                self.s.copy_from_slice(s);
            }
            None => {
                // p == 0: the empty state.
                self.conv.iter_mut().for_each(|x| *x = 0.0);
                self.s.iter_mut().for_each(|x| *x = 0.0);
            }
        }
        self.len = p;
        self.checkpoints.retain(|&c, _| c <= p);
        self.turn_ends.retain(|&c| c <= p);
        if self.last_start.as_ref().is_some_and(|(c, _)| *c > p) {
            self.last_start = None;
        }
    }

    /// Scratch floats [`DeltaState::forward`] needs for `seq` rows.
    pub fn scratch_len(shape: &DeltaNetShape, seq: usize) -> usize {
        let (d, kh, vh) = (
            shape.head_dim as usize,
            shape.k_heads as usize,
            shape.v_heads as usize,
        );
        let ch = (2 * kh + vh) * d;
        seq * (ch + 2 * vh * d + 2 * vh) + ch + d
    }

    /// Runs the layer over `seq` normed rows `xn` (seq, hidden) at positions
    /// `len..len + seq`, advancing the state; writes the layer's output to `out`
    /// (seq, hidden). `buf` is scratch of [`DeltaState::scratch_len`] floats.
    pub fn forward(
        &mut self,
        w: &DeltaNetWeights<'_>,
        xn: &[f32],
        seq: usize,
        eps: f32,
        buf: &mut [f32],
        out: &mut [f32],
    ) {
        let (d, kh, vh, ch) = (self.d, self.k_heads, self.v_heads, self.channels);
        let vd = vh * d;
        let (qkv, rest) = buf.split_at_mut(seq * ch);
        let (z, rest) = rest.split_at_mut(seq * vd);
        let (beta, rest) = rest.split_at_mut(seq * vh);
        let (alpha, rest) = rest.split_at_mut(seq * vh);
        let (core, rest) = rest.split_at_mut(seq * vd);
        let (cur, rest) = rest.split_at_mut(ch);
        let delta = &mut rest[..d];
        linears(
            &mut [
                (&w.qkv, &mut *qkv),
                (&w.gate, &mut *z),
                (&w.beta, &mut *beta),
                (&w.alpha, &mut *alpha),
            ],
            xn,
            seq,
        );
        self.last_start = Some((self.len, self.snapshot()));
        let keep = self.kernel - 1;
        let scale = 1.0 / (d as f32).sqrt();
        for t in 0..seq {
            let x = &qkv[t * ch..(t + 1) * ch];
            // Causal convolution over the kept rows and this one, then SiLU.
            for (c, o) in cur.iter_mut().enumerate() {
                let taps = &w.conv[c * self.kernel..(c + 1) * self.kernel];
                let mut sum = 0.0f32;
                for (r, &tap) in taps[..keep].iter().enumerate() {
                    sum += self.conv[r * ch + c] * tap;
                }
                sum += x[c] * taps[keep];
                *o = silu(sum);
            }
            if keep > 0 {
                self.conv.copy_within(ch.., 0);
                self.conv[(keep - 1) * ch..].copy_from_slice(x);
            }
            let (qk, v) = cur.split_at_mut(2 * kh * d);
            qk.chunks_exact_mut(d).for_each(|h| l2_norm(h, eps));
            let (q, k) = qk.split_at(kh * d);
            for h in 0..vh {
                let kk = h % kh;
                let (qh, khd) = (&q[kk * d..(kk + 1) * d], &k[kk * d..(kk + 1) * d]);
                let vhd = &v[h * d..(h + 1) * d];
                let b = sigmoid(beta[t * vh + h]);
                let decay = exp(w.a[h] * softplus(alpha[t * vh + h] + w.dt_bias[h]));
                let m = &mut self.s[h * d * d..(h + 1) * d * d];
                m.iter_mut().for_each(|x| *x *= decay);
                for (j, dj) in delta.iter_mut().enumerate() {
                    *dj = (vhd[j] - dot_f32(&m[j * d..(j + 1) * d], khd)) * b;
                }
                for (row, &dj) in m.chunks_exact_mut(d).zip(delta.iter()) {
                    row.iter_mut().zip(khd).for_each(|(s, &ki)| *s += ki * dj);
                }
                let o = &mut core[t * vd + h * d..t * vd + (h + 1) * d];
                for (j, oj) in o.iter_mut().enumerate() {
                    *oj = dot_f32(&m[j * d..(j + 1) * d], qh) * scale;
                }
            }
            self.len += 1;
            if self.policy.every > 0 && self.len.is_multiple_of(self.policy.every) {
                let snap = self.snapshot();
                self.checkpoints.insert(self.len, snap);
            }
        }
        if seq > 1 && self.policy.turns > 0 {
            let snap = self.snapshot();
            self.checkpoints.insert(self.len, snap);
            self.turn_ends.push_back(self.len);
            while self.turn_ends.len() > self.policy.turns {
                if let Some(old) = self.turn_ends.pop_front() {
                    let every = self.policy.every;
                    if every == 0 || !old.is_multiple_of(every) {
                        self.checkpoints.remove(&old);
                    }
                }
            }
        }
        // The gated norm: each value head's output RMSNormed, times silu(z).
        for (o, g) in core.chunks_exact_mut(d).zip(z.chunks_exact(d)) {
            rmsnorm_inplace(o, w.norm, eps);
            o.iter_mut().zip(g).for_each(|(o, &g)| *o *= silu(g));
        }
        linear(&w.out, core, seq, out);
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `ln(1 + e^x)`, `x` itself above 20 (llama.cpp's cut).
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        libm::logf(1.0 + exp(x))
    }
}

/// `x / sqrt(sum(x^2) + eps)` (llama.cpp's GDN L2 norm: an RMS norm with `eps / n`, scaled by
/// `1 / sqrt(n)`).
fn l2_norm(x: &mut [f32], eps: f32) {
    let n = x.len() as f64;
    let ss: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let scale = (1.0 / (ss / n + eps as f64 / n).sqrt()) as f32 * (1.0 / (n as f32).sqrt());
    x.iter_mut().for_each(|v| *v *= scale);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(policy: Checkpoints) -> DeltaState {
        let shape = DeltaNetShape {
            head_dim: 2,
            k_heads: 1,
            v_heads: 2,
        };
        DeltaState::new(&shape, 3, policy)
    }

    /// Advances the state by hand: each step sets every matrix entry to the position.
    fn step(s: &mut DeltaState, seq: usize) {
        s.last_start = Some((s.len, s.snapshot()));
        for _ in 0..seq {
            s.len += 1;
            let p = s.len as f32;
            s.s.iter_mut().for_each(|x| *x = p);
            if s.policy.every > 0 && s.len.is_multiple_of(s.policy.every) {
                let snap = s.snapshot();
                s.checkpoints.insert(s.len, snap);
            }
        }
        if seq > 1 {
            let snap = s.snapshot();
            s.checkpoints.insert(s.len, snap);
            s.turn_ends.push_back(s.len);
        }
    }

    #[test]
    fn cuts_back_to_a_checkpoint_or_the_latest_forwards_start() {
        let mut s = state(Checkpoints {
            window: 4,
            every: 8,
            turns: 4,
        });
        step(&mut s, 5); // a prompt: checkpoint at 5
        for _ in 0..6 {
            step(&mut s, 1); // 11; checkpoint at 8
        }
        step(&mut s, 3); // a draft of 3 from 11: start 11, turn end 14
        assert_eq!(s.len(), 14);
        assert_eq!(s.restorable(13), 11, "the draft's start");
        assert_eq!(s.restorable(10), 8);
        assert_eq!(s.restorable(7), 5);
        assert_eq!(s.restorable(4), 0);
        s.truncate(12);
        assert_eq!((s.len(), s.s[0]), (11, 11.0));
        s.truncate(9);
        assert_eq!((s.len(), s.s[0]), (8, 8.0));
        s.truncate(3);
        assert_eq!((s.len(), s.s[0], s.checkpoint_count()), (0, 0.0, 0));
    }
}
