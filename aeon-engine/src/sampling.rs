//! Choosing the next token from logits: logit bias, repetition, presence and frequency
//! penalties, greedy, temperature, top-k, min-p, top-p, the log-probabilities a client may
//! ask for, and a small seeded RNG so that the same seed gives the same text.
//!
//! Order of operations (as llama.cpp's default chain): logit bias -> repetition penalty over
//! the recent history -> presence and frequency penalties over the generated tokens -> (the
//! log-probabilities are taken here) -> greedy when `temperature <= 0` -> top-k -> min-p ->
//! softmax at `temperature` -> top-p -> draw. Every step is a pure function over logits or a
//! candidate list so it can be tested alone.
//!
//! One home for the gateway and the stations: a chain's exit samples with the state the
//! gateway sends ([`SamplerState`]), so a seed gives the same ids whether the gateway or the
//! exit draws them.

/// How to sample. `temperature <= 0` is greedy (argmax after the repetition penalty).
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability sums to at least `p`; 1.0 disables.
    pub top_p: f32,
    /// Divide positive (multiply negative) logits of recently seen tokens by this; 1.0 disables.
    pub repeat_penalty: f32,
    /// How many of the most recent tokens the repetition penalty looks at.
    pub repeat_last_n: usize,
    /// RNG seed.
    pub seed: u64,
    /// llama.cpp's min-p: keep the tokens whose probability (at temperature 1, after top-k)
    /// is at least `min_p` times the most likely one's; 0 disables.
    pub min_p: f32,
    /// OpenAI's presence penalty: subtracted once from the logit of every token generated so
    /// far (the prompt does not count); 0 disables.
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted from a token's logit once per time it was
    /// generated so far; 0 disables.
    pub frequency_penalty: f32,
    /// `(token id, bias)` added to the logits before anything else; a bias of -100 (or
    /// below) bans the token outright.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
        }
    }
}

/// Why sampling parameters are refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("top_p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("repeat penalty must be a finite number > 0, got {0}")]
    RepeatPenalty(f32),
    #[error("min_p must be between 0 and 1, got {0}")]
    MinP(f32),
    #[error("presence_penalty must be between -2 and 2, got {0}")]
    PresencePenalty(f32),
    #[error("frequency_penalty must be between -2 and 2, got {0}")]
    FrequencyPenalty(f32),
    #[error("logit_bias for token {0} must be between -100 and 100, got {1}")]
    LogitBias(u32, f32),
}

impl SamplingParams {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !self.repeat_penalty.is_finite() || self.repeat_penalty <= 0.0 {
            return Err(SamplingError::RepeatPenalty(self.repeat_penalty));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinP(self.min_p));
        }
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(SamplingError::PresencePenalty(self.presence_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(SamplingError::FrequencyPenalty(self.frequency_penalty));
        }
        if let Some(&(id, b)) = self
            .logit_bias
            .iter()
            .find(|(_, b)| !(-100.0..=100.0).contains(b))
        {
            return Err(SamplingError::LogitBias(id, b));
        }
        Ok(())
    }

    /// True when sampling is plain argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// PCG32 (XSH-RR, O'Neill 2014): 64-bit state, 32-bit output. Small, fast and fully
/// determined by its seed, which is all sampling needs.
#[derive(Clone, Debug)]
pub struct Pcg32 {
    state: u64,
    inc: u64,
}

impl Pcg32 {
    const MUL: u64 = 6364136223846793005;

    /// A generator seeded with `seed` (stream fixed).
    pub fn new(seed: u64) -> Pcg32 {
        let mut r = Pcg32 {
            state: 0,
            inc: (0xda3e39cb94b95bdb << 1) | 1,
        };
        r.next_u32();
        r.state = r.state.wrapping_add(seed);
        r.next_u32();
        r
    }

    /// The next 32 random bits.
    pub fn next_u32(&mut self) -> u32 {
        let old = self.state;
        self.state = old.wrapping_mul(Self::MUL).wrapping_add(self.inc);
        let xorshifted = (((old >> 18) ^ old) >> 27) as u32;
        let rot = (old >> 59) as u32;
        xorshifted.rotate_right(rot)
    }

    /// Uniform in `[0, 1)` with 24 bits of precision.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 * (1.0 / (1u32 << 24) as f32)
    }
}

