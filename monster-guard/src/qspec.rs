//! Quality specs: which probes a model must pass, and running them with `paris-probe`.
//!
//! The format is documented in `specs/qspec.md`. monster-guard never links the engine: each
//! probe is one `paris-probe --json` child process, killed if it outlives its timeout, and the
//! verdict is computed here from the probe's JSON (argmax or top-k rank, minimum margin,
//! perplexity ceiling), so a probe cannot declare itself passed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{GuardError, Result};
use crate::fsutil;

/// Default per-probe timeout in seconds.
pub const DEFAULT_TIMEOUT_SECS: f64 = 120.0;
/// Models directory used for `${AEON_MODELS_DIR}` when the variable is unset.
pub const DEFAULT_MODELS_DIR: &str = "~/.cache/aeon-shell/models";

/// A perplexity check: mean negative log-likelihood of `text` (nats/token) must not exceed
/// `max_nll`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Perplexity {
    /// The passage to score.
    pub text: String,
    /// Ceiling on its mean NLL in nats per token.
    pub max_nll: f64,
}

/// One probe of a spec. Exactly one of `prompt`/`prompt_tokens` (tokens win when both are
/// given) and at least one of `expect`/`expect_token` (the id wins; the text is then checked
/// against the id's decoded text).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSpec {
    /// Name used in verdicts (default `probe-N`, or `main` for the top-level probe).
    #[serde(default)]
    pub name: Option<String>,
    /// Prompt as text, tokenized by the model's own tokenizer.
    #[serde(default)]
    pub prompt: Option<String>,
    /// Prompt as token ids of the model's vocabulary.
    #[serde(default)]
    pub prompt_tokens: Option<Vec<u32>>,
    /// Expected continuation as text: its first token (model's tokenizer) is the expected id.
    #[serde(default)]
    pub expect: Option<String>,
    /// Expected next-token id.
    #[serde(default)]
    pub expect_token: Option<u32>,
    /// Expected logit minus the best other logit must be at least this.
    #[serde(default)]
    pub min_margin: Option<f64>,
    /// Pass when the expected id ranks within the top `top_k` (default: it must be the argmax).
    #[serde(default)]
    pub top_k: Option<u32>,
    /// Optional perplexity ceiling on a passage.
    #[serde(default)]
    pub perplexity: Option<Perplexity>,
}

/// A qspec file. The top-level probe fields are the original single-probe form; `probes`
/// adds more. Every probe must pass.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct QSpec {
    /// Free text for people.
    #[serde(default)]
    pub description: Option<String>,
    /// Name of the probe (e.g. `paris-probe`): looked up in the trusted places only
    /// ([`resolve_probe`]), never run from where the spec is.
    #[serde(default)]
    pub probe: Option<String>,
    /// The model file (KNOT). `${AEON_MODELS_DIR}` (default `~/.cache/aeon-shell/models`),
    /// other `${VAR}`s and a leading `~` are expanded; relative to the spec's directory.
    pub knot: String,
    /// Pass `--dense-only` to the probe.
    #[serde(default)]
    pub dense_only: bool,
    /// Per-probe timeout in seconds (default 120).
    #[serde(default)]
    pub timeout_secs: Option<f64>,
    /// Top-level probe (single-probe form), flattened.
    #[serde(flatten)]
    pub main: ProbeSpec,
    /// Further probes.
    #[serde(default)]
    pub probes: Vec<ProbeSpec>,
}

/// A loaded spec with its resolved paths.
#[derive(Clone, Debug)]
pub struct LoadedSpec {
    /// Where it was read from.
    pub path: PathBuf,
    /// BLAKE3 (hex) of the spec file's bytes.
    pub hash: String,
    /// The parsed spec.
    pub spec: QSpec,
    /// The probes to run, named, in order.
    pub probes: Vec<(String, ProbeSpec)>,
    /// The resolved model path.
    pub knot: PathBuf,
}

