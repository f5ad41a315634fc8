//! The seed report's steps, run as it writes them, with the real release binaries
//! (`target/release`, built by scripts/test.sh before the tests) and the real Qwen model:
//!
//! - step 3: the collector under its seed name (`gnosis-foil-control`) and the probe under
//!   its (`paris-probe-rknot`), which prints `max finite logit +X at token_id 12095 -> PASS:
//!   argmax 12095 matches` and admits its residue;
//! - the capstone: `swerve cline base:NAME -- bash /opt/aeon/foothold.sh` in a rootfs laid out
//!   by scripts/r1/sliver-install.sh, with no --bind: the header `=== aeon-shell foothold
//!   inside a swerve sliver: ARCH / "OS" ===` and the three verdict lines.
//!
//! The sliver needs root (skipped otherwise unless SWERVE_REQUIRE_ROOT=1); a missing model
//! skips unless AEON_REQUIRE_MODELS=1; missing release binaries fail under either.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.knot";
const TOKENS: &str = "785,6722,315,9625,374";

fn required(var: &str) -> bool {
    std::env::var(var).as_deref() == Ok("1")
}

fn models_dir() -> PathBuf {
    match std::env::var_os("AEON_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/aeon-shell/models"),
    }
}

/// The model and the release binaries, or `None` (skip) when absent and not required.
fn setup(test: &str, bins: &[&str]) -> Option<(PathBuf, PathBuf)> {
    let model = models_dir().join(QWEN);
    if !model.exists() {
        assert!(
            !required("AEON_REQUIRE_MODELS"),
            "{} missing",
            model.display()
        );
        eprintln!("{test}: skipped: {} not found", model.display());
        return None;
    }
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release");
    let missing: Vec<&str> = bins
        .iter()
        .copied()
        .filter(|b| !bin.join(b).exists())
        .collect();
    if !missing.is_empty() {
        assert!(
            !required("AEON_REQUIRE_MODELS") && !required("SWERVE_REQUIRE_ROOT"),
            "{missing:?} not in {}: cargo build --release --workspace --bins",
            bin.display()
        );
        eprintln!("{test}: skipped: {missing:?} not built");
        return None;
    }
    Some((model, bin))
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A child process killed on drop.
struct Killed(std::process::Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn step3_probe_under_the_seed_names_prints_the_seed_line_and_admits_its_residue() {
    let test = "step3";
    let Some((model, bin)) = setup(test, &["gnosis-foil-control", "paris-probe-rknot"]) else {
        return;
    };
    let data = tempfile::tempdir().expect("tempdir");
    let mut foil = Command::new(bin.join("gnosis-foil-control"))
        .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(data.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start gnosis-foil-control");
    let mut line = String::new();
    BufReader::new(foil.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let _foil = Killed(foil);
    let url = line
        .trim()
        .strip_prefix("foil-control listening on ")
        .unwrap_or_else(|| panic!("no listening line: {line:?}"))
        .to_string();

    let o = Command::new(bin.join("paris-probe-rknot"))
        .arg("--dense")
        .arg(&model)
        .args(["--dense-only", "--tokens", TOKENS, "--expected", "12095"])
        .env("GNOSIS_FOIL_CACHE_URL", &url)
        .output()
        .expect("run paris-probe-rknot");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let verdict = stdout
        .lines()
        .find(|l| l.starts_with("max finite logit +"))
        .unwrap_or_else(|| panic!("no seed verdict line: {t}"));
    let logit: f64 = verdict["max finite logit +".len()..]
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no logit in {verdict:?}"));
    assert!((13.0..16.0).contains(&logit), "{verdict}");
    assert!(
        verdict.contains(" at token_id 12095 -> PASS: argmax 12095 matches"),
        "{verdict}"
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("foil-cache-admit: status=200 key="),
        "{t}"
    );
}

fn have_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        !required("SWERVE_REQUIRE_ROOT"),
        "{test}: needs root and SWERVE_REQUIRE_ROOT=1"
    );
    eprintln!("{test}: skipped: needs root (namespaces, mounts)");
    false
}

/// A rootfs made by make-rootfs.sh, laid out by sliver-install.sh and admitted as
/// `base:seed` in a fresh SWERVE_HOME; returns (rootfs, swerve home).
fn seed_sliver(bin: &Path, work: &Path) -> (PathBuf, PathBuf) {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts");
    let rootfs = work.join("rootfs");
    let home = work.join("swerve-home");
    let run = |c: &mut Command, what: &str| {
        let o = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(o.status.success(), "{what}: {}", text(&o));
    };
    run(
        Command::new("bash")
            .arg(scripts.join("make-rootfs.sh"))
            .arg(&rootfs),
        "make-rootfs.sh",
    );
    run(
        Command::new("bash")
            .arg(scripts.join("r1/sliver-install.sh"))
            .arg(&rootfs)
            .env("AEON_BIN", bin)
            .env("AEON_MODELS_DIR", models_dir()),
        "sliver-install.sh",
    );
    run(
        Command::new(env!("CARGO_BIN_EXE_swerve"))
            .args(["admit", "base:seed", "--rootfs"])
            .arg(&rootfs)
            .env("SWERVE_HOME", &home)
            .env_remove("MONSTER_GUARD_HOME"),
        "swerve admit",
    );
    (rootfs, home)
}

#[test]
fn capstone_in_a_sliver_finds_its_model_and_prints_the_seed_header_and_lines() {
    let test = "capstone";
    let bins = [
        "fat-station",
        "paris-probe",
        "paris-probe-rknot",
        "monster-guard",
        "moonshine",
        "foil-control",
        "gnosis-foil-control",
        "swerve",
        "knot",
        "shard-knot",
        "parity-station-handoff",
    ];
    let Some((_model, bin)) = setup(test, &bins) else {
        return;
    };
    if !have_root(test) {
        return;
    }
    let work = tempfile::Builder::new()
        .prefix("seed-sliver-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    let (rootfs, home) = seed_sliver(&bin, work.path());

    // The capstone exactly as the seed writes it: no --rootfs, no --bind.
    let o = Command::new(env!("CARGO_BIN_EXE_swerve"))
        .args(["cline", "base:seed", "--", "bash", "/opt/aeon/foothold.sh"])
        .env("SWERVE_HOME", &home)
        .env_remove("MONSTER_GUARD_HOME")
        .output()
        .expect("swerve cline");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(0), "{t}");
    let out = String::from_utf8_lossy(&o.stdout);
    let os_release = std::fs::read_to_string(rootfs.join("etc/os-release")).expect("os-release");
    let pretty = os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .expect("PRETTY_NAME");
    let header = format!(
        "=== aeon-shell foothold inside a swerve sliver: {} / \"{pretty}\" ===",
        std::env::consts::ARCH
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first().copied(), Some(header.as_str()), "{t}");
    assert_eq!(
        lines.get(1).copied(),
        Some("1) monster-guard: quality spec passed -> delegated"),
        "{t}"
    );
    assert!(
        lines.get(2).is_some_and(
            |l| l.starts_with("2) The capital of France is -> ") && l.contains("Paris")
        ),
        "{t}"
    );
    assert!(
        lines
            .get(3)
            .is_some_and(|l| l.starts_with("3) cache_hit:true argmax 12095 logit 14.")),
        "{t}"
    );
}