/// Greedy decoding's pick: the engine's one definition (the first on ties).
pub use crate::ops::argmax;

/// Applies the repetition penalty in place to every distinct id in `recent` (CTRL paper
/// rule: positive logits are divided, negative multiplied).
pub fn apply_repeat_penalty(logits: &mut [f32], recent: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    let mut seen: Vec<u32> = recent.to_vec();
    seen.sort_unstable();
    seen.dedup();
    for id in seen {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = if *l > 0.0 { *l / penalty } else { *l * penalty };
        }
    }
}

/// Adds each `(id, bias)` to its logit; a bias of -100 or below bans the token (its logit
/// becomes -inf, so neither greedy nor sampling can pick it while another token is left).
pub fn apply_logit_bias(logits: &mut [f32], bias: &[(u32, f32)]) {
    for &(id, b) in bias {
        if let Some(l) = logits.get_mut(id as usize) {
            *l = if b <= -100.0 {
                f32::NEG_INFINITY
            } else {
                *l + b
            };
        }
    }
}

/// OpenAI's presence and frequency penalties: `logit[j] -= count[j] * frequency +
/// (count[j] > 0) * presence`, where `count[j]` is how often `j` was generated so far.
pub fn apply_presence_frequency(
    logits: &mut [f32],
    counts: &std::collections::HashMap<u32, u32>,
    presence: f32,
    frequency: f32,
) {
    if presence == 0.0 && frequency == 0.0 {
        return;
    }
    for (&id, &n) in counts {
        if let Some(l) = logits.get_mut(id as usize) {
            *l -= n as f32 * frequency + if n > 0 { presence } else { 0.0 };
        }
    }
}

/// One sampled token's log-probability and, best first, the `n` most likely alternatives
/// at that step (`n` as asked, the sampled token possibly among them).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// Log-probabilities of `id` and of the `n` most likely tokens under `logits` at
/// temperature 1 (a log-softmax over the whole vocabulary). Taken after the logit bias and
/// the penalties and before temperature and truncation, as vLLM's processed logprobs: the
/// distribution the sampler starts from. A banned token's is -inf.
pub fn logprobs(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let lp = |i: u32| {
        logits
            .get(i as usize)
            .map_or(f32::NEG_INFINITY, |&l| l - lse)
    };
    let cands = logits
        .iter()
        .enumerate()
        .map(|(i, &l)| Candidate { id: i as u32, p: l })
        .collect();
    let top = if n == 0 {
        Vec::new()
    } else {
        top_k(cands, n).iter().map(|c| (c.id, lp(c.id))).collect()
    };
    TokenLogprob {
        id,
        logprob: lp(id),
        top,
    }
}

/// A token and its logit (later, its probability).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub p: f32,
}

/// Keeps the `k` largest, sorted best first (`k == 0` or `k >= len` keeps all, still sorted).
pub fn top_k(mut c: Vec<Candidate>, k: usize) -> Vec<Candidate> {
    let by_p = |a: &Candidate, b: &Candidate| b.p.total_cmp(&a.p).then(a.id.cmp(&b.id));
    if k > 0 && k < c.len() {
        c.select_nth_unstable_by(k - 1, by_p);
        c.truncate(k);
    }
    c.sort_unstable_by(by_p);
    c
}

/// llama.cpp's min-p on logits: keeps the tokens whose probability at temperature 1 is at
/// least `min_p` times the best one's, i.e. `logit >= max_logit + ln(min_p)` (at least one
/// kept). `c` must be sorted best first ([`top_k`]); `min_p <= 0` keeps all.
pub fn min_p(mut c: Vec<Candidate>, min_p: f32) -> Vec<Candidate> {
    if min_p <= 0.0 || c.is_empty() {
        return c;
    }
    let floor = c[0].p + min_p.ln();
    let keep = c.iter().take_while(|x| x.p >= floor).count();
    c.truncate(keep.max(1));
    c
}

/// Turns logits into probabilities at `temperature` (> 0), in place.
pub fn softmax(c: &mut [Candidate], temperature: f32) {
    let max = c.iter().map(|x| x.p).fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for x in c.iter_mut() {
        x.p = ((x.p - max) / temperature).exp();
        sum += x.p as f64;
    }
    for x in c.iter_mut() {
        x.p = (x.p as f64 / sum) as f32;
    }
}

