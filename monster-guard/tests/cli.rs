//! Runs the real `monster-guard` binary in temporary `MONSTER_GUARD_HOME`s.
//!
//! Gate logic is tested with fake probes (shell scripts printing canned `paris-probe --json`
//! output); the three real verdicts (Qwen admitted, SmolLM2 refused, damaged Qwen refused) need
//! `paris-probe` (`$PARIS_PROBE`, or `target/release/paris-probe`) and the KNOT models in
//! `$AEON_MODELS_DIR` (default `~/.cache/aeon-shell/models`); without them they skip, unless
//! `AEON_REQUIRE_MODELS=1`, in which case they fail.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use test_support::{models_dir, GEMMA, QWEN, SMOLLM2};

const BIN: &str = env!("CARGO_BIN_EXE_monster-guard");

struct Env {
    dir: tempfile::TempDir,
}

impl Env {
    fn new() -> Env {
        let e = Env::bare();
        let out = e.mg(&["init"]);
        assert!(out.status.success(), "init failed: {}", text(&out));
        e
    }
    /// A home that does not exist yet (no `init`).
    fn bare() -> Env {
        Env {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }
    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .env("MONSTER_GUARD_HOME", self.home())
            .env_remove("PARIS_PROBE");
        c
    }
    fn mg(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }
    /// The guard's probes allowlist, made as an administrator would (mode 0755, root's).
    fn probes_dir(&self) -> PathBuf {
        let d = self.home().join("probes");
        fs::create_dir_all(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        d
    }
    /// Writes an executable shell script `#!/bin/sh\n{body}` at `path`.
    fn script(&self, path: &Path, body: &str) {
        fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    /// A fake probe with `body`, installed in the guard's allowlist as `fake-probe.sh`, a tiny
    /// KNOT model and a spec naming both; returns the spec. `@MODEL_HASH@` in `body` becomes
    /// the model's KNOT hash (what `paris-probe` reports).
    fn fake_spec(&self, body: &str, spec_extra: &str) -> PathBuf {
        let hash = tiny_knot(&self.path("model.knot"), "fake");
        let probe = self.probes_dir().join("fake-probe.sh");
        self.script(&probe, &body.replace("@MODEL_HASH@", &hash));
        let spec = self.path("spec.json");
        fs::write(
            &spec,
            format!(
                r#"{{"probe": "fake-probe.sh", "knot": "model.knot", "prompt_tokens": [785, 6722],
                    "expect_token": 12095, "expect": " Paris" {spec_extra}}}"#
            ),
        )
        .unwrap();
        spec
    }
    /// Delegates `name` with `caps` using a passing fake probe.
    fn delegate_ok(&self, name: &str, caps: &str, ttl: &str) -> Output {
        let spec = self.fake_spec(&json_probe(12095, 12095, 0, 3.5, 0), "");
        let out = self.mg(&[
            "delegate",
            name,
            caps,
            "--ttl",
            ttl,
            "--qspec",
            spec.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "delegate failed: {}", text(&out));
        out
    }
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Writes a valid KNOT with no tensors at `path` (a model as far as the gate can tell) and
/// returns its KNOT model hash.
fn tiny_knot(path: &Path, id: &str) -> String {
    knot_format::KnotWriter::new(id, test_support::tiny_arch(1))
        .write(path, &mut |_| {})
        .unwrap();
    knot_format::Knot::open(path)
        .unwrap()
        .model_hash()
        .to_string()
}

/// A fake probe body printing probe JSON (reporting `@MODEL_HASH@`) and exiting with `code`.
fn json_probe(argmax: u32, expected: u32, rank: u32, margin: f64, code: i32) -> String {
    format!(
        r#"cat <<'JSON'
{{"model_id": "fake", "model_hash": "@MODEL_HASH@", "tokens": [785, 6722], "argmax": {argmax}, "argmax_text": " Lyon",
 "logit": 15.0, "expected": {expected}, "expected_text": " Paris", "expected_logit": {el},
 "expected_rank": {rank}, "margin": {margin}, "top": [], "nll": 0.8, "nll_tokens": 30, "pass": {pass}}}
JSON
exit {code}"#,
        el = 15.0 + margin.min(0.0),
        pass = argmax == expected
    )
}

#[test]
fn init_writes_private_key_and_refuses_overwrite() {
    let e = Env::new();
    let key = e.home().join("node.key");
    assert_eq!(
        fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(e.home()).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let before = fs::read(&key).unwrap();
    let out = e.mg(&["init"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("already exists"), "{}", text(&out));
    assert_eq!(
        fs::read(&key).unwrap(),
        before,
        "key was overwritten without --force"
    );
    assert!(e.mg(&["init", "--force"]).status.success());
    assert_ne!(fs::read(&key).unwrap(), before);
    // A key file others can read is refused.
    fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
    let out = e.mg(&["revoke", "x"]);
    assert!(
        text(&out).contains("must not be readable"),
        "{}",
        text(&out)
    );
}

#[test]
fn delegate_passing_spec_mints_private_grant() {
    let e = Env::new();
    let out = e.delegate_ok("qwen", "net,fs", "1h");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("quality spec passed -> delegated"),
        "{}",
        text(&out)
    );
    let g = e.home().join("grants/qwen.json");
    assert_eq!(
        fs::metadata(&g).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(e.home().join("grants"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o700
    );
    let v = e.mg(&["verify", g.to_str().unwrap(), "--check-model"]);
    assert!(v.status.success(), "{}", text(&v));
    assert!(
        String::from_utf8_lossy(&v.stdout).contains("valid: grant qwen"),
        "{}",
        text(&v)
    );
    let l = e.mg(&["list"]);
    let ls = String::from_utf8_lossy(&l.stdout);
    assert!(
        ls.contains("qwen") && ls.contains("fs,net") && ls.contains("valid"),
        "{}",
        text(&l)
    );
}

#[test]
fn delegate_refuses_argmax_mismatch_and_mints_nothing() {
    let e = Env::new();
    let spec = e.fake_spec(&json_probe(4567, 12095, 1, -1.1, 1), "");
    let out = e.mg(&[
        "delegate",
        "qwen",
        "net",
        "--ttl",
        "60",
        "--qspec",
        spec.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("FAIL main") && t.contains("4567") && t.contains("12095"),
        "{t}"
    );
    assert!(t.contains("1 of 1 probes failed (main)"), "{t}");
    assert!(!t.contains("delegated"), "{t}");
    assert!(!e.home().join("grants/qwen.json").exists());
}

/// Issue 32.1 (a qspec chose its judge): `{"probe": "fakeprobe.sh", "knot": "garbage.knot"}`
/// with a script beside it printing a passing verdict, in the spec's directory and the
/// working directory. `delegate` refuses before running anything: the script never runs (its
/// marker file stays absent) and no grant is written, whether the spec names it by name, by a
/// relative path or by its absolute path.
#[test]
fn delegate_never_runs_a_probe_the_qspec_brings() {
    let e = Env::new();
    // 1 MB of bytes that are no model.
    let garbage: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(e.path("garbage.knot"), &garbage).unwrap();
    let marker = e.path("fakeprobe-ran");
    let fake = e.path("fakeprobe.sh");
    let verdict = json_probe(12095, 12095, 0, 9.0, 0)
        .replace("@MODEL_HASH@", blake3::hash(&garbage).to_hex().as_str());
    e.script(&fake, &format!("touch {}\n{verdict}", marker.display()));
    for (i, probe) in ["fakeprobe.sh", "./fakeprobe.sh", fake.to_str().unwrap()]
        .into_iter()
        .enumerate()
    {
        let spec = e.path(&format!("evil-{i}.json"));
        fs::write(
            &spec,
            serde_json::json!({
                "probe": probe, "knot": "garbage.knot", "prompt_tokens": [785, 6722],
                "expect_token": 12095
            })
            .to_string(),
        )
        .unwrap();
        let out = e
            .cmd(&["delegate", "pwn", "net,fs", "--qspec"])
            .arg(&spec)
            .current_dir(e.dir.path())
            .output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{probe}: {t}");
        assert!(t.contains("is not a trusted probe"), "{probe}: {t}");
        assert!(!marker.exists(), "{probe}: the qspec's own script ran: {t}");
        assert!(!e.home().join("grants/pwn.json").exists(), "{probe}: {t}");
    }
    // Even a trusted probe cannot admit bytes that are no model: refused before it runs.
    let trusted = e.probes_dir().join("fakeprobe.sh");
    e.script(&trusted, &format!("touch {}\n{verdict}", marker.display()));
    let out = e
        .cmd(&["delegate", "pwn", "net,fs", "--qspec"])
        .arg(e.path("evil-0.json"))
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("not a KNOT model"), "{t}");
    assert!(!marker.exists(), "{t}");
    assert!(!e.home().join("grants/pwn.json").exists(), "{t}");
}

/// Issue 32.1: a trusted probe whose `model_hash` is not the model file's (it judged another
/// model, or will not say) fails the run and mints nothing; the same probe reporting the right
/// hash mints (the normal path, also taken by `delegate_passing_spec_mints_private_grant`).
#[test]
fn delegate_refuses_a_verdict_about_another_model() {
    let e = Env::new();
    let other = tiny_knot(&e.path("other.knot"), "other");
    let passing = json_probe(12095, 12095, 0, 3.5, 0);
    for (hash, why) in [
        (other.as_str(), "reported model_hash"),
        ("", "reported no model_hash"),
    ] {
        let body = if hash.is_empty() {
            passing.replace(r#""model_hash": "@MODEL_HASH@", "#, "")
        } else {
            passing.replace("@MODEL_HASH@", hash)
        };
        let spec = e.fake_spec(&body, "");
        let out = e
            .cmd(&["delegate", "qwen", "net", "--qspec"])
            .arg(&spec)
            .output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{t}");
        assert!(t.contains(why), "{t}");
        assert!(!t.contains("delegated"), "{t}");
        assert!(!e.home().join("grants/qwen.json").exists(), "{t}");
    }
    let spec = e.fake_spec(&passing, "");
    let out = e
        .cmd(&["delegate", "qwen", "net", "--qspec"])
        .arg(&spec)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("the guard's probes/ allowlist"),
        "{}",
        text(&out)
    );
    // --probe is the administrator's choice: used as given, over the spec's name.
    let elsewhere = e.path("admin-probe.sh");
    e.script(
        &elsewhere,
        &passing.replace("@MODEL_HASH@", &tiny_knot(&e.path("model.knot"), "fake")),
    );
    let out = e
        .cmd(&["delegate", "qwen2", "net", "--qspec"])
        .arg(&spec)
        .arg("--probe")
        .arg(&elsewhere)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("(--probe)"), "{}", text(&out));
}

/// Issue 18.1: the seed's qspec labels 12095 (" Paris") as "Paris"; that must not refuse the
/// golden star, while a different word stays an error in the spec.
#[test]
fn delegate_takes_expect_as_a_label_of_expect_token() {
    let e = Env::new();
    let spec = e.fake_spec(&json_probe(12095, 12095, 0, 3.5, 0), "");
    let seed = e.path("paris.json");
    let body = fs::read_to_string(&spec).unwrap();
    fs::write(&seed, body.replace("\" Paris\"", "\"Paris\"")).unwrap();
    let out = e
        .cmd(&[
            "delegate",
            "qwen-0.5b-agent",
            "net,fs",
            "--ttl",
            "3600",
            "--qspec",
        ])
        .arg(&seed)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("quality spec passed -> delegated"),
        "{}",
        text(&out)
    );
    let wrong = e.path("lyon.json");
    fs::write(&wrong, body.replace("\" Paris\"", "\"Lyon\"")).unwrap();
    let out = e
        .cmd(&["delegate", "lyon", "net", "--qspec"])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("does not begin"), "{}", text(&out));
    assert!(!e.home().join("grants/lyon.json").exists());
}

/// Issue 18.2: the seed never runs `init`, and its step 4 gives no `--ttl`.
#[test]
fn first_delegate_creates_the_node_key_and_ttl_defaults_to_an_hour() {
    let e = Env::bare();
    assert!(!e.home().exists());
    let spec = e.fake_spec(&json_probe(12095, 12095, 0, 3.5, 0), "");
    let out = e
        .cmd(&["delegate", "qwen", "net,fs", "--qspec"])
        .arg(&spec)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no node key") && err.contains("created"),
        "{}",
        text(&out)
    );
    assert_eq!(
        fs::metadata(e.home().join("node.key"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    let g: serde_json::Value =
        serde_json::from_slice(&fs::read(e.home().join("grants/qwen.json")).unwrap()).unwrap();
    let (issued, expires) = (
        g["grant"]["issued"].as_u64().unwrap(),
        g["grant"]["expires"].as_u64().unwrap(),
    );
    assert_eq!(expires - issued, 3600, "default --ttl");
    // The second delegation uses that key and says nothing about it.
    let out = e
        .cmd(&["delegate", "qwen2", "net", "--qspec"])
        .arg(&spec)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("created"));
    let v = e.mg(&[
        "verify",
        e.home().join("grants/qwen.json").to_str().unwrap(),
    ]);
    assert!(v.status.success(), "{}", text(&v));
}

#[test]
fn delegate_refuses_small_margin_and_names_probe() {
    let e = Env::new();
    let spec = e.fake_spec(
        &json_probe(12095, 12095, 0, 0.4, 0),
        r#", "min_margin": 1.0, "probes": [{"name": "second", "prompt": "x", "expect": " y", "top_k": 3}]"#,
    );
    let out = e.mg(&[
        "delegate",
        "qwen",
        "net",
        "--ttl",
        "60",
        "--qspec",
        spec.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("margin +0.400 below the minimum +1.000"), "{t}");
    assert!(t.contains("PASS second"), "{t}");
    assert!(t.contains("1 of 2 probes failed (main)"), "{t}");
}

#[test]
fn delegate_probe_timeout_and_probe_error_are_errors() {
    let e = Env::new();
    let spec = e.fake_spec("sleep 30", r#", "timeout_secs": 1"#);
    let t0 = Instant::now();
    let out = e.mg(&[
        "delegate",
        "qwen",
        "net",
        "--ttl",
        "60",
        "--qspec",
        spec.to_str().unwrap(),
    ]);
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "timeout did not fire"
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("timed out after 1.0s"),
        "{}",
        text(&out)
    );

    let spec = e.fake_spec("echo 'tensor blk.3.attn_q.weight missing' >&2; exit 2", "");
    let out = e.mg(&[
        "delegate",
        "qwen",
        "net",
        "--ttl",
        "60",
        "--qspec",
        spec.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        text(&out).contains("exited with status 2: tensor blk.3.attn_q.weight missing"),
        "{}",
        text(&out)
    );
    assert!(!e.home().join("grants/qwen.json").exists());
}

#[test]
fn lease_kills_sleep_at_about_two_seconds() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let t0 = Instant::now();
    let out = e.mg(&[
        "run", "--name", "qwen", "--caps", "net,fs", "--lease", "2", "--", "sleep", "100",
    ]);
    let took = t0.elapsed().as_secs_f64();
    assert_eq!(out.status.code(), Some(124), "{}", text(&out));
    assert!((1.5..4.0).contains(&took), "lease ended after {took:.2}s");
    assert!(
        text(&out).contains("lease of 2.0s expired"),
        "{}",
        text(&out)
    );
}

#[test]
fn run_passes_command_status_through() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let out = e.mg(&[
        "run", "--name", "qwen", "--caps", "net", "--lease", "30", "--", "sh", "-c", "exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", text(&out));
    // Caps the grant lacks are refused.
    e.delegate_ok("small", "net", "1h");
    let out = e.mg(&[
        "run", "--name", "small", "--caps", "net,fs", "--lease", "30", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("does not cover fs"), "{}", text(&out));
}

#[test]
fn revoke_from_another_process_stops_lease_within_a_second() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let mut child = e
        .cmd(&[
            "run", "--name", "qwen", "--caps", "net,fs", "--lease", "60", "--", "sleep", "100",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    assert!(child.try_wait().unwrap().is_none(), "run ended early");
    let out = e.mg(&["revoke", "qwen"]);
    assert!(out.status.success(), "{}", text(&out));
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "revoked lease still running"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(1), "revocation took {took:?}");
    assert_eq!(status.code(), Some(125));
    // And the revoked grant no longer verifies or runs.
    let g = e.home().join("grants/qwen.json");
    let v = e.mg(&["verify", g.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3));
    assert!(text(&v).contains("was revoked"), "{}", text(&v));
    assert!(String::from_utf8_lossy(&e.mg(&["list"]).stdout).contains("revoked"));
}

#[test]
fn flipped_byte_grant_is_refused() {
    let e = Env::new();
    e.delegate_ok("qwen", "net", "1h");
    let g = e.home().join("grants/qwen.json");
    let mut bytes = fs::read(&g).unwrap();
    // Flip a byte inside the signed payload: the expiry digits.
    let at = String::from_utf8_lossy(&bytes)
        .find("\"expires\":")
        .unwrap()
        + 12;
    bytes[at] = if bytes[at] == b'1' { b'2' } else { b'1' };
    let bad = e.path("flipped.json");
    fs::write(&bad, &bytes).unwrap();
    let v = e.mg(&["verify", bad.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    assert!(
        text(&v).contains("signature does not verify"),
        "{}",
        text(&v)
    );
    let r = e.mg(&[
        "run",
        "--grant",
        bad.to_str().unwrap(),
        "--caps",
        "net",
        "--lease",
        "5",
        "--",
        "true",
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", text(&r));
    // A flipped byte in the signature itself.
    let mut bytes = fs::read(&g).unwrap();
    let at = String::from_utf8_lossy(&bytes).find("\"sig\":\"").unwrap() + 10;
    bytes[at] = if bytes[at] == b'a' { b'b' } else { b'a' };
    fs::write(&bad, &bytes).unwrap();
    let v = e.mg(&["verify", bad.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    // A grant from another node's key is refused by this node.
    let other = Env::new();
    other.delegate_ok("qwen", "net", "1h");
    let foreign = other.home().join("grants/qwen.json");
    let v = e.mg(&["verify", foreign.to_str().unwrap()]);
    assert!(
        text(&v).contains("not by the trusted issuer"),
        "{}",
        text(&v)
    );
}

#[test]
fn expired_grant_is_refused() {
    let e = Env::new();
    e.delegate_ok("qwen", "net", "1");
    std::thread::sleep(Duration::from_millis(2100));
    let g = e.home().join("grants/qwen.json");
    let v = e.mg(&["verify", g.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    assert!(text(&v).contains("expired"), "{}", text(&v));
    let r = e.mg(&[
        "run", "--name", "qwen", "--caps", "net", "--lease", "5", "--", "true",
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", text(&r));
    assert!(text(&r).contains("expired"), "{}", text(&r));
}

#[test]
fn model_changed_after_admission_is_refused() {
    let e = Env::new();
    e.delegate_ok("qwen", "net", "1h");
    let ok = e.mg(&[
        "run", "--name", "qwen", "--caps", "net", "--lease", "5", "--", "true",
    ]);
    assert_eq!(ok.status.code(), Some(0), "{}", text(&ok));
    fs::write(e.path("model.knot"), b"not really a model, but it hashes!").unwrap();
    let r = e.mg(&[
        "run", "--name", "qwen", "--caps", "net", "--lease", "5", "--", "true",
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", text(&r));
    assert!(text(&r).contains("changed since admission"), "{}", text(&r));
    let g = e.home().join("grants/qwen.json");
    let v = e.mg(&["verify", g.to_str().unwrap(), "--check-model"]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
}

#[test]
fn attenuation_narrows_and_cannot_widen() {
    let e = Env::new();
    e.delegate_ok("qwen", "net", "1h");
    let parent = e.home().join("grants/qwen.json");
    let p = parent.to_str().unwrap();
    let wide = e.mg(&["attenuate", p, "--caps", "net,fs"]);
    assert_eq!(wide.status.code(), Some(2), "{}", text(&wide));
    assert!(text(&wide).contains("can only narrow"), "{}", text(&wide));
    let long = e.mg(&["attenuate", p, "--ttl", "2h"]);
    assert_eq!(long.status.code(), Some(2), "{}", text(&long));
    assert!(text(&long).contains("after the parent"), "{}", text(&long));
    let child = e.path("child.json");
    let c = e.mg(&[
        "attenuate",
        p,
        "--caps",
        "none",
        "--ttl",
        "60",
        "--out",
        child.to_str().unwrap(),
    ]);
    assert!(c.status.success(), "{}", text(&c));
    assert_eq!(
        fs::metadata(&child).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Verifiable offline with the exported public key alone, in another directory.
    let pk = e.path("issuer.pub");
    assert!(e
        .mg(&["pubkey", "export", "--out", pk.to_str().unwrap()])
        .status
        .success());
    let v = Command::new(BIN)
        .env("MONSTER_GUARD_HOME", e.path("nowhere"))
        .args([
            "verify",
            child.to_str().unwrap(),
            "--pubkey",
            pk.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", text(&v));
    assert!(
        String::from_utf8_lossy(&v.stdout).contains("caps none")
            && String::from_utf8_lossy(&v.stdout).contains("2 link(s)")
    );
    // The child cannot be used for a cap it dropped; attenuating it back up is refused.
    let r = e.mg(&[
        "run",
        "--grant",
        child.to_str().unwrap(),
        "--caps",
        "net",
        "--lease",
        "5",
        "--",
        "true",
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", text(&r));
    let up = e.mg(&["attenuate", child.to_str().unwrap(), "--caps", "net"]);
    assert_eq!(up.status.code(), Some(2), "{}", text(&up));
    // Revoking the parent revokes the child.
    assert!(e.mg(&["revoke", "qwen"]).status.success());
    let v = e.mg(&["verify", child.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
}

#[test]
fn without_net_cap_command_has_no_network_and_without_fs_a_readonly_root() {
    if !nix_is_root() {
        eprintln!("skipping: namespace isolation test needs root");
        return;
    }
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    // /proc/net/dev lists interfaces: 2 header lines + lo only in a new network namespace.
    let count = |caps: &str| {
        let o = e.mg(&[
            "run",
            "--name",
            "qwen",
            "--caps",
            caps,
            "--lease",
            "10",
            "--",
            "sh",
            "-c",
            "tail -n +3 /proc/net/dev | wc -l",
        ]);
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    assert_eq!(count("fs"), 1, "only loopback without the net cap");
    let host = fs::read_to_string("/proc/net/dev").unwrap().lines().count() as u32 - 2;
    assert_eq!(count("net,fs"), host);
    // Without fs, the root mount is read-only for the command (and only for it).
    let probe = format!("/monster-guard-rofs-{}", std::process::id());
    let o = e.mg(&[
        "run",
        "--name",
        "qwen",
        "--caps",
        "net",
        "--lease",
        "10",
        "--",
        "sh",
        "-c",
        &format!("touch {probe}"),
    ]);
    let created = Path::new(&probe).exists();
    let _ = fs::remove_file(&probe);
    assert!(
        !created && !o.status.success(),
        "root was writable without fs: {}",
        text(&o)
    );
}

fn nix_is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------------------------
// Real-model verdicts.

fn find_probe() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PARIS_PROBE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let beside = Path::new(BIN).with_file_name("paris-probe");
    let release = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/paris-probe");
    [beside, release].into_iter().find(|p| p.is_file())
}

/// The probe and the named models, or `None` (skip) when absent and not required.
fn real_setup(models: &[&str]) -> Option<(PathBuf, Vec<PathBuf>)> {
    let required = test_support::required();
    let mut missing = Vec::new();
    let probe = find_probe();
    if probe.is_none() {
        missing
            .push("paris-probe (set PARIS_PROBE or build target/release/paris-probe)".to_string());
    }
    let paths: Vec<PathBuf> = models.iter().map(|m| models_dir().join(m)).collect();
    for p in &paths {
        if !p.is_file() {
            missing.push(format!("{} (run scripts/fetch-model.sh)", p.display()));
        }
    }
    if missing.is_empty() {
        return Some((probe.unwrap(), paths));
    }
    assert!(
        !required,
        "AEON_REQUIRE_MODELS=1 but missing: {}",
        missing.join(", ")
    );
    eprintln!(
        "skipping real-model verdict: missing {}",
        missing.join(", ")
    );
    None
}

fn spec(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../specs")
        .join(name)
}

/// `delegate` of the Qwen facts suite on `knot`.
fn delegate_real(e: &Env, probe: &Path, knot: &Path) -> Output {
    delegate_with(e, probe, knot, "qwen-facts.json")
}

fn delegate_with(e: &Env, probe: &Path, knot: &Path, qspec: &str) -> Output {
    e.cmd(&["delegate", "model", "net", "--ttl", "600", "--qspec"])
        .arg(spec(qspec))
        .args([
            "--knot",
            knot.to_str().unwrap(),
            "--probe",
            probe.to_str().unwrap(),
        ])
        .output()
        .unwrap()
}

#[test]
fn real_qwen_is_admitted_by_facts_suite() {
    let Some((probe, m)) = real_setup(&[QWEN]) else {
        return;
    };
    let e = Env::new();
    let out = delegate_real(&e, &probe, &m[0]);
    eprintln!("{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("quality spec passed -> delegated"));
    // And the reference single-probe spec admits it too.
    let out = e
        .cmd(&["delegate", "paris", "net", "--ttl", "600", "--qspec"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../specs/paris.json"))
        .args([
            "--knot",
            m[0].to_str().unwrap(),
            "--probe",
            probe.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}

/// Issue 18.1/18.2 with the real probe: the seed's qspec verbatim (prompt tokens, expect_token
/// 12095, `"expect": "Paris"`), delegated on a fresh home exactly as the seed's step 4 does.
#[test]
fn real_seed_qspec_delegates_on_a_fresh_home() {
    let Some((probe, m)) = real_setup(&[QWEN]) else {
        return;
    };
    let e = Env::bare();
    let spec = e.path("paris.json");
    // The seed names its probe; the name is found beside monster-guard (or the harness's
    // $PARIS_PROBE when the probe was built elsewhere).
    let beside = Path::new(BIN).with_file_name("paris-probe");
    let seed = serde_json::json!({
        "probe": "paris-probe",
        "knot": m[0],
        "prompt_tokens": [785, 6722, 315, 9625, 374],
        "expect_token": 12095,
        "expect": "Paris"
    });
    fs::write(&spec, seed.to_string()).unwrap();
    let out = e
        .cmd(&[
            "delegate",
            "qwen-0.5b-agent",
            "net,fs",
            "--ttl",
            "3600",
            "--qspec",
        ])
        .arg(&spec)
        .envs((!beside.is_file()).then(|| ("PARIS_PROBE", probe.clone())))
        .output()
        .unwrap();
    eprintln!("{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("quality spec passed -> delegated"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("created"));
}

#[test]
fn real_smollm2_is_refused_naming_failed_probes() {
    let Some((probe, m)) = real_setup(&[SMOLLM2]) else {
        return;
    };
    let e = Env::new();
    let out = delegate_real(&e, &probe, &m[0]);
    eprintln!("{}", text(&out));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let t = text(&out);
    // SmolLM2 passes the Paris control but fails the discriminating probes.
    assert!(t.contains("PASS paris"), "{t}");
    for p in [
        "numpy_alias",
        "pandas_alias",
        "moon_landing",
        "css_top5",
        "rust_vec_top5",
    ] {
        assert!(
            t.contains(&format!("FAIL {p}")),
            "{p} not reported failed: {t}"
        );
    }
    assert!(t.contains("probes failed ("), "{t}");
    assert!(!e.home().join("grants/model.json").exists());
}

#[test]
fn real_damaged_qwen_is_refused() {
    let Some((probe, m)) = real_setup(&[QWEN]) else {
        return;
    };
    let e = Env::new();
    let damaged = e.path("qwen-damaged.knot");
    write_damaged_copy(&m[0], &damaged, 12);
    let out = delegate_real(&e, &probe, &damaged);
    eprintln!("{}", text(&out));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("FAIL paris"), "{}", text(&out));
}

/// Issue 19: Gemma has its own suite (completions led by bos; figures in specs/qspec.md). It
/// admits Gemma-3-270M, every probe passing.
#[test]
fn real_gemma_is_admitted_by_its_facts_suite() {
    let Some((probe, m)) = real_setup(&[GEMMA]) else {
        return;
    };
    let e = Env::new();
    let out = delegate_with(&e, &probe, &m[0], "gemma-facts.json");
    eprintln!("{}", text(&out));
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    for p in [
        "paris_top5",
        "france",
        "moon_landing",
        "hamlet",
        "numpy_alias",
    ] {
        assert!(t.contains(&format!("PASS {p}")), "{p}: {t}");
    }
    assert!(e.home().join("grants/model.json").exists());
}

/// ... and refuses what is not Gemma-3-270M at its quality: SmolLM2 (which knows its Paris but
/// not the rest) and a Gemma whose middle layer is scrambled.
#[test]
fn real_gemma_suite_refuses_smollm2_and_a_damaged_gemma() {
    let Some((probe, m)) = real_setup(&[GEMMA, SMOLLM2]) else {
        return;
    };
    let e = Env::new();
    let out = delegate_with(&e, &probe, &m[1], "gemma-facts.json");
    eprintln!("{}", text(&out));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("PASS paris_top5"), "{t}");
    for p in ["france", "moon_landing", "hamlet", "numpy_alias"] {
        assert!(t.contains(&format!("FAIL {p}")), "{p}: {t}");
    }
    let damaged = e.path("gemma-damaged.knot");
    write_damaged_copy(&m[0], &damaged, 9);
    let out = delegate_with(&e, &probe, &damaged, "gemma-facts.json");
    eprintln!("{}", text(&out));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("FAIL paris_top5"), "{}", text(&out));
    assert!(!e.home().join("grants/model.json").exists());
}

/// Each model is gated on its own suite: the coder suite refuses Gemma where it does not know
/// (it ranks " the" over " Paris" and has no Rust).
#[test]
fn real_gemma_is_refused_by_the_qwen_suite() {
    let Some((probe, m)) = real_setup(&[GEMMA]) else {
        return;
    };
    let e = Env::new();
    let out = delegate_real(&e, &probe, &m[0]);
    eprintln!("{}", text(&out));
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains("FAIL paris"), "{t}");
    assert!(t.contains("probes failed ("), "{t}");
}

/// Writes a valid KNOT copy of `src` whose layer `layer` is scrambled: the quantization blocks
/// of every tensor of the layer in reverse order (norm and bias vectors element-reversed).
/// Every hash is recomputed, so `knot verify` accepts it: only the quality gate can tell.
fn write_damaged_copy(src: &Path, dst: &Path, layer: u32) {
    let k = knot_format::Knot::open(src).unwrap();
    let h = k.header().clone();
    let mut w = knot_format::KnotWriter::new(h.model_id.clone(), h.arch.clone());
    if let Some(t) = k.tokenizer().unwrap() {
        w.tokenizer(t);
    }
    if let Some(s) = h.shard.clone() {
        w.shard(s);
    }
    let mut scrambled = 0;
    for t in k.tensors() {
        let e = t.entry;
        if t.layer() == Some(layer) {
            let bs = e.dtype.block_bytes();
            let bytes: Vec<u8> = t.bytes.chunks_exact(bs).rev().flatten().copied().collect();
            w.add_tensor_owned(&e.name, e.dtype, e.shape.clone(), bytes)
                .unwrap();
            scrambled += 1;
        } else {
            w.add_tensor(&e.name, e.dtype, e.shape.clone(), t.bytes)
                .unwrap();
        }
    }
    assert!(scrambled > 0, "no tensors in layer {layer}");
    w.write(dst, &mut |_| {}).unwrap();
    let d = knot_format::Knot::open(dst).unwrap();
    d.verify(&mut |_| {}).unwrap();
    assert_ne!(d.model_hash(), k.model_hash());
}

// ---------------------------------------------------------------------------------------------
// Issue 16: the lease contains the whole process tree, caps are a ceiling, revocation sticks.

/// A sleep argument no other process has (`sleep 301.<unique>`), to find the process later.
fn marker() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "301.{}{:03}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Pids of live processes with `arg` among their arguments.
fn alive_with(arg: &str) -> Vec<u32> {
    let mut v = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rfind(')')
            .is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'));
        let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !zombie && cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()) {
            v.push(pid);
        }
    }
    v
}

/// Waits up to `limit` for no process with `arg` to be alive; kills leftovers so a failing
/// test leaves nothing behind. Returns the pids that were still alive.
fn none_alive_within(arg: &str, limit: Duration) -> Vec<u32> {
    let t = Instant::now();
    loop {
        let left = alive_with(arg);
        if left.is_empty() {
            return left;
        }
        if t.elapsed() > limit {
            for p in &left {
                let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
            }
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

const CONTAINMENTS: [&str; 2] = ["auto", "subreaper"];

/// Issue 16.8: `sh -c 'sleep 301 &'` returned at once and the sleep outlived the lease.
#[test]
fn lease_kills_background_children_when_the_command_exits() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    for contain in CONTAINMENTS {
        let m = marker();
        let out = e.mg(&[
            "run",
            "--name",
            "qwen",
            "--caps",
            "net,fs",
            "--lease",
            "30",
            "--contain",
            contain,
            "--",
            "sh",
            "-c",
            &format!("sleep {m} & sleep {m} & exit 3"),
        ]);
        assert_eq!(out.status.code(), Some(3), "{contain}: {}", text(&out));
        let left = none_alive_within(&m, Duration::from_secs(2));
        assert!(
            left.is_empty(),
            "{contain}: background sleeps {left:?} outlived the command"
        );
    }
}

/// Issue 16.8: a `setsid sleep &` survived the lease's exit 124.
#[test]
fn lease_expiry_kills_setsid_and_double_forked_descendants() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    for contain in CONTAINMENTS {
        let m = marker();
        let script = format!("setsid sleep {m} & (sh -c 'sleep {m} &' &) ; sleep 100");
        let out = e.mg(&[
            "run",
            "--name",
            "qwen",
            "--caps",
            "net,fs",
            "--lease",
            "1",
            "--contain",
            contain,
            "--",
            "sh",
            "-c",
            &script,
        ]);
        assert_eq!(out.status.code(), Some(124), "{contain}: {}", text(&out));
        let left = none_alive_within(&m, Duration::from_secs(2));
        assert!(left.is_empty(), "{contain}: {left:?} survived the lease");
    }
}

/// Issue 16.8: `kill -9` of monster-guard left the grandchildren running past the lease.
#[test]
fn killing_the_guard_kills_every_descendant() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    for contain in CONTAINMENTS {
        let m = marker();
        let script = format!("sleep {m} & setsid sleep {m} & sleep {m}");
        let mut guard = e
            .cmd(&[
                "run",
                "--name",
                "qwen",
                "--caps",
                "net,fs",
                "--lease",
                "60",
                "--contain",
                contain,
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while alive_with(&m).len() < 3 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{contain}: sleeps never started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        guard.kill().unwrap();
        guard.wait().unwrap();
        let left = none_alive_within(&m, Duration::from_secs(3));
        assert!(
            left.is_empty(),
            "{contain}: {left:?} outlived monster-guard"
        );
    }
}

/// The capability lines and NoNewPrivs of `/proc/self/status`, as the leased command sees them.
fn status_of_leased(e: &Env, caps: &str) -> String {
    let out = e.mg(&[
        "run",
        "--name",
        "qwen",
        "--caps",
        caps,
        "--lease",
        "10",
        "--",
        "grep",
        "-E",
        "^(Cap|NoNewPrivs)",
        "/proc/self/status",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Issue 16.7: `--caps ""` still had CapEff 000001fffeffffff, and `mount -o remount,rw /`
/// worked.
#[test]
fn leased_command_keeps_only_the_capabilities_its_caps_map_to() {
    if !nix_is_root() {
        eprintln!("skipping: capability test needs root");
        return;
    }
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let none = status_of_leased(&e, "");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            none.contains(&format!("{set}:\t0000000000000000")),
            "{set} not empty: {none}"
        );
    }
    assert!(none.contains("NoNewPrivs:\t1"), "{none}");
    // net -> NET_BIND_SERVICE, NET_RAW; fs -> CHOWN, DAC_OVERRIDE, FOWNER, FSETID (specs/caps.md).
    let both = status_of_leased(&e, "net,fs");
    assert!(both.contains("CapBnd:\t000000000000241b"), "{both}");
    assert!(both.contains("CapEff:\t000000000000241b"), "{both}");
    let fs_only = status_of_leased(&e, "fs");
    assert!(fs_only.contains("CapBnd:\t000000000000001b"), "{fs_only}");
    // Kernel tunables are read-only whatever the caps (uid 0 writes them by file mode alone:
    // before, `--caps ""` rewrote core_pattern). The value written is the one read back.
    for caps in ["", "fs", "net,fs"] {
        let out = e.mg(&[
            "run", "--name", "qwen", "--caps", caps, "--lease", "10", "--", "sh", "-c",
            "v=$(cat /proc/sys/kernel/core_pattern); echo \"$v\" > /proc/sys/kernel/core_pattern 2>/dev/null && echo WROTE; grep -E ' /sys (ro|rw),' /proc/self/mountinfo",
        ]);
        let so = String::from_utf8_lossy(&out.stdout);
        assert!(!so.contains("WROTE"), "--caps {caps:?}: {}", text(&out));
        assert!(so.contains(" /sys ro,"), "--caps {caps:?}: {}", text(&out));
    }
    // Without CAP_SYS_ADMIN the read-only root cannot be made writable again.
    let out = e.mg(&[
        "run", "--name", "qwen", "--caps", "", "--lease", "10", "--", "sh", "-c",
        "mount -o remount,rw / 2>/dev/null && echo REMOUNTED; touch /mg-rw-probe 2>/dev/null && echo WROTE; true",
    ]);
    let _ = fs::remove_file("/mg-rw-probe");
    assert!(out.status.success(), "{}", text(&out));
    let so = String::from_utf8_lossy(&out.stdout);
    assert!(
        !so.contains("REMOUNTED") && !so.contains("WROTE"),
        "{}",
        text(&out)
    );
}

/// A seccomp filter that makes every namespace-creating call fail, as inside a sliver without
/// CAP_SYS_ADMIN and without user namespaces.
fn no_namespaces_filter() -> [seccompiler::BpfProgram; 2] {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule,
    };
    let ns = [
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
        libc::CLONE_NEWNS,
    ];
    let rule = |f: i32| {
        SeccompRule::new(vec![SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(f as u64),
            f as u64,
        )
        .unwrap()])
        .unwrap()
    };
    let rules: std::collections::BTreeMap<i64, Vec<SeccompRule>> = [
        (libc::SYS_clone, ns.iter().map(|f| rule(*f)).collect()),
        (libc::SYS_unshare, vec![]),
        (libc::SYS_setns, vec![]),
    ]
    .into_iter()
    .collect();
    let f: seccompiler::BpfProgram = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap()
    .try_into()
    .unwrap();
    // clone3 cannot be filtered by its flags (they sit in memory): ENOSYS makes libc use clone.
    let clone3: seccompiler::BpfProgram = SeccompFilter::new(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        std::env::consts::ARCH.try_into().unwrap(),
    )
    .unwrap()
    .try_into()
    .unwrap();
    [f, clone3]
}

/// The interplay with swerve: inside a sliver that cannot create namespaces, `run --caps fs`
/// (the golden star's step 5) still runs the command, contained by a subreaper, with its IP
/// sockets denied instead of a network namespace, and says so; `--caps ""` (which needs a
/// read-only root) is refused rather than run with a writable one.
#[test]
fn without_namespace_rights_the_lease_falls_back_and_says_so() {
    if !nix_is_root() {
        eprintln!("skipping: needs root to install the test's seccomp filter");
        return;
    }
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let filter = no_namespaces_filter();
    let confined = |caps: &str, script: &str| {
        let mut c = e.cmd(&[
            "run", "--name", "qwen", "--caps", caps, "--lease", "20", "--", "sh", "-c", script,
        ]);
        let f = filter.clone();
        // SAFETY: between fork and exec: prctl and one seccomp syscall on a prepared program.
        unsafe {
            use std::os::unix::process::CommandExt;
            c.pre_exec(move || {
                libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
                for p in &f {
                    seccompiler::apply_filter(p)
                        .map_err(|_| std::io::Error::from_raw_os_error(libc::EPERM))?;
                }
                Ok(())
            });
        }
        c.output().unwrap()
    };
    let m = marker();
    let probe = format!(
        "echo RAN; sleep {m} & (exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED; true"
    );
    let out = confined("fs", &format!("bash -c '{probe}'"));
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("RAN") && !t.contains("CONNECTED"), "{t}");
    assert!(t.contains("a subreaper") && t.contains("seccomp"), "{t}");
    assert!(
        none_alive_within(&m, Duration::from_secs(2)).is_empty(),
        "{t}"
    );
    let out = confined("", "echo RAN");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(!t.contains("RAN") && t.contains("read-only root"), "{t}");
}

/// Issue 16.9: putting back an older signed list re-validated a grant revoked later, and
/// deleting the list re-validated every revoked grant.
#[test]
fn older_or_deleted_revocation_list_is_refused() {
    let e = Env::new();
    e.delegate_ok("a", "net", "1h");
    e.delegate_ok("b", "net", "1h");
    let list = e.home().join("revoked.json");
    let b = e.home().join("grants/b.json");
    assert!(e.mg(&["revoke", "a"]).status.success());
    let old = fs::read(&list).unwrap();
    let out = e.mg(&["revoke", "b"]);
    assert!(text(&out).contains("sequence 2"), "{}", text(&out));
    let v = e.mg(&["verify", b.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    // The older copy put back.
    fs::write(&list, &old).unwrap();
    let v = e.mg(&["verify", b.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    assert!(
        text(&v).contains("older than the newest seen (2)"),
        "{}",
        text(&v)
    );
    let r = e.mg(&[
        "run", "--name", "b", "--caps", "net", "--lease", "5", "--", "true",
    ]);
    assert_eq!(r.status.code(), Some(3), "{}", text(&r));
    // Revoking on top of an old list must not restart the sequence either.
    let r = e.mg(&["revoke", "a"]);
    assert_ne!(r.status.code(), Some(0), "{}", text(&r));
    // The list deleted.
    fs::remove_file(&list).unwrap();
    let a = e.home().join("grants/a.json");
    let v = e.mg(&["verify", a.to_str().unwrap()]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    assert!(text(&v).contains("is missing"), "{}", text(&v));
    let l = e.mg(&["list"]);
    assert_ne!(l.status.code(), Some(0), "{}", text(&l));
}

/// The same during a lease: an older list put back ends the lease (fail closed).
#[test]
fn older_revocation_list_during_a_lease_stops_it() {
    let e = Env::new();
    e.delegate_ok("a", "net", "1h");
    e.delegate_ok("b", "net,fs", "1h");
    let list = e.home().join("revoked.json");
    assert!(e.mg(&["revoke", "a"]).status.success());
    let old = fs::read(&list).unwrap();
    e.delegate_ok("c", "net", "1h");
    assert!(e.mg(&["revoke", "c"]).status.success());
    let mut child = e
        .cmd(&[
            "run", "--name", "b", "--caps", "net,fs", "--lease", "60", "--", "sleep", "100",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "run ended early");
    let tmp = e.path("old.json");
    fs::write(&tmp, &old).unwrap();
    fs::rename(&tmp, &list).unwrap();
    let t0 = Instant::now();
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "lease not stopped");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(out.status.code(), Some(125), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("older than the newest seen"));
}

/// The command gets a session of its own (no controlling terminal to type into, issue 16's
/// TIOCSTI concern for leases too): its session id is not monster-guard's.
#[test]
fn leased_command_runs_in_a_session_of_its_own() {
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let out = e
        .cmd(&[
            "run",
            "--name",
            "qwen",
            "--caps",
            "net,fs",
            "--lease",
            "10",
            "--",
            "cat",
            "/proc/self/stat",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stat = String::from_utf8_lossy(&out.stdout).into_owned();
    let field = |s: &str, n: usize| -> i64 {
        let rest = &s[s.rfind(')').unwrap() + 1..];
        rest.split_whitespace().nth(n).unwrap().parse().unwrap()
    };
    // After the name: state(0) ppid(1) pgrp(2) session(3).
    let ours = field(&fs::read_to_string("/proc/self/stat").unwrap(), 3);
    assert_ne!(
        field(&stat, 3),
        ours,
        "the command shares monster-guard's session"
    );
}

// ---------------------------------------------------------------------------------------------
// Issue 32: the wall (key hiding, seccomp, cgroup namespace).

/// Runs `sh -c script` under the stored grant `qwen` with `caps`, from `cwd`, the script's $1
/// being `arg`.
fn leased_sh(e: &Env, caps: &str, cwd: &Path, script: &str, arg: &str) -> Output {
    e.cmd(&[
        "run", "--name", "qwen", "--caps", caps, "--lease", "20", "--", "sh", "-c", script, "sh",
        arg,
    ])
    .current_dir(cwd)
    .output()
    .unwrap()
}

/// Issue 32.2: `run --caps "" -- cat "$MONSTER_GUARD_HOME/node.key"` printed the ed25519 seed
/// (the command is uid 0, the key was in its view and its path exported to it).
#[test]
fn leased_command_cannot_read_the_node_key_nor_learn_where_it_is() {
    if !nix_is_root() {
        eprintln!("skipping: the lease's mount namespace needs root here");
        return;
    }
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let home = e.home();
    let key = fs::read_to_string(home.join("node.key")).unwrap();
    let key = key.trim();
    assert!(key.len() >= 64, "unexpected key file {key:?}");
    let home_s = home.to_str().unwrap();
    for caps in ["", "fs", "net,fs"] {
        // By its path and by listing the home, from outside it.
        let out = leased_sh(
            &e,
            caps,
            e.dir.path(),
            "cat \"$1/node.key\" && echo READ-BY-PATH; ls -A \"$1\" | grep -c . ; echo ENV; env",
            home_s,
        );
        let t = text(&out);
        let so = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "--caps {caps:?}: {t}");
        assert!(!so.contains(key), "--caps {caps:?}: the key leaked: {t}");
        assert!(!so.contains("READ-BY-PATH"), "--caps {caps:?}: {t}");
        let (listing, env) = so.split_once("ENV\n").unwrap();
        assert_eq!(
            listing.trim(),
            "0",
            "--caps {caps:?}: the home is not empty: {t}"
        );
        assert!(
            !env.contains("MONSTER_GUARD_HOME") && !env.contains(home_s),
            "--caps {caps:?}: the environment names the guard's home: {env}"
        );
        // From the home itself as the working directory (a cwd keeps the directory it names).
        let out = leased_sh(
            &e,
            caps,
            &home,
            "cat node.key && echo READ-BY-CWD; true",
            "",
        );
        let t = text(&out);
        assert!(out.status.success(), "--caps {caps:?}: {t}");
        assert!(
            !t.contains(key) && !t.contains("READ-BY-CWD"),
            "--caps {caps:?}: {t}"
        );
        // The lease's own variables still reach it.
        assert!(env.contains("MONSTER_GUARD_GRANT=qwen"), "{env}");
    }
    // Nor beneath the filesystem: a block device (uid 0 opens one by file mode alone) reads
    // as empty.
    let block = fs::read_dir("/dev").unwrap().flatten().find(|d| {
        use std::os::unix::fs::FileTypeExt;
        d.file_type().is_ok_and(|t| t.is_block_device())
            && fs::File::open(d.path())
                .and_then(|mut f| std::io::Read::read(&mut f, &mut [0u8; 16]))
                .is_ok_and(|n| n > 0)
    });
    if let Some(dev) = block {
        let dev = dev.path();
        for caps in ["", "fs"] {
            let out = leased_sh(
                &e,
                caps,
                e.dir.path(),
                "echo BYTES=$(head -c 4096 \"$1\" 2>/dev/null | wc -c)",
                dev.to_str().unwrap(),
            );
            let so = String::from_utf8_lossy(&out.stdout);
            assert!(
                so.contains("BYTES=0"),
                "--caps {caps:?}: {} readable: {}",
                dev.display(),
                text(&out)
            );
        }
    }
    // The home is hidden only from the command: the guard and the caller still see the key.
    assert_eq!(
        fs::read_to_string(home.join("node.key")).unwrap().trim(),
        key
    );
}

/// The cgroup2 hierarchy's mount point (the mount whose root is the hierarchy's root).
fn cgroup2_root() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let f: Vec<&str> = pre.split(' ').collect();
        (post.starts_with("cgroup2 ") && f.get(3) == Some(&"/")).then(|| PathBuf::from(f[4]))
    })
}

/// A cgroup2 directory on the host, removed (after killing what is left in it) on drop.
struct HostCgroup {
    dir: PathBuf,
    rel: String,
    sleeper: Option<std::process::Child>,
}

impl HostCgroup {
    /// `mg-wall-PID-WHAT` under the cgroup2 root, with a `sleep 600` in it when `sleeper`.
    fn new(what: &str, sleeper: bool) -> HostCgroup {
        let root = cgroup2_root()
            .expect("no cgroup2 hierarchy here (the R1 and this machine kind have one)");
        let rel = format!("mg-wall-{}-{what}", std::process::id());
        let dir = root.join(&rel);
        fs::create_dir(&dir).unwrap();
        let sleeper = sleeper.then(|| {
            let c = Command::new("sleep").arg("600").spawn().unwrap();
            fs::write(dir.join("cgroup.procs"), c.id().to_string()).unwrap();
            c
        });
        HostCgroup { dir, rel, sleeper }
    }
    /// The sleeper runs (not killed, not frozen).
    fn sleeper_runs(&mut self) -> bool {
        let frozen = fs::read_to_string(self.dir.join("cgroup.events"))
            .map(|s| s.contains("frozen 1"))
            .unwrap_or(false);
        let alive = self
            .sleeper
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none());
        alive && !frozen
    }
}

impl Drop for HostCgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.dir.join("cgroup.freeze"), "0");
        if let Some(c) = self.sleeper.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Issue 32.3: a lease with `--caps ""` (CapEff 0) could call unshare(NEWUSER|NEWNS|NEWCGROUP)
/// (no seccomp filter on that path), mount a fresh cgroup2, which showed the host's whole tree,
/// and kill a host process through a host cgroup's `cgroup.kill` (`cgroup.freeze` froze it).
/// The mount needs a uid map, which kernels from 5.12 refuse without CAP_SETFCAP; the R1's
/// 4.19 grants it, so the unshare itself is what must fail. The guard runs in a cgroup of its
/// own here, so that the command's `/proc/self/cgroup` shows whether it has a cgroup
/// namespace (`0::/`) or the host's path.
#[test]
fn leased_command_cannot_make_namespaces_nor_reach_host_cgroups() {
    if !nix_is_root() {
        eprintln!("skipping: needs root to make a host cgroup");
        return;
    }
    let mut victim = HostCgroup::new("victim", true);
    let guard_cg = HostCgroup::new("guard", false);
    let e = Env::new();
    e.delegate_ok("qwen", "net,fs", "1h");
    let mnt = e.path("mnt");
    fs::create_dir(&mnt).unwrap();
    let attack = format!(
        "unshare -U -m -C true; echo unshare=$?; \
         unshare -U -r -m -C sh -c 'mount -t cgroup2 none \"$1\" && echo MOUNTED && echo 1 > \"$1/{rel}/cgroup.freeze\"; echo 1 > \"$1/{rel}/cgroup.kill\"' sh \"$1\"; \
         mount -t cgroup2 none \"$1\" && echo DIRECT-MOUNT; grep '^0::' /proc/self/cgroup",
        rel = victim.rel
    );
    let procs = guard_cg.dir.join("cgroup.procs");
    for caps in ["", "fs", "net,fs"] {
        let mut c = e.cmd(&[
            "run",
            "--name",
            "qwen",
            "--caps",
            caps,
            "--lease",
            "20",
            "--",
            "sh",
            "-c",
            &attack,
            "sh",
            mnt.to_str().unwrap(),
        ]);
        let procs = procs.clone();
        // SAFETY: between fork and exec: one write to a cgroup file ("0" is the writer).
        unsafe {
            use std::os::unix::process::CommandExt;
            c.pre_exec(move || fs::write(&procs, "0"));
        }
        let out = c.output().unwrap();
        let t = text(&out);
        let so = String::from_utf8_lossy(&out.stdout);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            victim.sleeper_runs(),
            "--caps {caps:?}: the host process was killed or frozen: {t}"
        );
        assert!(
            !so.contains("MOUNTED") && !so.contains("DIRECT-MOUNT"),
            "--caps {caps:?}: {t}"
        );
        assert!(
            so.contains("unshare=1"),
            "--caps {caps:?}: unshare was allowed: {t}"
        );
        assert!(
            t.contains("Operation not permitted"),
            "--caps {caps:?}: {t}"
        );
        // Its own cgroup namespace: the guard's cgroup is the root of what it can see.
        assert!(so.lines().any(|l| l == "0::/"), "--caps {caps:?}: {t}");
    }
}
