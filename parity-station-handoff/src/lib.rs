//! Proves split inference equals monolithic inference, bit for bit.
//!
//! The model is loaded once as a whole; a split is a list of "stations", each a
//! [`Model`] that holds one layer range (the first also the embedding, the last the head):
//! either views of the whole file ([`Model::load`] with [`Holdings`]) or real shard files
//! written by `shard-knot` to a temp dir. The residual is handed from station to station as
//! it would travel on the wire (f32 rows), each station keeping its own KV cache.
//!
//! - TEST 1: 4 tokens in one pass; the final residual rows and the logits of the last row.
//! - TEST 2: 8 tokens as a 4-token prefill then 4 single-token decode steps through each
//!   station's KV cache; every step's residual and logits.
//!
//! Both are compared with the monolithic pipeline running the same schedule; a split passes
//! only when every float is identical (max |delta| = 0.0).
//!
//! The binary's arguments, run and report are in [`cli`].

pub mod cli;

use std::path::Path;
use std::time::Instant;

use fat_station::engine::{EngineError, Holdings, Model, Session};
use knot_format::{Knot, LayerRange};
use serde::Serialize;

/// Positions each parity session may hold (the tests use 8).
const MAX_POSITIONS: usize = 64;
/// TEST 1 runs this many tokens in one pass.
pub const TEST1_TOKENS: usize = 4;
/// TEST 2 prefills this many, then decodes the same number one at a time.
pub const TEST2_PREFILL: usize = 4;
/// Tokens TEST 2 needs in all.
pub const TEST2_TOKENS: usize = 8;
/// Text whose first tokens drive the tests when the model has a tokenizer.
pub const DEFAULT_TEXT: &str =
    "The capital of France is Paris, and the capital of Germany is Berlin.";

/// Why a parity run could not be carried out (a mismatch is a result, not an error).
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("{path} is a shard ({what}); parity needs the whole model")]
    NotWhole { path: String, what: String },
    #[error("split {ranges}: {reason}")]
    BadSplit { ranges: String, reason: String },
    #[error("writing shards for {ranges}")]
    Shards {
        ranges: String,
        #[source]
        source: Box<shard_knot::ShardError>,
    },
    #[error("creating a temp dir for shards")]
    TempDir(#[source] std::io::Error),
    #[error("need at least {need} tokens, got {got}")]
    TooFewTokens { need: usize, got: usize },
}

/// Cosine similarity and largest absolute difference of two float vectors.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Compare {
    pub cos: f64,
    pub max_abs_delta: f64,
    /// Every float has the same bits (the pass criterion).
    pub identical: bool,
}

/// Compares `got` with `want`; different lengths count as not identical (delta infinite).
pub fn compare(want: &[f32], got: &[f32]) -> Compare {
    if want.len() != got.len() {
        return Compare {
            cos: 0.0,
            max_abs_delta: f64::INFINITY,
            identical: false,
        };
    }
    let (mut dot, mut na, mut nb, mut mx) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    let mut identical = true;
    for (&a, &b) in want.iter().zip(got) {
        identical &= a.to_bits() == b.to_bits();
        let (a, b) = (a as f64, b as f64);
        dot += a * b;
        na += a * a;
        nb += b * b;
        let d = (a - b).abs();
        // NaN never compares greater: count it as infinite.
        mx = if d.is_nan() { f64::INFINITY } else { mx.max(d) };
    }
    let cos = if na > 0.0 && nb > 0.0 {
        dot / (na.sqrt() * nb.sqrt())
    } else {
        f64::from(u8::from(na == nb))
    };
    Compare {
        cos,
        max_abs_delta: mx,
        identical,
    }
}

/// What one test produced: residual rows and logits, concatenated over its steps.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    /// (rows, hidden) the residual after the last block, every row of every step.
    pub residual: Vec<f32>,
    /// (steps, vocab) logits of the last row of each step.
    pub logits: Vec<f32>,
}