/// Keeps the smallest best-first prefix whose probabilities sum to at least `p` (at least
/// one), renormalised. `c` must be sorted best first.
pub fn top_p(mut c: Vec<Candidate>, p: f32) -> Vec<Candidate> {
    if p >= 1.0 {
        return c;
    }
    let mut acc = 0.0f32;
    let mut keep = c.len();
    for (i, x) in c.iter().enumerate() {
        acc += x.p;
        if acc >= p {
            keep = i + 1;
            break;
        }
    }
    c.truncate(keep.max(1));
    let sum: f32 = c.iter().map(|x| x.p).sum();
    for x in c.iter_mut() {
        x.p /= sum;
    }
    c
}

/// Draws from probabilities using a uniform `u` in `[0, 1)`.
pub fn draw(c: &[Candidate], u: f32) -> u32 {
    let mut acc = 0.0f32;
    for x in c {
        acc += x.p;
        if u < acc {
            return x.id;
        }
    }
    c.last().map(|x| x.id).unwrap_or(0)
}

/// Where a [`Sampler`] is between two picks, for a sampler elsewhere to continue from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SamplerState {
    /// The PCG32 state.
    pub rng: u64,
    /// The last `repeat_last_n` tokens of the history (prompt and generated).
    pub recent: Vec<u32>,
    /// How often each generated token was generated, sorted by id.
    pub counts: Vec<(u32, u32)>,
}

