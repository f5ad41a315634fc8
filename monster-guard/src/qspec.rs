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
    /// Path of `paris-probe` (relative to the spec's directory).
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

/// Finds `paris-probe`: `explicit` (a flag), else the spec's `probe` (relative to the spec),
/// else `$PARIS_PROBE`, else `paris-probe` beside the running executable, else on `PATH`.
pub fn resolve_probe(explicit: Option<&Path>, spec: &LoadedSpec) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = &spec.spec.probe {
        return expand_path(p, spec.dir()).map_err(|reason| GuardError::Spec {
            path: spec.path.clone(),
            reason,
        });
    }
    if let Some(p) = std::env::var_os("PARIS_PROBE").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let p = dir.join("paris-probe");
        if p.is_file() {
            return Ok(p);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("paris-probe");
            if p.is_file() {
                return Ok(p);
            }
        }
    }
    Err(GuardError::Probe {
        probe: "paris-probe".into(),
        reason: "not found: set PARIS_PROBE, pass --probe, put it beside monster-guard, or on PATH"
            .into(),
    })
}

/// One entry of the probe's `top` list.
#[derive(Clone, Debug, Deserialize)]
pub struct TopEntry {
    pub id: u32,
    pub logit: f64,
    #[serde(default)]
    pub text: Option<String>,
}

/// `paris-probe --json` output (the contract in `specs/qspec.md`).
#[derive(Clone, Debug, Deserialize)]
pub struct ProbeOutput {
    #[serde(default)]
    pub model_id: Option<String>,
    #[serde(default)]
    pub model_hash: Option<String>,
    #[serde(default)]
    pub tokens: Vec<u32>,
    pub argmax: u32,
    #[serde(default)]
    pub argmax_text: Option<String>,
    pub logit: f64,
    pub expected: u32,
    #[serde(default)]
    pub expected_text: Option<String>,
    pub expected_logit: f64,
    pub expected_rank: u32,
    pub margin: f64,
    #[serde(default)]
    pub top: Vec<TopEntry>,
    #[serde(default)]
    pub nll: Option<f64>,
    #[serde(default)]
    pub nll_tokens: Option<u32>,
    #[serde(default)]
    pub pass: Option<bool>,
}

pub use aeon_grant::ProbeSummary;

/// Judges one probe's output against its spec.
pub fn judge(name: &str, spec: &ProbeSpec, out: &ProbeOutput) -> Result<ProbeSummary> {
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
        if out.margin < m {
            failures.push(format!(
                "margin {:+.3} below the minimum {m:+.3}",
                out.margin
            ));
        }
    }
    if let Some(pp) = &spec.perplexity {
        match out.nll {
            None => failures.push("probe reported no NLL for the perplexity passage".into()),
            Some(n) if n > pp.max_nll => failures.push(format!(
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
        logit: out.logit,
        expected_logit: out.expected_logit,
        margin: out.margin,
        nll: out.nll,
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
) -> Result<ProbeOutput> {
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
        Some(0) | Some(1) => serde_json::from_slice::<ProbeOutput>(&stdout).map_err(|e| {
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

    fn out(argmax: u32, expected: u32, rank: u32, margin: f64) -> ProbeOutput {
        ProbeOutput {
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
