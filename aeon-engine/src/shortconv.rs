//! LFM2's gated short convolution and the per-session state it carries between tokens.
//!
//! One layer, for the normed input `n` of each position (llama.cpp `lfm2`,
//! `build_shortconv_block`): `[b, c, x] = in_proj · n`; `u = b * x`; a depthwise causal
//! convolution over the last `kernel` values of `u` per channel,
//! `conv_t = sum_k u[t - kernel + 1 + k] * w[k]` (oldest tap first, zeros before the first
//! token); `y = c * conv`; the layer's output is `out_proj · y`. Every position is computed the
//! same way whether it arrives alone or in a chunk, so chunked prefill equals token by token
//! bit for bit.
//!
//! The state is the last `kernel - 1` rows of `u`. A KV cache can be cut back to any position;
//! this state cannot, so [`ConvState`] keeps enough to restore it (see [`Checkpoints`]).

use std::collections::{BTreeMap, VecDeque};

use super::kernels::linear;
use super::weights::ShortConvWeights;

/// Which earlier states a recurrent layer keeps, so that a session cut back (a new chat turn
/// sharing a prefix, lookup decoding rejecting drafts, a retried turn) restores its state
/// instead of recomputing the whole prefix.
///
/// Memory per short-convolution layer, `hidden` floats per row: `window + kernel - 1` rows of
/// recent inputs, plus `kernel - 1` rows per checkpoint (one every `every` positions, and one
/// at the end of each of the last `turns` multi-token forwards).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoints {
    /// Every position among the last `window` can be restored exactly (decode steps, drafts).
    pub window: usize,
    /// A checkpoint at every multiple of `every` positions (0: none).
    pub every: usize,
    /// A checkpoint at the end of each of the last `turns` forwards of more than one row
    /// (prompts: the ends of chat turns).
    pub turns: usize,
}

impl Default for Checkpoints {
    fn default() -> Self {
        Checkpoints {
            window: 64,
            every: 256,
            turns: 8,
        }
    }
}

/// One short-convolution layer's state in one session.
pub struct ConvState {
    hidden: usize,
    /// Rows of `u` the state holds: `kernel - 1`.
    keep: usize,
    /// Recent rows of `u`, `(rows, hidden)`. Row `i` is "virtual row" `first + i`, and
    /// virtual row `v` is the input of position `v - keep` (the first `keep` virtual rows are
    /// the zeros before the first token).
    hist: Vec<f32>,
    first: usize,
    /// Positions processed.
    len: usize,
    /// Position -> the `keep` rows before it.
    checkpoints: BTreeMap<usize, Vec<f32>>,
    /// Positions of the turn-end checkpoints, oldest first.
    turn_ends: VecDeque<usize>,
    policy: Checkpoints,
}

