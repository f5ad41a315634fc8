//! Shared by fat-station's integration tests: the workspace's `test-support` (where the real
//! models are and the rule for their absence, processes that print their URL, free ports),
//! this crate's station binary, and the comparisons of the golden tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

#[allow(unused_imports)] // each test binary uses its own part of these
pub use test_support::{
    free_port, model, models_dir, python_with_gguf, run_ok, sha256_file, spawn_url,
    Proc as StationProc, GEMMA, QWEN, SMOLLM2,
};

/// A folder of committed goldens, `fat-station/tests/golden/SUB`.
pub fn golden_dir(sub: &str) -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(sub)
}

/// Whether `gguf` is the file the goldens `STEM_seed0*` in `golden` were made from: its sha256
/// is `STEM_seed0.sha256`'s. Another numpy or gguf draws other bytes from the same seed; then
/// the goldens are not of this file and the caller skips the comparison, unless the run
/// requires every comparison (`test_support::required()`), where this fails instead.
pub fn is_golden_file(gguf: &std::path::Path, golden: &std::path::Path, stem: &str) -> bool {
    let path = golden.join(format!("{stem}_seed0.sha256"));
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let got = sha256_file(gguf);
    if got == want.trim() {
        return true;
    }
    assert!(
        !test_support::required(),
        "{stem}: the GGUF's sha256 {got} is not the golden's {}",
        want.trim()
    );
    eprintln!("skipping: {stem}'s GGUF (sha256 {got}) is not the golden's; not compared");
    false
}

/// Reads a little-endian f32 file.
pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Index of the largest value (the engine's greedy pick), as an index.
pub fn argmax(x: &[f32]) -> usize {
    fat_station::engine::ops::argmax(x) as usize
}

/// Ids of the `k` largest values, best first.
pub fn top_ids(x: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..x.len()).collect();
    idx.sort_by(|&a, &b| x[b].total_cmp(&x[a]));
    idx.truncate(k);
    idx
}

/// Root-mean-square and maximum absolute difference.
pub fn rms_max(a: &[f32], b: &[f32]) -> (f64, f64) {
    assert_eq!(a.len(), b.len());
    let mut ss = 0.0f64;
    let mut mx = 0.0f64;
    for (&x, &y) in a.iter().zip(b) {
        let d = (x as f64 - y as f64).abs();
        ss += d * d;
        mx = mx.max(d);
    }
    ((ss / a.len() as f64).sqrt(), mx)
}

/// Asserts `logits` agree with the f32 reference `golden`: the same top-3 ids, and rms and
/// max abs difference within the bounds (the engine quantizes activations to 8 bits for its
/// dots, as llama.cpp does; the reference is f32 throughout).
pub fn assert_near_reference(logits: &[f32], golden: &[f32], rms_bound: f64, max_bound: f64) {
    let (rms, max) = rms_max(logits, golden);
    assert_eq!(
        top_ids(logits, 3),
        top_ids(golden, 3),
        "top-3 ids differ from the reference"
    );
    assert!(
        rms <= rms_bound,
        "rms {rms} > {rms_bound} against the reference"
    );
    assert!(
        max <= max_bound,
        "max abs delta {max} > {max_bound} against the reference"
    );
}

/// Our logits against llama.cpp's on the same weights: the same top-1, and an rms within 1.5x
/// of llama.cpp's own batched-vs-token-by-token difference, no floor. The goldens are
/// llama.cpp's on the f16 file widened to f32 with an f32 KV cache
/// (scripts/reference/widen-gguf.py, llamacpp-logits --f32-cache): on the f16 file itself
/// llama.cpp rounds every matmul's activations and its cache to f16, where we keep f32, and
/// that rounding alone is 2-4x its own batched-vs-token noise. Prints the figures under `label`;
/// returns our rms and the bound.
pub fn assert_matches_llamacpp(
    label: &str,
    ours: &[f32],
    batched: &[f32],
    one_by_one: &[f32],
) -> (f64, f64) {
    assert_matches_llamacpp_above(label, ours, batched, one_by_one, 0.0)
}

/// [`assert_matches_llamacpp`] with llama.cpp's own difference floored at `floor` (where a
/// rounding of llama.cpp's that its two runs share is known and measured).
pub fn assert_matches_llamacpp_above(
    label: &str,
    ours: &[f32],
    batched: &[f32],
    one_by_one: &[f32],
    floor: f64,
) -> (f64, f64) {
    let (own, _) = rms_max(batched, one_by_one);
    let (rms, max) = rms_max(ours, batched);
    eprintln!(
        "{label}: vs llama.cpp rms {rms:.2e} max {max:.2e}; llama.cpp batched vs token by token \
         rms {own:.2e}; top-5 ours {:?} llama.cpp {:?}",
        top_ids(ours, 5),
        top_ids(batched, 5)
    );
    assert_eq!(
        argmax(ours),
        argmax(batched),
        "{label}: top-1 differs from llama.cpp"
    );
    let bound = 1.5 * own.max(floor);
    assert!(
        rms <= bound,
        "{label}: rms {rms} against llama.cpp exceeds 1.5x its own batched-vs-token-by-token {own}"
    );
    (rms, bound)
}

