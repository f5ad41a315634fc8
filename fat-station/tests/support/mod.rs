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
/// that rounding alone is 2-4x its own batched-vs-token noise. Prints the figures under `label`.
pub fn assert_matches_llamacpp(label: &str, ours: &[f32], batched: &[f32], one_by_one: &[f32]) {
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
    assert!(
        rms <= 1.5 * own,
        "{label}: rms {rms} against llama.cpp exceeds 1.5x its own batched-vs-token-by-token {own}"
    );
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