impl LoadedSpec {
    /// Reads and validates a spec file.
    pub fn load(path: &Path) -> Result<LoadedSpec> {
        let bytes = fsutil::read(path)?;
        // Flatten + deny_unknown_fields do not combine in serde, so unknown keys are checked by hand.
        let raw: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| GuardError::Json {
                path: path.into(),
                source: e,
            })?;
        let spec_err = |reason: String| GuardError::Spec {
            path: path.into(),
            reason,
        };
        const TOP: &[&str] = &[
            "description",
            "probe",
            "knot",
            "dense_only",
            "timeout_secs",
            "probes",
            "name",
            "prompt",
            "prompt_tokens",
            "expect",
            "expect_token",
            "min_margin",
            "top_k",
            "perplexity",
        ];
        if let Some(obj) = raw.as_object() {
            if let Some(k) = obj.keys().find(|k| !TOP.contains(&k.as_str())) {
                return Err(spec_err(format!(
                    "unknown field {k:?} (known: {})",
                    TOP.join(", ")
                )));
            }
        }
        let spec: QSpec = serde_json::from_value(raw).map_err(|e| GuardError::Json {
            path: path.into(),
            source: e,
        })?;
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let knot = expand_path(&spec.knot, dir).map_err(spec_err)?;
        let mut probes = Vec::new();
        let has_main = spec.main.prompt.is_some() || spec.main.prompt_tokens.is_some();
        if has_main {
            let name = spec.main.name.clone().unwrap_or_else(|| "main".into());
            probes.push((name, spec.main.clone()));
        } else if spec.main != ProbeSpec::default() {
            return Err(spec_err(
                "top-level probe fields given without a prompt".into(),
            ));
        }
        for (i, p) in spec.probes.iter().enumerate() {
            probes.push((
                p.name.clone().unwrap_or_else(|| format!("probe-{}", i + 1)),
                p.clone(),
            ));
        }
        if probes.is_empty() {
            return Err(spec_err(
                "no probes: give a top-level prompt or a `probes` list".into(),
            ));
        }
        for (name, p) in &probes {
            validate_probe(name, p).map_err(spec_err)?;
        }
        let mut names: Vec<_> = probes.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(spec_err(format!("two probes are named {:?}", w[0])));
        }
        if let Some(t) = spec.timeout_secs {
            if !(t.is_finite() && t > 0.0) {
                return Err(spec_err(format!("timeout_secs must be positive, got {t}")));
            }
        }
        Ok(LoadedSpec {
            path: path.into(),
            hash: blake3::hash(&bytes).to_hex().to_string(),
            spec,
            probes,
            knot,
        })
    }

    /// The per-probe timeout.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.spec.timeout_secs.unwrap_or(DEFAULT_TIMEOUT_SECS))
    }

    /// The directory the spec's relative paths are relative to.
    pub fn dir(&self) -> &Path {
        self.path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }
}

fn validate_probe(name: &str, p: &ProbeSpec) -> std::result::Result<(), String> {
    if p.prompt.is_none() && p.prompt_tokens.is_none() {
        return Err(format!("probe {name:?}: needs `prompt` or `prompt_tokens`"));
    }
    if p.prompt_tokens.as_ref().is_some_and(|t| t.is_empty())
        || p.prompt.as_ref().is_some_and(|t| t.is_empty())
    {
        return Err(format!("probe {name:?}: empty prompt"));
    }
    if p.expect.is_none() && p.expect_token.is_none() {
        return Err(format!("probe {name:?}: needs `expect` or `expect_token`"));
    }
    if p.expect.as_ref().is_some_and(|t| t.is_empty()) {
        return Err(format!("probe {name:?}: empty `expect`"));
    }
    if p.min_margin.is_some_and(|m| !m.is_finite()) {
        return Err(format!("probe {name:?}: min_margin must be a number"));
    }
    if p.top_k == Some(0) {
        return Err(format!("probe {name:?}: top_k must be at least 1"));
    }
    if let Some(pp) = &p.perplexity {
        if pp.text.is_empty() || !(pp.max_nll.is_finite() && pp.max_nll > 0.0) {
            return Err(format!(
                "probe {name:?}: perplexity needs a text and a positive max_nll"
            ));
        }
    }
    Ok(())
}

/// Expands `${AEON_MODELS_DIR}` (default [`DEFAULT_MODELS_DIR`]), other `${VAR}`/`$VAR`
/// (must be set), a leading `~`, and makes a relative result relative to `base`.
pub fn expand_path(raw: &str, base: &Path) -> std::result::Result<PathBuf, String> {
    expand_path_with(raw, base, &|k| std::env::var(k).ok())
}