/// A sampler: parameters, RNG state, the token history for the repetition penalty and the
/// generated tokens' counts for the presence and frequency penalties.
#[derive(Clone, Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: Pcg32,
    history: Vec<u32>,
    counts: std::collections::HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler for `params`; the RNG is seeded with `params.seed`.
    pub fn new(params: SamplingParams) -> Sampler {
        Sampler {
            rng: Pcg32::new(params.seed),
            params,
            history: Vec::new(),
            counts: Default::default(),
        }
    }

    /// Adds tokens the penalty should see (e.g. the prompt) without sampling.
    pub fn observe(&mut self, tokens: &[u32]) {
        self.history.extend_from_slice(tokens);
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// What another sampler needs to pick the next tokens exactly as this one would: the
    /// RNG state, the history the repetition penalty looks at, the generated tokens' counts.
    pub fn state(&self) -> SamplerState {
        let n = self.params.repeat_last_n;
        let mut counts: Vec<(u32, u32)> = self.counts.iter().map(|(&i, &c)| (i, c)).collect();
        counts.sort_unstable();
        SamplerState {
            rng: self.rng.state,
            recent: self.history[self.history.len().saturating_sub(n)..].to_vec(),
            counts,
        }
    }

    /// A sampler that continues from `state` (made by [`Sampler::state`] elsewhere).
    pub fn resume(params: SamplingParams, state: SamplerState) -> Sampler {
        Sampler {
            rng: Pcg32 {
                state: state.rng,
                ..Pcg32::new(0)
            },
            params,
            history: state.recent,
            counts: state.counts.into_iter().collect(),
        }
    }

    /// Records `id` as picked elsewhere (by a chain's exit) and takes the RNG state that pick
    /// left: afterwards this sampler is where the one that picked is.
    pub fn record(&mut self, id: u32, rng: u64) {
        self.history.push(id);
        *self.counts.entry(id).or_default() += 1;
        self.rng.state = rng;
    }

    /// The logit bias and the penalties, in place: what every pick starts from.
    pub fn adjust(&self, logits: &mut [f32]) {
        let p = &self.params;
        apply_logit_bias(logits, &p.logit_bias);
        let recent = &self.history[self.history.len().saturating_sub(p.repeat_last_n)..];
        apply_repeat_penalty(logits, recent, p.repeat_penalty);
        apply_presence_frequency(
            logits,
            &self.counts,
            p.presence_penalty,
            p.frequency_penalty,
        );
    }

    /// The `k` best tokens of each of `rows` after the bias and the penalties, best first (the
    /// first on ties), without picking: for a caller that masks them (a grammar) and picks
    /// greedily itself. Row `i + 1` is adjusted as if `drafts[i]` was picked for row `i`
    /// (it counts only then); minus-infinity candidates are left out.
    pub fn candidates(
        &self,
        rows: &mut [f32],
        vocab: usize,
        drafts: &[u32],
        k: usize,
    ) -> Vec<Vec<(u32, f32)>> {
        let mut s = self.clone();
        let mut out = Vec::new();
        if vocab == 0 {
            return out;
        }
        for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
            s.adjust(row);
            let c = row
                .iter()
                .enumerate()
                .map(|(id, &p)| Candidate { id: id as u32, p })
                .collect();
            out.push(
                top_k(c, k)
                    .into_iter()
                    .filter(|c| c.p > f32::NEG_INFINITY)
                    .map(|c| (c.id, c.p))
                    .collect(),
            );
            if let Some(&d) = drafts.get(i) {
                s.history.push(d);
                *s.counts.entry(d).or_default() += 1;
            }
        }
        out
    }

    /// The RNG state (for [`Sampler::record`]).
    pub fn rng_state(&self) -> u64 {
        self.rng.state
    }

    /// Picks from `rows` logit rows (`(rows, vocab)`, row-major, modified in place) where
    /// `drafts[i]` was proposed for row `i`: the verification of a lookup trip. Stops after
    /// the first pick that is not the row's draft (a correction, or the token after the last
    /// draft); the picks with their log-probabilities (`top` as in [`Sampler::pick`]).
    pub fn pick_rows(
        &mut self,
        rows: &mut [f32],
        vocab: usize,
        drafts: &[u32],
        top: Option<usize>,
    ) -> Vec<(u32, Option<TokenLogprob>)> {
        let mut out = Vec::new();
        if vocab == 0 {
            return out;
        }
        for (i, row) in rows.chunks_exact_mut(vocab).enumerate() {
            let draft = drafts.get(i).copied();
            let (id, lp) = self.pick(row, draft, top);
            out.push((id, lp));
            if draft != Some(id) {
                break;
            }
        }
        out
    }

    /// Picks the next token from `logits` (modified in place by the bias and penalties) and
    /// records it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        self.pick(logits, None, None).0
    }

    /// [`Sampler::sample`], with the token's log-probability and its `top` best alternatives
    /// when `top` is `Some` ([`logprobs`]).
    pub fn sample_with_logprobs(
        &mut self,
        logits: &mut [f32],
        top: Option<usize>,
    ) -> (u32, Option<TokenLogprob>) {
        self.pick(logits, None, top)
    }

    /// [`Sampler::sample`] where a drafted token `draft` was proposed for this position
    /// (speculative decoding, moonshine's prompt lookup); returns the token to keep, which is
    /// `draft` when it is accepted. Greedy: the argmax, so a draft is kept exactly when plain
    /// decoding would have picked it. Sampling: standard speculative sampling for a
    /// deterministic proposal: keep `draft` with probability p(draft); otherwise draw from p
    /// with `draft` removed and renormalised. The kept token is distributed as p either way.
    pub fn sample_or_accept(&mut self, logits: &mut [f32], draft: Option<u32>) -> u32 {
        self.pick(logits, draft, None).0
    }

    /// The one sampling step behind the three above: bias and penalties, then greedy or the
    /// truncated draw (accepting or resampling around `draft`), the log-probabilities when
    /// asked, and the history.
    pub fn pick(
        &mut self,
        logits: &mut [f32],
        draft: Option<u32>,
        top: Option<usize>,
    ) -> (u32, Option<TokenLogprob>) {
        self.adjust(logits);
        let p = &self.params;
        let id = if p.is_greedy() {
            argmax(logits)
        } else {
            let c: Vec<Candidate> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| Candidate { id: i as u32, p: l })
                .collect();
            let mut c = min_p(top_k(c, p.top_k), p.min_p);
            softmax(&mut c, p.temperature);
            let c = top_p(c, p.top_p);
            match draft {
                None => draw(&c, self.rng.next_f32()),
                Some(d) => accept_or_resample(c, d, &mut self.rng),
            }
        };
        let lp = top.map(|n| logprobs(logits, id, n));
        self.history.push(id);
        *self.counts.entry(id).or_default() += 1;
        (id, lp)
    }
}