impl ConvState {
    /// The state before the first token.
    pub fn new(hidden: usize, kernel: usize, policy: Checkpoints) -> ConvState {
        let keep = kernel.saturating_sub(1);
        ConvState {
            hidden,
            keep,
            hist: vec![0.0; keep * hidden],
            first: 0,
            len: 0,
            checkpoints: BTreeMap::new(),
            turn_ends: VecDeque::new(),
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

    /// Checkpoints held (the window of recent rows aside).
    pub fn checkpoint_count(&self) -> usize {
        self.checkpoints.len()
    }

    /// Bytes allocated: the recent rows and the checkpoints.
    pub fn bytes(&self) -> usize {
        self.hist.capacity() * 4
            + self
                .checkpoints
                .values()
                .map(|c| c.capacity() * 4)
                .sum::<usize>()
    }

    /// The `keep` rows before position `p`, when still held.
    fn rows_before(&self, p: usize) -> Option<&[f32]> {
        let v = p.checked_sub(self.first)?;
        self.hist
            .get(v * self.hidden..(v + self.keep) * self.hidden)
    }

    /// The latest position `<= p` this state can be cut back to without recomputing:
    /// `p` itself when it is among the recent rows, else the latest checkpoint before it,
    /// else 0 (the empty state). Never more than [`ConvState::len`].
    pub fn restorable(&self, p: usize) -> usize {
        let p = p.min(self.len);
        if p >= self.first {
            return p;
        }
        self.checkpoints
            .range(..=p)
            .next_back()
            .map(|(&c, _)| c)
            .unwrap_or(0)
    }

    /// Cuts the state back to position `p`, which must be [`ConvState::restorable`] (the
    /// session checks); anything else restores the latest state before it.
    pub fn truncate(&mut self, p: usize) {
        let p = self.restorable(p);
        let h = self.hidden;
        if p >= self.first {
            self.hist.truncate((p + self.keep - self.first) * h);
        } else {
            let rows = match self.checkpoints.get(&p) {
                Some(rows) => rows.clone(),
                None => vec![0.0; self.keep * h], // p == 0
            };
            self.hist = rows;
            self.first = p;
        }
        self.len = p;
        self.checkpoints.retain(|&c, _| c <= p);
        self.turn_ends.retain(|&c| c <= p);
    }

    /// Floats of the live state ([`ConvState::live`]): `(kernel - 1) * hidden`.
    pub(crate) fn live_floats(&self) -> usize {
        self.keep * self.hidden
    }

    /// The live state: the `kernel - 1` rows before position [`ConvState::len`].
    pub(crate) fn live(&self) -> Vec<f32> {
        self.rows_before(self.len)
            .map(<[f32]>::to_vec)
            .unwrap_or_default()
    }

    /// Takes a live state shipped from another node at `pos` (of [`ConvState::live_floats`]
    /// floats; the caller checks): earlier checkpoints go, `pos` becomes one, so a later
    /// rewind to it is exact.
    pub(crate) fn set_live(&mut self, pos: usize, rows: &[f32]) {
        self.hist = rows.to_vec();
        self.first = pos;
        self.len = pos;
        self.checkpoints.clear();
        self.turn_ends.clear();
        if pos > 0 {
            self.checkpoints.insert(pos, rows.to_vec());
        }
    }

    /// Runs the layer over `seq` normed rows `xn` (seq, hidden) at positions
    /// `len..len + seq`, advancing the state; writes the layer's output to `out` (seq, hidden).
    /// `bcx` (seq, 3 * hidden) and `y` (seq, hidden) are scratch.
    pub fn forward(
        &mut self,
        w: &ShortConvWeights<'_>,
        xn: &[f32],
        seq: usize,
        bcx: &mut [f32],
        y: &mut [f32],
        out: &mut [f32],
    ) {
        let (h, keep) = (self.hidden, self.keep);
        let kernel = keep + 1;
        linear(&w.in_proj, xn, seq, bcx);
        let pos = self.len;
        // u = b * x, appended after the state's rows.
        let base = self.hist.len() / h; // local row of position `pos`'s input
        self.hist.reserve(seq * h);
        for row in bcx.chunks_exact(3 * h).take(seq) {
            let (b, x) = (&row[..h], &row[2 * h..]);
            self.hist.extend(b.iter().zip(x).map(|(b, x)| b * x));
        }
        for t in 0..seq {
            let c = &bcx[t * 3 * h + h..t * 3 * h + 2 * h];
            // Rows of positions pos + t - keep ..= pos + t.
            let win = &self.hist[(base + t - keep) * h..(base + t + 1) * h];
            for (ch, (yo, &cg)) in y[t * h..(t + 1) * h].iter_mut().zip(c).enumerate() {
                let taps = &w.conv[ch * kernel..(ch + 1) * kernel];
                let mut sum = 0.0f32;
                for (k, &tap) in taps.iter().enumerate() {
                    sum += win[k * h + ch] * tap;
                }
                *yo = cg * sum;
            }
        }
        linear(&w.out_proj, y, seq, out);
        self.len = pos + seq;
        self.checkpoint(pos, seq);
    }

    /// Records the checkpoints among positions `pos + 1 ..= pos + seq` and lets go of rows
    /// older than the window.
    fn checkpoint(&mut self, pos: usize, seq: usize) {
        let end = pos + seq;
        let every = self.policy.every;
        let snap = |s: &Self, p: usize| s.rows_before(p).map(<[f32]>::to_vec);
        if let Some(n) = pos.checked_div(every) {
            let mut p = (n + 1) * every;
            while p <= end {
                // Older than the window: kept as a checkpoint, or restorable from the rows.
                if let Some(rows) = snap(self, p) {
                    self.checkpoints.insert(p, rows);
                }
                p += every;
            }
        }
        if seq > 1 && self.policy.turns > 0 {
            if let Some(rows) = snap(self, end) {
                self.checkpoints.insert(end, rows);
                self.turn_ends.push_back(end);
            }
            while self.turn_ends.len() > self.policy.turns {
                if let Some(old) = self.turn_ends.pop_front() {
                    if every == 0 || old % every != 0 {
                        self.checkpoints.remove(&old);
                    }
                }
            }
        }
        // Keep the rows of the last `window` positions (and the state before them); drop the
        // rest once they are as many again, so trimming costs O(1) per position.
        let h = self.hidden;
        let want = self.policy.window.min(self.len);
        let keep_from = self.len - want; // earliest position still restorable from rows
        let drop = keep_from.saturating_sub(self.first);
        if drop > 0 && drop >= want + self.keep {
            self.hist.drain(..drop * h);
            self.first += drop;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state driven by hand: rows of `u` appended directly.
    fn push(s: &mut ConvState, rows: &[f32], seq: usize) {
        let pos = s.len;
        s.hist.extend_from_slice(rows);
        s.len = pos + seq;
        s.checkpoint(pos, seq);
    }

    #[test]
    fn cuts_back_exactly_within_the_window_and_to_checkpoints_beyond_it() {
        let policy = Checkpoints {
            window: 4,
            every: 8,
            turns: 1,
        };
        let mut s = ConvState::new(1, 3, policy);
        // A prompt of 5, then 20 single steps: row of position p is p + 1.
        push(&mut s, &[1.0, 2.0, 3.0, 4.0, 5.0], 5);
        for p in 5..25 {
            push(&mut s, &[p as f32 + 1.0], 1);
        }
        assert_eq!(s.len(), 25);
        // Within the window: exact.
        for p in 21..=25 {
            assert_eq!(s.restorable(p), p);
        }
        // Rows go in batches of window + keep: positions 18.. are still held.
        assert_eq!(s.restorable(18), 18);
        // Beyond them: the checkpoints at 16 and 8, the prompt's end at 5, else 0.
        assert_eq!(s.restorable(17), 16);
        assert_eq!(s.restorable(9), 8);
        assert_eq!(s.restorable(7), 5);
        assert_eq!(s.restorable(4), 0);
        s.truncate(16);
        assert_eq!(s.rows_before(16), Some(&[15.0, 16.0][..]));
        assert_eq!((s.len(), s.restorable(20)), (16, 16));
        s.truncate(5);
        assert_eq!(s.rows_before(5), Some(&[4.0, 5.0][..]));
        s.truncate(0);
        assert_eq!(s.rows_before(0), Some(&[0.0, 0.0][..]));
        assert_eq!(s.checkpoint_count(), 0);
    }

    #[test]
    fn memory_stays_bounded_by_the_window() {
        let mut s = ConvState::new(8, 3, Checkpoints::default());
        for _ in 0..10_000 {
            push(&mut s, &[1.0; 8], 1);
        }
        // At most 2 * (window + keep) rows, plus one checkpoint per `every`.
        let rows = s.hist.len() / 8;
        assert!(rows <= 2 * (64 + 2), "{rows} rows");
        assert_eq!(s.checkpoint_count(), 10_000 / 256);
    }
}