/// [`expand_path`] with an explicit environment lookup.
pub fn expand_path_with(
    raw: &str,
    base: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> std::result::Result<PathBuf, String> {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (var, tail) = if let Some(b) = after.strip_prefix('{') {
            let end = b
                .find('}')
                .ok_or_else(|| format!("unclosed ${{ in path {raw:?}"))?;
            (&b[..end], &b[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if var.is_empty() {
            return Err(format!("empty variable name in path {raw:?}"));
        }
        match env(var) {
            Some(v) if !v.is_empty() => out.push_str(&v),
            _ if var == "AEON_MODELS_DIR" => out.push_str(DEFAULT_MODELS_DIR),
            _ => return Err(format!("path {raw:?} uses ${var}, which is not set")),
        }
        rest = tail;
    }
    out.push_str(rest);
    if out == "~" || out.starts_with("~/") {
        let home = env("HOME").ok_or_else(|| format!("path {raw:?} uses ~ but HOME is not set"))?;
        out = format!("{home}{}", &out[1..]);
    }
    let p = PathBuf::from(out);
    Ok(if p.is_absolute() { p } else { base.join(p) })
}

/// Names a qspec's `probe` may give for the probe installed beside the `monster-guard`
/// executable (`paris-probe-rknot` is the seed report's name for the same program).
pub const PROBES_BESIDE_GUARD: &[&str] = &["paris-probe", "paris-probe-rknot"];
/// The probe used when neither the command line nor the qspec names one.
pub const DEFAULT_PROBE: &str = "paris-probe";

/// Who chose the probe that judges a model. Only the administrator chooses: a qspec travels
/// with a model, so its `probe` field is a name looked up in the trusted places, never a
/// program of its own (issue 32.1: `"probe": "fakeprobe.sh"` ran as root and passed garbage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOrigin {
    /// `delegate --probe PATH`.
    CommandLine,
    /// `$PARIS_PROBE`, the caller's environment (as the foothold scripts set it).
    Environment,
    /// `$MONSTER_GUARD_HOME/probes/NAME`, the guard's own allowlist.
    Allowlist,
    /// `paris-probe` (or `paris-probe-rknot`) in the directory of the running `monster-guard`.
    BesideGuard,
}

impl std::fmt::Display for ProbeOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProbeOrigin::CommandLine => "--probe",
            ProbeOrigin::Environment => "$PARIS_PROBE",
            ProbeOrigin::Allowlist => "the guard's probes/ allowlist",
            ProbeOrigin::BesideGuard => "beside monster-guard",
        })
    }
}

/// A probe from a trusted place.
#[derive(Clone, Debug)]
pub struct TrustedProbe {
    /// The program to run.
    pub path: PathBuf,
    /// Why it is trusted.
    pub origin: ProbeOrigin,
}