/// The fat-station binary: this crate's, or `$AEON_STATION_BIN` (to run a test against
/// another build, e.g. to see a regression test fail on the old code).
pub fn station_bin() -> PathBuf {
    std::env::var_os("AEON_STATION_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fat-station")))
}

/// Starts this crate's fat-station with `args` and waits for its ready line.
pub fn spawn_station(args: &[&str]) -> StationProc {
    spawn_url(Command::new(station_bin()).args(args))
}

/// Runs `f` on a rayon pool of `n` threads (the determinism tests compare thread counts).
pub fn with_threads<T: Send>(n: usize, f: impl FnOnce() -> T + Send) -> T {
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .build()
        .expect("thread pool")
        .install(f)
}

/// One greedy comparison's figures (see `assert_greedy_matches_llamacpp`).
#[derive(Debug)]
pub struct GreedyReport {
    /// Steps in llama.cpp's greedy golden.
    pub steps: usize,
    /// Steps where our pick was llama.cpp's.
    pub equal: usize,
    /// Steps where llama.cpp's lead or ours was a near-tie (picked alike or not).
    pub near_ties: usize,
    /// Steps picked otherwise, each a near-tie: (step, ours, llama.cpp's, its lead, ours).
    pub broken_otherwise: Vec<(usize, u32, u32, f32, f32)>,
}

/// The near-tie rule of the greedy comparisons: a lead (best logit minus the runner-up) under
/// 1/1000 of the step's logit spread (max - min), or under `floor`, is a near-tie that two
/// implementations may break either way. The spread part covers the f32-widened goldens (ours
/// and llama.cpp's logits differ by ~1e-5 of the spread there); `floor` is for goldens where
/// llama.cpp quantizes activations (q8_0 files: a few times the logit rms between the two).
pub fn near_tie(logits: &[f32], floor: f32) -> f32 {
    let (lo, hi) = logits
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    (1e-3 * (hi - lo)).max(floor)
}

/// Reads a greedy golden of `llamacpp-logits --greedy N OUT.txt`: per line the id llama.cpp
/// picked and its lead over the runner-up.
pub fn read_greedy_golden(path: &std::path::Path) -> Vec<(u32, f32)> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(|l| {
            let (id, lead) = l
                .split_once(' ')
                .unwrap_or_else(|| panic!("{}: not `id lead`: {l:?}", path.display()));
            (
                id.parse().expect("greedy golden: id"),
                lead.parse().expect("greedy golden: lead"),
            )
        })
        .collect()
}

/// Issues 35 and 37: our greedy run against llama.cpp's (`golden`, from a make-*-golden.sh's
/// `llamacpp-logits --greedy`: the prompt in one batch, then one `llama_decode` per token).
/// Ours: the prompt in one call, then one token per call, each step fed llama.cpp's pick so
/// every step is compared even after a near-tie. Every step's pick must equal llama.cpp's
/// except where llama.cpp's lead or ours is a near-tie (`near_tie`, with `floor`); the
/// near-ties met are printed under `label` with the figures, and returned.
pub fn assert_greedy_matches_llamacpp(
    label: &str,
    m: &aeon_engine::Model<'_>,
    prompt: &[u32],
    golden: &std::path::Path,
    floor: f32,
) -> GreedyReport {
    let theirs = read_greedy_golden(golden);
    assert!(!theirs.is_empty(), "{}: empty", golden.display());
    let mut s = m.new_session(prompt.len() + theirs.len() + 1);
    let mut next = m.logits(&mut s, prompt).expect("prefill");
    let mut report = GreedyReport {
        steps: theirs.len(),
        equal: 0,
        near_ties: 0,
        broken_otherwise: Vec::new(),
    };
    for (i, &(id, lead)) in theirs.iter().enumerate() {
        let ours = argmax(&next);
        let runner_up = next
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != ours)
            .map(|(_, &v)| v)
            .fold(f32::NEG_INFINITY, f32::max);
        let our_lead = next[ours] - runner_up;
        let tie = near_tie(&next, floor);
        let is_tie = lead.min(our_lead) < tie;
        report.near_ties += usize::from(is_tie);
        if ours as u32 == id {
            report.equal += 1;
            if is_tie {
                eprintln!(
                    "{label} greedy: step {i} a near-tie (llama.cpp's lead {lead}, ours \
                     {our_lead}, under {tie}) both broke alike"
                );
            }
        } else {
            assert!(
                is_tie,
                "{label} greedy: step {i}: ours {ours} (lead {our_lead}), llama.cpp's {id} \
                 (lead {lead}); not a near-tie (under {tie})"
            );
            report
                .broken_otherwise
                .push((i, ours as u32, id, lead, our_lead));
        }
        next = m.logits(&mut s, &[id]).expect("decode");
    }
    eprintln!(
        "{label} greedy: {} of {} steps equal to llama.cpp's, {} near-tie(s) met; broken \
         otherwise (step, ours, llama.cpp's, its lead, ours): {:?}",
        report.equal, report.steps, report.near_ties, report.broken_otherwise
    );
    report
}
