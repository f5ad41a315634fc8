//! The deployment recipes in `deploy/`: the systemd units pass `systemd-analyze verify`
//! (with the unit's binary pointed at the one just built) and their command lines parse as
//! the binaries' own flags; the Containerfile's stages, copies and entry points hang
//! together and the gateway's entry point parses as `moonshine serve`'s flags. No container
//! tool runs here (the machine has a docker client without a daemon, no podman or buildah),
//! so the Containerfile is linted, not built. `systemd-analyze` absent, its half skips
//! unless `AEON_REQUIRE_SYSTEMD=1`.

use std::path::{Path, PathBuf};
use std::process::Command;

use moonshine::cli::{Args, Cmd};

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(name)
}

fn exec_start(unit: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    line.split_whitespace().map(str::to_string).collect()
}

fn moonshine_parses(argv: &[String]) -> Box<moonshine::serve::ServeArgs> {
    match Args::try_parse_checked_from(argv) {
        Ok(Args {
            cmd: Some(Cmd::Serve(s)),
            ..
        }) => s,
        Ok(a) => panic!("not moonshine serve: {a:?}"),
        Err(e) => panic!("{argv:?}: {e}"),
    }
}

fn verify(unit_text: &str, name: &str, bin: &Path, installed: &str) {
    let have = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok();
    if !have {
        assert_ne!(
            std::env::var("AEON_REQUIRE_SYSTEMD").as_deref(),
            Ok("1"),
            "systemd-analyze not found and AEON_REQUIRE_SYSTEMD=1"
        );
        eprintln!("skipping systemd-analyze verify: not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    let text = unit_text.replace(installed, bin.to_str().expect("utf-8"));
    std::fs::write(&path, text).expect("write unit");
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let err = String::from_utf8_lossy(&out.stderr);
    // Anything it says about our file is a defect (an unknown key is only a warning to it).
    let ours: Vec<&str> = err.lines().filter(|l| l.contains(name)).collect();
    assert!(out.status.success() && ours.is_empty(), "{name}: {err}");
}

#[test]
fn the_gateway_and_station_units_verify_and_their_flags_parse() {
    let gw = std::fs::read_to_string(deploy("systemd/aeon-gateway.service")).expect("unit");
    let argv = exec_start(&gw);
    assert_eq!(argv[0], "/usr/local/bin/moonshine");
    let s = moonshine_parses(&argv);
    assert_eq!(s.listen_addr().to_string(), "0.0.0.0:8000");
    assert!(s.target.mesh.is_some());
    verify(
        &gw,
        "aeon-gateway.service",
        Path::new(env!("CARGO_BIN_EXE_moonshine")),
        "/usr/local/bin/moonshine",
    );
    let st = std::fs::read_to_string(deploy("systemd/aeon-station.service")).expect("unit");
    assert_eq!(exec_start(&st)[0], "/usr/local/bin/fat-station");
    if let Some(bin) = test_support::station_bin() {
        verify(
            &st,
            "aeon-station.service",
            &bin,
            "/usr/local/bin/fat-station",
        );
    }
}

/// A Dockerfile instruction with its arguments (continuation lines joined).
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for l in text.lines() {
        let t = l.trim();
        if cur.is_empty() && (t.is_empty() || t.starts_with('#')) {
            continue;
        }
        if let Some(more) = t.strip_suffix('\\') {
            cur.push_str(more);
            cur.push(' ');
            continue;
        }
        cur.push_str(t);
        let (k, v) = cur.split_once(' ').unwrap_or((&cur, ""));
        out.push((k.to_ascii_uppercase(), v.trim().to_string()));
        cur.clear();
    }
    assert!(cur.is_empty(), "a continuation runs off the end");
    out
}

#[test]
fn the_containerfile_builds_station_and_gateway_stages_that_hang_together() {
    let text = std::fs::read_to_string(deploy("Containerfile")).expect("Containerfile");
    let known = [
        "FROM",
        "WORKDIR",
        "COPY",
        "RUN",
        "ENV",
        "USER",
        "EXPOSE",
        "ENTRYPOINT",
        "CMD",
    ];
    let mut stages: Vec<String> = Vec::new();
    let mut entry: Vec<(String, Vec<String>, Vec<String>)> = Vec::new();
    for (k, v) in instructions(&text) {
        assert!(known.contains(&k.as_str()), "unknown instruction {k}");
        match k.as_str() {
            "FROM" => {
                let w: Vec<&str> = v.split_whitespace().collect();
                assert!(w.len() == 3 && w[1].eq_ignore_ascii_case("AS"), "FROM {v}");
                // A base is an earlier stage or a fully named image (no registry guessing).
                assert!(
                    stages.iter().any(|s| s == w[0]) || w[0].starts_with("docker.io/"),
                    "FROM {v}"
                );
                stages.push(w[2].to_string());
                entry.push((w[2].to_string(), Vec::new(), Vec::new()));
            }
            "COPY" => {
                if let Some(from) = v.strip_prefix("--from=") {
                    let stage = from.split_whitespace().next().unwrap_or("");
                    assert!(
                        stages[..stages.len() - 1].iter().any(|s| s == stage),
                        "COPY {v}"
                    );
                }
            }
            "ENTRYPOINT" | "CMD" => {
                let a: Vec<String> = serde_json::from_str(&v)
                    .unwrap_or_else(|e| panic!("{k} must be a JSON array (exec form): {e}"));
                let last = entry.last_mut().expect("a stage");
                if k == "ENTRYPOINT" {
                    last.1 = a;
                } else {
                    last.2 = a;
                }
            }
            _ => {}
        }
    }
    for want in ["station", "gateway"] {
        assert!(
            stages.iter().any(|s| s == want),
            "no {want} stage: {stages:?}"
        );
    }
    let (_, ep, cmd) = entry.iter().find(|e| e.0 == "gateway").expect("gateway");
    let mut argv = ep.clone();
    argv.extend(cmd.iter().cloned());
    argv[0] = "moonshine".into();
    let s = moonshine_parses(&argv);
    assert_eq!(s.listen_addr().to_string(), "0.0.0.0:8000");
    let (_, ep, _) = entry.iter().find(|e| e.0 == "station").expect("station");
    assert!(ep[0].ends_with("/fat-station"), "{ep:?}");
    // The build context leaves the (huge) target folder out.
    let ignore = std::fs::read_to_string(deploy("../.dockerignore")).expect(".dockerignore");
    assert!(ignore.lines().any(|l| l.trim() == "target"));
}