/// Finds the probe: `explicit` (`--probe`), else `$PARIS_PROBE`, else the qspec's `probe` name
/// (default [`DEFAULT_PROBE`]) looked up in `probes_dir` (the guard's allowlist), then beside
/// the running executable (only the names in [`PROBES_BESIDE_GUARD`]). A trusted file and its
/// directory are owned by root or by us and writable by no one else. A qspec field that is a
/// path is accepted only when it is one of those same files; anything else is refused before
/// any probe runs.
pub fn resolve_probe(
    explicit: Option<&Path>,
    spec: &LoadedSpec,
    probes_dir: &Path,
) -> Result<TrustedProbe> {
    if let Some(p) = explicit {
        return Ok(TrustedProbe {
            path: p.to_path_buf(),
            origin: ProbeOrigin::CommandLine,
        });
    }
    if let Some(p) = std::env::var_os("PARIS_PROBE").filter(|p| !p.is_empty()) {
        return Ok(TrustedProbe {
            path: PathBuf::from(p),
            origin: ProbeOrigin::Environment,
        });
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    resolve_named(spec, probes_dir, beside.as_deref())
}

/// The qspec's probe name (or the default) in the allowlist, then beside `guard_dir`.
fn resolve_named(
    spec: &LoadedSpec,
    probes_dir: &Path,
    guard_dir: Option<&Path>,
) -> Result<TrustedProbe> {
    let refuse = |reason: String| GuardError::Spec {
        path: spec.path.clone(),
        reason,
    };
    let field = spec.spec.probe.as_deref();
    let raw = field.unwrap_or(DEFAULT_PROBE);
    // A path is only a long way of naming a trusted file: its last component is the name, and
    // the path must lead to the file found under that name. Relative paths would be relative
    // to wherever the qspec came from: refused.
    let (name, as_path) = if raw.contains('/') {
        if !raw.starts_with('/') {
            return Err(refuse(format!(
                "probe {raw:?} is not a trusted probe: a qspec names its probe (e.g. \
                 \"paris-probe\"), it never supplies a path relative to itself; nothing was \
                 run or minted"
            )));
        }
        let name = Path::new(raw)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        (name, Some(Path::new(raw)))
    } else {
        (raw, None)
    };
    if name.is_empty() || name == "." || name == ".." {
        return Err(refuse(format!("probe {raw:?} is not a program name")));
    }
    let mut places = vec![probes_dir.join(name)];
    let mut tried = vec![format!("{}/", probes_dir.display())];
    if let Some(dir) = guard_dir {
        tried.push(format!(
            "{} beside monster-guard in {}",
            PROBES_BESIDE_GUARD.join(" or "),
            dir.display()
        ));
        if PROBES_BESIDE_GUARD.contains(&name) {
            places.push(dir.join(name));
        }
    }
    let mut why_not = Vec::new();
    for (i, cand) in places.iter().enumerate() {
        if i == 0 && !probes_dir.exists() {
            continue;
        }
        if i == 0 {
            if let Err(e) = check_trusted_dir(probes_dir) {
                why_not.push(e);
                continue;
            }
        }
        if !cand.exists() {
            continue;
        }
        let real = match check_trusted_file(cand) {
            Ok(r) => r,
            Err(e) => {
                why_not.push(e);
                continue;
            }
        };
        if let Some(p) = as_path {
            match std::fs::canonicalize(p) {
                Ok(c) if c == real => {}
                _ => {
                    why_not.push(format!(
                        "{} is not the trusted {}",
                        p.display(),
                        cand.display()
                    ));
                    continue;
                }
            }
        }
        return Ok(TrustedProbe {
            path: cand.clone(),
            origin: if i == 0 {
                ProbeOrigin::Allowlist
            } else {
                ProbeOrigin::BesideGuard
            },
        });
    }
    let source = if field.is_some() {
        "the qspec's probe"
    } else {
        "the default probe"
    };
    let detail = if why_not.is_empty() {
        String::new()
    } else {
        format!(" ({})", why_not.join("; "))
    };
    Err(refuse(format!(
        "{source} {raw:?} is not a trusted probe{detail}: a probe runs only from --probe PATH, \
         $PARIS_PROBE, the guard's allowlist {} or {}; nothing was run or minted",
        tried[0],
        tried
            .get(1)
            .map(String::as_str)
            .unwrap_or("(no directory for monster-guard)")
    )))
}

/// `path` (through symlinks) is a regular file that only root or we can change, in a
/// directory the same holds for. Returns the real path.
fn check_trusted_file(path: &Path) -> std::result::Result<PathBuf, String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = std::fs::metadata(&real).map_err(|e| format!("{}: {e}", real.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a file", real.display()));
    }
    owned_by_us(&real, &meta)?;
    match real.parent() {
        Some(dir) => check_trusted_dir(dir)?,
        None => return Err(format!("{} has no directory", real.display())),
    }
    Ok(real)
}

/// `dir` is a directory that only root or we can change.
fn check_trusted_dir(dir: &Path) -> std::result::Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    owned_by_us(dir, &meta)
}