/// One test's comparison.
#[derive(Clone, Debug, Serialize)]
pub struct TestResult {
    pub residual: Compare,
    pub logits: Compare,
    /// Wall time of the split run.
    pub ms: f64,
}

impl TestResult {
    /// Both residual and logits are bit-identical.
    pub fn pass(&self) -> bool {
        self.residual.identical && self.logits.identical
    }
}

/// The verdict for one split.
#[derive(Clone, Debug, Serialize)]
pub struct SplitReport {
    /// The stations' ranges, in order.
    pub ranges: Vec<LayerRange>,
    /// `views` (layer-range views of the whole file) or `shards` (shard files).
    pub source: &'static str,
    pub test1: TestResult,
    pub test2: TestResult,
    pub pass: bool,
}

/// The monolithic runs everything is compared against.
pub struct Reference {
    pub test1: Trace,
    pub test2: Trace,
    /// Argmax and logit of TEST 1's last row.
    pub argmax: u32,
    pub top_logit: f32,
    /// Wall time of both monolithic runs.
    pub ms: f64,
}

/// A pipeline of stations, each with its own session.
pub struct Pipeline<'a> {
    stations: Vec<(Model<'a>, LayerRange)>,
}

impl<'a> Pipeline<'a> {
    /// Stations as views of one whole model: the first holds the embedding, the last the head.
    pub fn views(knot: &'a Knot, ranges: &[LayerRange]) -> Result<Self, ParityError> {
        check_split(ranges, knot.arch().n_layers)?;
        let last = ranges.len() - 1;
        let stations = ranges
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let h = Holdings {
                    embed: i == 0,
                    layers: *r,
                    head: i == last,
                };
                Ok((Model::load(knot, Some(h))?, *r))
            })
            .collect::<Result<Vec<_>, ParityError>>()?;
        Ok(Pipeline { stations })
    }

    /// Stations from shard files, each loaded as what it holds (`Model::load(&shard, None)`).
    pub fn shards(shards: &'a [Knot]) -> Result<Self, ParityError> {
        let stations = shards
            .iter()
            .map(|k| {
                let m = Model::load(k, None)?;
                let r = m.holdings().layers;
                Ok((m, r))
            })
            .collect::<Result<Vec<_>, ParityError>>()?;
        Ok(Pipeline { stations })
    }

    fn sessions(&self) -> Vec<Session> {
        self.stations
            .iter()
            .map(|(m, _)| m.new_session(MAX_POSITIONS))
            .collect()
    }

    /// One step: `tokens` -> embed on the first station -> each station's range in its own
    /// session -> head of the last. Appends the residual rows and logits to `trace`.
    fn step(
        &self,
        sessions: &mut [Session],
        tokens: &[u32],
        trace: &mut Trace,
    ) -> Result<(), ParityError> {
        let (first, last) = (
            &self.stations[0].0,
            &self.stations[self.stations.len() - 1].0,
        );
        let mut x = first.embed(tokens)?;
        for ((m, r), s) in self.stations.iter().zip(sessions.iter_mut()) {
            // The hand-off: the next station gets a copy, as bytes on the wire would be.
            let mut handed = x.clone();
            m.forward(s, &mut handed, *r)?;
            x = handed;
        }
        trace.logits.extend(last.lm_head(&x)?);
        trace.residual.extend(x);
        Ok(())
    }

    /// TEST 1: the first [`TEST1_TOKENS`] tokens in one pass.
    pub fn test1(&self, tokens: &[u32]) -> Result<Trace, ParityError> {
        let mut s = self.sessions();
        let mut t = Trace::default();
        self.step(&mut s, &tokens[..TEST1_TOKENS], &mut t)?;
        Ok(t)
    }

    /// TEST 2: prefill [`TEST2_PREFILL`] tokens, then decode the rest of [`TEST2_TOKENS`] one by one.
    pub fn test2(&self, tokens: &[u32]) -> Result<Trace, ParityError> {
        let mut s = self.sessions();
        let mut t = Trace::default();
        self.step(&mut s, &tokens[..TEST2_PREFILL], &mut t)?;
        for tok in &tokens[TEST2_PREFILL..TEST2_TOKENS] {
            self.step(&mut s, std::slice::from_ref(tok), &mut t)?;
        }
        Ok(t)
    }
}

