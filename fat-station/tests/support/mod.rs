//! Shared by the integration tests: where the real models are, and the rule for their absence.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The model cache (`AEON_MODELS_DIR`, default `~/.cache/aeon-shell/models`).
pub fn models_dir() -> PathBuf {
    match std::env::var_os("AEON_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/aeon-shell/models"),
    }
}

/// The Qwen2.5-Coder-0.5B KNOT.
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.knot";
/// The SmolLM2-135M KNOT.
pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.knot";
/// The Gemma-3-270M KNOT (`scripts/fetch-model.sh gemma`).
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.knot";

/// The path of a cached model, or `None` (test skips) when it is absent and CI does not
/// require it. With `AEON_REQUIRE_MODELS=1` a missing model fails the test.
pub fn model(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(name);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("AEON_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!(
            "{} is missing and AEON_REQUIRE_MODELS=1: run scripts/fetch-model.sh",
            p.display()
        );
    }
    eprintln!(
        "skipping: {} not found (run scripts/fetch-model.sh)",
        p.display()
    );
    None
}

/// Reads a little-endian f32 file.
pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Index of the largest value.
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
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

/// A fat-station process, killed on drop.
pub struct StationProc {
    pub child: Child,
    /// Its base URL, from the ready line.
    pub url: String,
}

impl Drop for StationProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
    let mut child = Command::new(station_bin())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn fat-station");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read ready line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no url in {line:?}"))
        .to_string();
    StationProc { child, url }
}