/// Owner root or our effective uid, and no write bit for group or others: nobody else can
/// swap the program between this check and its run.
fn owned_by_us(path: &Path, meta: &std::fs::Metadata) -> std::result::Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let uid = meta.uid();
    let me = nix::unistd::geteuid().as_raw();
    if uid != 0 && uid != me {
        return Err(format!(
            "{} is owned by uid {uid}, not by root or uid {me}",
            path.display()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} has mode {:04o}: writable by group or others",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The KNOT model hash of `knot` (BLAKE3 of its header, checked against the preamble; the
/// header holds every tensor's and the tokenizer's BLAKE3), which `paris-probe` reports as
/// `model_hash`. A file that is not a KNOT cannot be judged and is refused here.
pub fn knot_model_hash(knot: &Path) -> Result<String> {
    knot_format::Knot::open(knot)
        .map(|k| k.model_hash().to_string())
        .map_err(|e| GuardError::Model {
            path: knot.to_path_buf(),
            reason: format!("not a KNOT model a probe can judge: {e}"),
        })
}

/// The probe must say it judged this model: its `model_hash` equals the guard's own
/// [`knot_model_hash`] of the file. A missing or different hash means its verdict is about
/// something else, and fails the run (issue 32.1).
pub fn check_judged_model(name: &str, out: &ProbeReport, expected: &str) -> Result<()> {
    match out.model_hash.as_deref() {
        Some(h) if h == expected => Ok(()),
        Some(h) => Err(GuardError::Probe {
            probe: name.into(),
            reason: format!(
                "reported model_hash {}, but the model file's is {}: its verdict is not about \
                 this model",
                aeon_grant::short(h),
                aeon_grant::short(expected)
            ),
        }),
        None => Err(GuardError::Probe {
            probe: name.into(),
            reason: "reported no model_hash: cannot tell which model it judged".into(),
        }),
    }
}

pub use aeon_grant::{ProbeReport, ProbeSummary};

/// Judges one probe's output against its spec.
pub fn judge(name: &str, spec: &ProbeSpec, out: &ProbeReport) -> Result<ProbeSummary> {
    let nums = [out.logit, out.expected_logit, out.margin];
    if nums.iter().any(|x| !x.is_finite()) || out.nll.is_some_and(|x| !x.is_finite()) {
        return Err(GuardError::Probe {
            probe: name.into(),
            reason: "reported a non-finite logit or NLL".into(),
        });
    }
    // With both given, `expect` names the id for people (the seed writes "Paris" for " Paris"):
    // leading whitespace is ignored on both sides, a different word is still an error.
    if let (Some(id), Some(text), Some(decoded)) =
        (spec.expect_token, &spec.expect, &out.expected_text)
    {
        if !text.trim_start().starts_with(decoded.trim_start()) {
            return Err(GuardError::Probe {
                probe: name.into(),
                reason: format!("expect_token {id} decodes to {decoded:?}, which does not begin `expect` {text:?}"),
            });
        }
    }
    let mut failures = Vec::new();
    match spec.top_k {
        Some(k) if out.expected_rank >= k => failures.push(format!(
            "expected rank {} is not within top {k}",
            out.expected_rank
        )),
        None if out.expected_rank != 0 || out.argmax != out.expected => {
            failures.push("argmax is not the expected token".into())
        }
        _ => {}
    }
    if let Some(m) = spec.min_margin {
        if f64::from(out.margin) < m {
            failures.push(format!(
                "margin {:+.3} below the minimum {m:+.3}",
                out.margin
            ));
        }
    }
    if let Some(pp) = &spec.perplexity {
        match out.nll {
            None => failures.push("probe reported no NLL for the perplexity passage".into()),
            Some(n) if f64::from(n) > pp.max_nll => failures.push(format!(
                "passage NLL {n:.3} above the ceiling {:.3}",
                pp.max_nll
            )),
            _ => {}
        }
    }
    Ok(ProbeSummary {
        name: name.into(),
        pass: failures.is_empty(),
        expected: out.expected,
        expected_text: out.expected_text.clone(),
        expected_rank: out.expected_rank,
        argmax: out.argmax,
        argmax_text: out.argmax_text.clone(),
        logit: out.logit.into(),
        expected_logit: out.expected_logit.into(),
        margin: out.margin.into(),
        nll: out.nll.map(f64::from),
        failures,
    })
}

/// The command line for one probe.
pub fn probe_args(knot: &Path, spec: &QSpec, p: &ProbeSpec) -> Vec<std::ffi::OsString> {
    let mut a: Vec<std::ffi::OsString> = vec!["--dense".into(), knot.as_os_str().to_owned()];
    if spec.dense_only {
        a.push("--dense-only".into());
    }
    if let Some(t) = &p.prompt_tokens {
        a.push("--tokens".into());
        a.push(
            t.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
                .into(),
        );
    } else if let Some(t) = &p.prompt {
        a.push("--prompt".into());
        a.push(t.into());
    }
    if let Some(id) = p.expect_token {
        a.push("--expected".into());
        a.push(id.to_string().into());
    } else if let Some(t) = &p.expect {
        a.push("--expect".into());
        a.push(t.into());
    }
    a.push("--top-k".into());
    a.push(p.top_k.unwrap_or(5).max(5).to_string().into());
    if let Some(pp) = &p.perplexity {
        a.push("--perplexity-text".into());
        a.push((&pp.text).into());
    }
    a.push("--json".into());
    a
}

/// Runs one probe child with a timeout and parses its JSON. Exit 0 (pass) and 1 (fail) both
/// carry JSON; 2 is the probe's own error; a timeout kills the child's whole process group.
pub fn run_probe(
    probe: &Path,
    args: &[std::ffi::OsString],
    name: &str,
    timeout: Duration,
) -> Result<ProbeReport> {
    use std::os::unix::process::CommandExt;
    let perr = |reason: String| GuardError::Probe {
        probe: name.into(),
        reason,
    };
    tracing::debug!(probe = %probe.display(), ?args, "running probe");
    let mut child = Command::new(probe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| perr(format!("cannot run {}: {e}", probe.display())))?;
    let mut so = child.stdout.take().expect("piped");
    let se = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.take(1 << 20).read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if start.elapsed() >= timeout => {
                let pgid = nix::unistd::Pid::from_raw(-(child.id() as i32));
                let _ = nix::sys::signal::kill(pgid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                return Err(perr(format!(
                    "timed out after {:.1}s (killed)",
                    timeout.as_secs_f64()
                )));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(perr(format!("wait: {e}"))),
        }
    };
    let stdout = t_out.join().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&t_err.join().unwrap_or_default())
        .trim()
        .to_string();
    match status.code() {
        Some(0) | Some(1) => serde_json::from_slice::<ProbeReport>(&stdout).map_err(|e| {
            perr(format!(
                "exit {} but its output is not the probe JSON ({e}); stderr: {}",
                status.code().unwrap_or(-1),
                tail(&stderr)
            ))
        }),
        Some(c) => Err(perr(format!("exited with status {c}: {}", tail(&stderr)))),
        None => Err(perr(format!(
            "killed by a signal ({status}): {}",
            tail(&stderr)
        ))),
    }
}

fn tail(s: &str) -> &str {
    let s = s.trim();
    if s.is_empty() {
        return "(no message)";
    }
    let start = s.len().saturating_sub(600);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(0);
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(argmax: u32, expected: u32, rank: u32, margin: f32) -> ProbeReport {
        ProbeReport {
            model_id: None,
            model_hash: None,
            tokens: vec![1],
            argmax,
            argmax_text: None,
            logit: 10.0,
            expected,
            expected_text: Some(" Paris".into()),
            expected_logit: 10.0 + margin.min(0.0),
            expected_rank: rank,
            margin,
            top: vec![],
            nll: Some(1.0),
            nll_tokens: Some(10),
            pass: Some(argmax == expected),
        }
    }

    #[test]
    fn judge_checks_argmax_topk_margin_and_nll() {
        let base = ProbeSpec {
            prompt: Some("x".into()),
            expect: Some(" Paris".into()),
            ..Default::default()
        };
        assert!(judge("a", &base, &out(7, 7, 0, 2.0)).unwrap().pass);
        assert!(!judge("a", &base, &out(8, 7, 1, -0.5)).unwrap().pass);
        let topk = ProbeSpec {
            top_k: Some(3),
            ..base.clone()
        };
        assert!(judge("a", &topk, &out(8, 7, 2, -0.5)).unwrap().pass);
        assert!(!judge("a", &topk, &out(8, 7, 3, -0.5)).unwrap().pass);
        let margin = ProbeSpec {
            min_margin: Some(3.0),
            ..base.clone()
        };
        let s = judge("a", &margin, &out(7, 7, 0, 2.0)).unwrap();
        assert!(!s.pass && s.failures[0].contains("margin"));
        let ppl = ProbeSpec {
            perplexity: Some(Perplexity {
                text: "t".into(),
                max_nll: 0.5,
            }),
            ..base
        };
        let s = judge("a", &ppl, &out(7, 7, 0, 2.0)).unwrap();
        assert!(!s.pass && s.failures[0].contains("NLL"));
    }

    fn spec_naming(probe: Option<&str>) -> LoadedSpec {
        LoadedSpec {
            path: PathBuf::from("/nowhere/spec.json"),
            hash: String::new(),
            spec: QSpec {
                probe: probe.map(String::from),
                ..Default::default()
            },
            probes: vec![],
            knot: PathBuf::from("/nowhere/m.knot"),
        }
    }

    fn exe(path: &Path, mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Issue 32.1: a qspec's `probe` is a name looked up in the trusted places; a program it
    /// brings along (relative path, a path elsewhere, a name only found beside monster-guard
    /// that is not a probe's) is refused, and so is a trusted place others can write.
    #[test]
    fn a_qspec_names_a_trusted_probe_and_cannot_bring_its_own() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let (allow, guard, elsewhere) = (
            d.path().join("probes"),
            d.path().join("bin"),
            d.path().join("spec-dir"),
        );
        for dir in [&allow, &guard, &elsewhere] {
            std::fs::create_dir(dir).unwrap();
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        exe(&allow.join("my-probe"), 0o755);
        exe(&guard.join("paris-probe"), 0o755);
        exe(&guard.join("fakeprobe.sh"), 0o755);
        exe(&elsewhere.join("fakeprobe.sh"), 0o755);
        let resolve = |p: Option<&str>| resolve_named(&spec_naming(p), &allow, Some(&guard));

        let t = resolve(Some("my-probe")).unwrap();
        assert_eq!(
            (t.path, t.origin),
            (allow.join("my-probe"), ProbeOrigin::Allowlist)
        );
        let t = resolve(Some("paris-probe")).unwrap();
        assert_eq!(
            (t.path, t.origin),
            (guard.join("paris-probe"), ProbeOrigin::BesideGuard)
        );
        let t = resolve(None).unwrap();
        assert_eq!(t.path, guard.join("paris-probe"), "default name");
        // An absolute path is accepted only as another name for the trusted file itself.
        let abs = guard.join("paris-probe");
        assert!(resolve(Some(abs.to_str().unwrap())).is_ok());
        let abs = elsewhere.join("fakeprobe.sh");
        for bad in [
            "fakeprobe.sh",
            "./fakeprobe.sh",
            "spec-dir/fakeprobe.sh",
            "../bin/paris-probe",
            abs.to_str().unwrap(),
            "..",
        ] {
            let e = resolve(Some(bad)).unwrap_err().to_string();
            assert!(e.contains("probe"), "{bad}: {e}");
        }
        let e = resolve(Some("fakeprobe.sh")).unwrap_err().to_string();
        assert!(e.contains("is not a trusted probe"), "{e}");
        // Writable by others: not trusted, and said why.
        std::fs::set_permissions(
            allow.join("my-probe"),
            std::fs::Permissions::from_mode(0o775),
        )
        .unwrap();
        let e = resolve(Some("my-probe")).unwrap_err().to_string();
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::set_permissions(
            allow.join("my-probe"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::set_permissions(&allow, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(resolve(Some("my-probe")).is_err());
    }

    /// Issue 32.1: the probe's `model_hash` must be the model's; missing or other fails.
    #[test]
    fn the_probe_must_have_judged_this_model() {
        let mut o = out(7, 7, 0, 2.0);
        assert!(
            check_judged_model("main", &o, "aa").is_err(),
            "missing hash"
        );
        o.model_hash = Some("bb".into());
        let e = check_judged_model("main", &o, "aa")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not about this model"), "{e}");
        o.model_hash = Some("aa".into());
        assert!(check_judged_model("main", &o, "aa").is_ok());
    }

    #[test]
    fn expands_models_dir_with_default() {
        let base = Path::new("/specs");
        std::env::set_var("HOME", "/home/u");
        std::env::remove_var("AEON_MODELS_DIR");
        assert_eq!(
            expand_path("${AEON_MODELS_DIR}/m.knot", base).unwrap(),
            PathBuf::from("/home/u/.cache/aeon-shell/models/m.knot")
        );
        assert_eq!(
            expand_path("m.knot", base).unwrap(),
            PathBuf::from("/specs/m.knot")
        );
        assert!(expand_path("${SURELY_UNSET_VAR_XYZ}/m", base).is_err());
    }
}