/// Checks `ranges` tile `0..n_layers` in order with no empty range.
pub fn check_split(ranges: &[LayerRange], n_layers: u32) -> Result<(), ParityError> {
    let bad = |reason: String| ParityError::BadSplit {
        ranges: fmt_ranges(ranges),
        reason,
    };
    if ranges.is_empty() {
        return Err(bad("no ranges".into()));
    }
    let mut next = 0;
    for r in ranges {
        if r.start != next || r.is_empty() {
            return Err(bad(format!(
                "{r} does not continue at layer {next} (ranges must tile 0..{n_layers})"
            )));
        }
        next = r.end;
    }
    if next != n_layers {
        return Err(bad(format!("ends at layer {next}, not {n_layers}")));
    }
    Ok(())
}

/// `0..12 | 12..24`.
pub fn fmt_ranges(ranges: &[LayerRange]) -> String {
    ranges
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Ranges of a split at cut points `cuts` (each in `1..n_layers`, increasing).
pub fn ranges_at(cuts: &[u32], n_layers: u32) -> Vec<LayerRange> {
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for &c in cuts.iter().chain(std::iter::once(&n_layers)) {
        out.push(LayerRange::new(start, c));
        start = c;
    }
    out
}

/// Every 2-way cut `1..L-1`, then 3-way cuts `(a, b)` with `a < b` on a grid of `step`
/// (`step` 1 = every 3-way split).
pub fn all_splits(n_layers: u32, step: u32) -> Vec<Vec<u32>> {
    let step = step.max(1);
    let mut out: Vec<Vec<u32>> = (1..n_layers).map(|k| vec![k]).collect();
    let mut a = 1;
    while a < n_layers {
        let mut b = a + 1;
        while b < n_layers {
            out.push(vec![a, b]);
            b += step;
        }
        a += step;
    }
    out
}

/// The monolithic reference: the whole model as one station, same schedule.
pub fn reference(knot: &Knot, tokens: &[u32]) -> Result<Reference, ParityError> {
    whole_model(knot)?;
    need_tokens(tokens)?;
    let t0 = Instant::now();
    let full = Pipeline::views(knot, &[LayerRange::new(0, knot.arch().n_layers)])?;
    let test1 = full.test1(tokens)?;
    let test2 = full.test2(tokens)?;
    let argmax = fat_station::engine::ops::argmax(&test1.logits);
    let top_logit = test1
        .logits
        .get(argmax as usize)
        .copied()
        .unwrap_or(f32::NAN);
    Ok(Reference {
        test1,
        test2,
        argmax,
        top_logit,
        ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

fn whole_model(knot: &Knot) -> Result<(), ParityError> {
    match knot.shard() {
        Some(s) if s.layers != LayerRange::new(0, knot.arch().n_layers) => {
            Err(ParityError::NotWhole {
                path: knot.path().display().to_string(),
                what: format!("{:?} layers {}", s.role, s.layers),
            })
        }
        _ => Ok(()),
    }
}

fn need_tokens(tokens: &[u32]) -> Result<(), ParityError> {
    if tokens.len() < TEST2_TOKENS {
        return Err(ParityError::TooFewTokens {
            need: TEST2_TOKENS,
            got: tokens.len(),
        });
    }
    Ok(())
}

fn judge(
    reference: &Reference,
    p: &Pipeline<'_>,
    tokens: &[u32],
) -> Result<(TestResult, TestResult), ParityError> {
    let t0 = Instant::now();
    let t1 = p.test1(tokens)?;
    let ms1 = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    let t2 = p.test2(tokens)?;
    let ms2 = t0.elapsed().as_secs_f64() * 1e3;
    Ok((
        TestResult {
            residual: compare(&reference.test1.residual, &t1.residual),
            logits: compare(&reference.test1.logits, &t1.logits),
            ms: ms1,
        },
        TestResult {
            residual: compare(&reference.test2.residual, &t2.residual),
            logits: compare(&reference.test2.logits, &t2.logits),
            ms: ms2,
        },
    ))
}

/// Runs both tests on the split `ranges`, as views of `knot`.
pub fn check_views(
    knot: &Knot,
    reference: &Reference,
    ranges: &[LayerRange],
    tokens: &[u32],
) -> Result<SplitReport, ParityError> {
    let p = Pipeline::views(knot, ranges)?;
    let (test1, test2) = judge(reference, &p, tokens)?;
    Ok(report(ranges, "views", test1, test2))
}

/// Runs both tests on real shard files of `ranges`, written by `shard-knot` into `dir`
/// (removed afterwards by the caller's temp dir).
pub fn check_shards(
    knot: &Knot,
    reference: &Reference,
    ranges: &[LayerRange],
    tokens: &[u32],
    dir: &Path,
) -> Result<SplitReport, ParityError> {
    check_split(ranges, knot.arch().n_layers)?;
    let shard_err = |source| ParityError::Shards {
        ranges: fmt_ranges(ranges),
        source: Box::new(source),
    };
    let written = shard_knot::split(knot, ranges, dir, "parity", &mut |_| {}).map_err(shard_err)?;
    let files = written
        .iter()
        .map(|s| {
            Knot::open(&s.path).map_err(|source| {
                shard_err(shard_knot::ShardError::Read {
                    path: s.path.clone(),
                    source: Box::new(source),
                })
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let p = Pipeline::shards(&files)?;
    let (test1, test2) = judge(reference, &p, tokens)?;
    drop(p);
    drop(files);
    for s in &written {
        let _ = std::fs::remove_file(&s.path);
    }
    Ok(report(ranges, "shards", test1, test2))
}

fn report(
    ranges: &[LayerRange],
    source: &'static str,
    test1: TestResult,
    test2: TestResult,
) -> SplitReport {
    let pass = test1.pass() && test2.pass();
    SplitReport {
        ranges: ranges.to_vec(),
        source,
        test1,
        test2,
        pass,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_sees_one_ulp() {
        let a = [1.0f32, -2.0, 3.5];
        let c = compare(&a, &a);
        assert!(c.identical && c.max_abs_delta == 0.0 && (c.cos - 1.0).abs() < 1e-12);
        let mut b = a;
        b[1] = f32::from_bits(b[1].to_bits() + 1);
        let c = compare(&a, &b);
        assert!(!c.identical && c.max_abs_delta > 0.0);
        assert!(!compare(&a, &a[..2]).identical);
        let nan = [1.0f32, f32::NAN, 3.5];
        assert!(compare(&a, &nan).max_abs_delta.is_infinite());
    }

    #[test]
    fn splits_tile_the_model() {
        assert_eq!(
            ranges_at(&[8, 16], 24),
            vec![
                LayerRange::new(0, 8),
                LayerRange::new(8, 16),
                LayerRange::new(16, 24)
            ]
        );
        assert!(check_split(&ranges_at(&[12], 24), 24).is_ok());
        assert!(check_split(&[LayerRange::new(0, 12)], 24).is_err());
        assert!(check_split(&[LayerRange::new(0, 12), LayerRange::new(13, 24)], 24).is_err());
        let all = all_splits(24, 1);
        assert_eq!(all.len(), 23 + 23 * 22 / 2);
        assert!(all
            .iter()
            .all(|c| check_split(&ranges_at(c, 24), 24).is_ok()));
        assert_eq!(
            all_splits(24, 4).len(),
            23 + (1..24)
                .step_by(4)
                .map(|a| (a + 1..24).step_by(4).count())
                .sum::<usize>()
        );
    }
}