/// Speculative sampling's step for a proposal that is certain of `d` (q(d) = 1): keep `d`
/// with probability min(1, p(d) / q(d)) = p(d); else draw from norm(max(0, p - q)), which
/// is p without `d`, renormalised.
fn accept_or_resample(mut c: Vec<Candidate>, d: u32, rng: &mut Pcg32) -> u32 {
    let pd = c.iter().find(|x| x.id == d).map_or(0.0, |x| x.p);
    if rng.next_f32() < pd {
        return d;
    }
    c.retain(|x| x.id != d);
    let rest: f32 = c.iter().map(|x| x.p).sum();
    if c.is_empty() || rest <= 0.0 {
        return d; // p was (numerically) all on d
    }
    c.iter_mut().for_each(|x| x.p /= rest);
    draw(&c, rng.next_f32())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(l: &[f32]) -> Vec<Candidate> {
        l.iter()
            .enumerate()
            .map(|(i, &p)| Candidate { id: i as u32, p })
            .collect()
    }

    #[test]
    fn greedy_is_argmax_first_on_ties() {
        assert_eq!(argmax(&[0.1, 3.0, 3.0, -1.0]), 1);
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [1.0, 2.0, 0.5]), 1);
    }

    #[test]
    fn pcg32_is_deterministic_per_seed_and_uniform() {
        let a: Vec<u32> = {
            let mut r = Pcg32::new(7);
            (0..8).map(|_| r.next_u32()).collect()
        };
        let b: Vec<u32> = {
            let mut r = Pcg32::new(7);
            (0..8).map(|_| r.next_u32()).collect()
        };
        let c: Vec<u32> = {
            let mut r = Pcg32::new(8);
            (0..8).map(|_| r.next_u32()).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Pcg32::new(1);
        let mean: f32 = (0..10_000).map(|_| r.next_f32()).sum::<f32>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "uniform mean {mean}");
    }

    #[test]
    fn repeat_penalty_divides_positive_and_multiplies_negative_once_per_id() {
        let mut l = [2.0, -2.0, 1.0];
        apply_repeat_penalty(&mut l, &[0, 1, 0, 0], 2.0);
        assert_eq!(l, [1.0, -4.0, 1.0]);
    }

    #[test]
    fn top_k_keeps_the_best_sorted() {
        let c = top_k(cands(&[0.1, 5.0, 3.0, 4.0]), 2);
        assert_eq!(c.iter().map(|x| x.id).collect::<Vec<_>>(), [1, 3]);
        assert_eq!(top_k(cands(&[1.0, 2.0]), 0).len(), 2);
    }

    #[test]
    fn softmax_sums_to_one_and_temperature_sharpens() {
        let mut hot = cands(&[1.0, 2.0, 3.0]);
        softmax(&mut hot, 2.0);
        let mut cold = cands(&[1.0, 2.0, 3.0]);
        softmax(&mut cold, 0.5);
        assert!((hot.iter().map(|x| x.p).sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(cold[2].p > hot[2].p);
    }

    #[test]
    fn top_p_keeps_the_nucleus_and_at_least_one() {
        let c = vec![
            Candidate { id: 0, p: 0.5 },
            Candidate { id: 1, p: 0.3 },
            Candidate { id: 2, p: 0.2 },
        ];
        let k = top_p(c.clone(), 0.7);
        assert_eq!(k.len(), 2);
        assert!((k[0].p - 0.625).abs() < 1e-6);
        assert_eq!(top_p(c.clone(), 0.01).len(), 1);
        assert_eq!(top_p(c, 1.0).len(), 3);
    }

    #[test]
    fn draw_follows_cumulative_probability() {
        let c = vec![Candidate { id: 7, p: 0.25 }, Candidate { id: 9, p: 0.75 }];
        assert_eq!(draw(&c, 0.0), 7);
        assert_eq!(draw(&c, 0.2499), 7);
        assert_eq!(draw(&c, 0.25), 9);
        assert_eq!(draw(&c, 0.9999), 9);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 0.8,
                top_k: 40,
                top_p: 0.95,
                seed,
                ..Default::default()
            });
            (0..64)
                .map(|_| s.sample(&mut logits.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    /// Issue 36: the chain's exit samples with the state the gateway sends. A sampler that is
    /// handed over after every pick (resumed from [`Sampler::state`], its picks recorded back
    /// with [`Sampler::record`]) picks exactly the ids of one that ran alone, with penalties,
    /// bias and drafts in play; a state that dropped the RNG or the counts would not.
    #[test]
    fn a_sampler_resumed_from_its_state_picks_the_same_ids() {
        let params = SamplingParams {
            temperature: 0.9,
            top_p: 0.95,
            min_p: 0.01,
            repeat_penalty: 1.3,
            repeat_last_n: 8,
            presence_penalty: 0.7,
            frequency_penalty: 0.9,
            logit_bias: vec![(3, -1.5), (7, 2.0)],
            seed: 11,
            ..Default::default()
        };
        let vocab = 40;
        let row = |t: usize| -> Vec<f32> {
            (0..vocab)
                .map(|i| (((i * 31 + t * 17) % 23) as f32) * 0.25)
                .collect()
        };
        let mut alone = Sampler::new(params.clone());
        alone.observe(&[1, 2, 3]);
        let mut here = Sampler::new(params.clone());
        here.observe(&[1, 2, 3]);
        let (mut ids, mut handed) = (Vec::new(), Vec::new());
        for t in 0..48 {
            // Every third step verifies a draft: two rows, the second scored after it.
            let draft = (t % 3 == 0).then_some((t % 5) as u32);
            let (id, _) = alone.pick(&mut row(t), draft, None);
            ids.push(id);
            let mut rows = row(t);
            if draft.is_some() {
                rows.extend(row(t + 100));
                if draft == Some(id) {
                    ids.push(alone.pick(&mut row(t + 100), None, None).0);
                }
            }
            let mut exit = Sampler::resume(params.clone(), here.state());
            for (id, lp) in exit.pick_rows(&mut rows, vocab, draft.as_slice(), Some(2)) {
                assert_eq!(lp.map(|l| l.id), Some(id));
                here.record(id, exit.rng_state());
                handed.push(id);
            }
        }
        assert_eq!(ids, handed);
        let counts = here.state().counts;
        assert!(counts.windows(2).all(|w| w[0].0 < w[1].0), "sorted by id");
        assert_eq!(here.state().recent.len(), 8);
    }

    /// Speculative sampling with a fixed draft must give each token its probability under
    /// the target distribution, whichever token is drafted (always accepting, or resampling
    /// from the full p on rejection, would not).
    #[test]
    fn accepting_drafts_keeps_the_target_distribution() {
        let logits = [1.0f32, 2.0, 0.5, 1.5, -3.0];
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 4,
            seed: 11,
            ..Default::default()
        };
        // The target: top-4 at temperature 0.9.
        let mut c = top_k(cands(&logits), 4);
        softmax(&mut c, 0.9);
        let mut want = [0.0f64; 5];
        c.iter().for_each(|x| want[x.id as usize] = x.p as f64);
        let n = 200_000;
        for draft in [Some(1), Some(2), Some(4), None] {
            let mut s = Sampler::new(params.clone());
            let mut got = [0usize; 5];
            for _ in 0..n {
                got[s.sample_or_accept(&mut logits.clone(), draft) as usize] += 1;
            }
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                let f = g as f64 / n as f64;
                // 5 standard deviations of a frequency over n draws, at least 1e-3.
                let tol = (5.0 * (w * (1.0 - w) / n as f64).sqrt()).max(1e-3);
                assert!(
                    (f - w).abs() < tol,
                    "draft {draft:?}: token {i} drawn {f:.4}, target {w:.4} (tol {tol:.4})"
                );
            }
        }
        // Greedy keeps a draft exactly when it is the argmax.
        let mut g = Sampler::new(SamplingParams::default());
        assert_eq!(g.sample_or_accept(&mut logits.clone(), Some(1)), 1);
        assert_eq!(g.sample_or_accept(&mut logits.clone(), Some(3)), 1);
    }

    #[test]
    fn logit_bias_adds_and_minus_100_bans() {
        let mut l = [1.0, 2.0, 3.0];
        apply_logit_bias(&mut l, &[(0, 5.0), (2, -100.0), (9, 1.0)]);
        assert_eq!(l, [6.0, 2.0, f32::NEG_INFINITY]);
        // Greedy and sampling never pick a banned token, however strong.
        let ban = |temperature| SamplingParams {
            temperature,
            logit_bias: vec![(2, -100.0)],
            ..Default::default()
        };
        assert_eq!(Sampler::new(ban(0.0)).sample(&mut [1.0, 2.0, 30.0]), 1);
        let mut s = Sampler::new(ban(2.0));
        for _ in 0..200 {
            assert_ne!(s.sample(&mut [1.0, 1.0, 30.0]), 2);
        }
    }

    #[test]
    fn presence_and_frequency_penalties_follow_openai() {
        // count 0 -> 2, 1 -> 1, 2 -> 0; presence 0.5, frequency 0.25:
        // 1 - 2*0.25 - 0.5 = 0, 1 - 0.25 - 0.5 = 0.25, 1.
        let counts = [(0, 2), (1, 1)].into_iter().collect();
        let mut l = [1.0, 1.0, 1.0];
        apply_presence_frequency(&mut l, &counts, 0.5, 0.25);
        assert_eq!(l, [0.0, 0.25, 1.0]);
        // In the sampler they count generated tokens only, not the prompt.
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 2.0,
            ..Default::default()
        });
        s.observe(&[0, 0, 0]);
        assert_eq!(s.sample(&mut [1.0, 0.5]), 0, "the prompt is not penalised");
        assert_eq!(s.sample(&mut [1.0, 0.5]), 1, "1 - 2 < 0.5 once generated");
    }

    #[test]
    fn min_p_keeps_tokens_within_a_factor_of_the_best() {
        // Probabilities proportional to 1, 0.5, 0.05: min_p 0.1 keeps the first two.
        let c = top_k(cands(&[0.0, 0.5f32.ln(), 0.05f32.ln()]), 0);
        let kept = min_p(c.clone(), 0.1);
        assert_eq!(kept.iter().map(|x| x.id).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(min_p(c.clone(), 0.0).len(), 3);
        assert_eq!(min_p(c, 1.0).len(), 1, "the best is always kept");
        // In the sampler, min_p 0.6 leaves only the best of (1, 0.5, 0.05) at any temperature.
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.5,
            min_p: 0.6,
            seed: 3,
            ..Default::default()
        });
        for _ in 0..100 {
            assert_eq!(s.sample(&mut [0.0, 0.5f32.ln(), 0.05f32.ln()]), 0);
        }
    }

    #[test]
    fn logprobs_are_a_log_softmax_with_the_best_alternatives() {
        // softmax(0, ln 3) = (0.25, 0.75).
        let l = [0.0, 3.0f32.ln(), f32::NEG_INFINITY];
        let t = logprobs(&l, 0, 2);
        assert!((t.logprob - 0.25f32.ln()).abs() < 1e-6, "{t:?}");
        assert_eq!(t.top.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 0]);
        assert!((t.top[0].1 - 0.75f32.ln()).abs() < 1e-6, "{t:?}");
        assert_eq!(logprobs(&l, 2, 0).logprob, f32::NEG_INFINITY);
        assert!(logprobs(&l, 1, 0).top.is_empty());
        // The sampler reports them after the bias: banning id 1 leaves id 0 with log 1 = 0.
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(1, -100.0)],
            ..Default::default()
        });
        let (id, lp) = s.sample_with_logprobs(&mut [0.0, 3.0f32.ln()], Some(1));
        assert_eq!(
            (id, lp.map(|t| (t.logprob, t.top))),
            (0, Some((0.0, vec![(0, 0.0)])))
        );
    }

    #[test]
    fn validation_names_the_bad_parameter() {
        for (bad, want) in [
            (
                SamplingParams {
                    min_p: 1.5,
                    ..Default::default()
                },
                SamplingError::MinP(1.5),
            ),
            (
                SamplingParams {
                    presence_penalty: -3.0,
                    ..Default::default()
                },
                SamplingError::PresencePenalty(-3.0),
            ),
            (
                SamplingParams {
                    frequency_penalty: 2.5,
                    ..Default::default()
                },
                SamplingError::FrequencyPenalty(2.5),
            ),
            (
                SamplingParams {
                    logit_bias: vec![(1, 0.0), (7, 101.0)],
                    ..Default::default()
                },
                SamplingError::LogitBias(7, 101.0),
            ),
        ] {
            assert_eq!(bad.validate(), Err(want));
        }
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert_eq!(bad.validate(), Err(SamplingError::TopP(0.0)));
        let bad = SamplingParams {
            temperature: f32::NAN,
            ..Default::default()
        };
        assert!(matches!(bad.validate(), Err(SamplingError::Temperature(_))));
        assert!(SamplingParams::default().validate().is_ok());
    }
}
