//! scripts/r1-sim.sh on the real Qwen: two stations, each in its own network namespace, memory
//! cgroup and core, behind a 40 ms link, answer one `POST /chain` (" Paris", through both
//! links), and `down` leaves no namespace, link, cgroup or process behind. Needs root (skipped
//! without it, failed under `SWERVE_REQUIRE_ROOT=1` as scripts/test.sh sets for root).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::*;

/// Its own names and subnet, so it runs beside a bench's simulation.
const NAME: &str = "r1test";
const NET: &str = "10.79.0";

fn script(state: &Path, knot_bin: &Path, args: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    Command::new(root.join("scripts/r1-sim.sh"))
        .args(args)
        .env("R1SIM_STATE", state)
        .env("R1SIM_NAME", NAME)
        .env("R1SIM_NET", NET)
        .env("FAT_STATION_BIN", station_bin())
        .env("KNOT_BIN", knot_bin)
        .output()
        .expect("run r1-sim.sh")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// What `down` must remove: namespaces, links and cgroups named `NAME-*`.
fn leftovers() -> Vec<String> {
    let mut left = Vec::new();
    let netns = Command::new("ip").args(["netns", "list"]).output();
    let links = Command::new("ip").args(["-o", "link"]).output();
    for o in [netns, links].into_iter().flatten() {
        let t = String::from_utf8_lossy(&o.stdout).into_owned();
        left.extend(
            t.lines()
                .filter(|l| l.contains(&format!("{NAME}-")))
                .map(str::to_string),
        );
    }
    for dir in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu",
    ] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            left.extend(
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with(&format!("{NAME}-"))),
            );
        }
    }
    left
}

#[test]
fn two_simulated_nodes_answer_a_chain_and_go_away_cleanly() {
    // SAFETY: geteuid has no preconditions and touches no memory.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        assert!(
            std::env::var("SWERVE_REQUIRE_ROOT").as_deref() != Ok("1"),
            "r1-sim needs root (namespaces, cgroups) and SWERVE_REQUIRE_ROOT=1 is set"
        );
        eprintln!("skipped: r1-sim needs root (namespaces, cgroups)");
        return;
    }
    let Some(knot) = model(QWEN) else { return };
    let Some(knot_bin) = test_support::need(
        test_support::release_bin("knot", "KNOT_BIN"),
        "cargo build --release -p knot-format, or set KNOT_BIN",
    ) else {
        return;
    };
    let state = tempfile::tempdir().expect("tempdir");
    let knot = knot.to_string_lossy().into_owned();
    let up = script(
        state.path(),
        &knot_bin,
        &[
            "up", "--nodes", "2", "--delay", "40", "--mem", "1Gi", "--knot", &knot,
        ],
    );
    let guard = Down(state.path().to_path_buf(), knot_bin.clone());
    assert!(up.status.success(), "up failed: {}", text(&up));
    let mesh = std::fs::read_to_string(state.path().join("mesh.json")).expect("mesh.json");
    assert!(
        mesh.contains(&format!("http://{NET}.1:17700")) && mesh.contains("\"12-24\""),
        "{mesh}"
    );
    // Each node's memory limit is set and it runs inside it.
    for i in 0..2 {
        let limit = std::fs::read_to_string(format!(
            "/sys/fs/cgroup/memory/{NAME}-{i}/memory.limit_in_bytes"
        ))
        .or_else(|_| std::fs::read_to_string(format!("/sys/fs/cgroup/{NAME}-{i}/memory.max")))
        .expect("memory limit");
        assert_eq!(limit.trim(), "1073741824", "node {i}");
    }

    let check = script(state.path(), &knot_bin, &["check"]);
    let out = text(&check);
    assert!(check.status.success(), "check failed: {out}");
    assert!(out.contains("token 12095 "), "not \" Paris\": {out}");
    // Through both 40 ms links: host -> node 0 -> node 1 and back.
    let ms: f64 = out
        .split(" in ")
        .nth(1)
        .and_then(|t| t.split(" ms").next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no time in {out}"));
    assert!(ms >= 80.0, "a /chain over two 40 ms links took {ms} ms");
    assert!(out.contains("0-12") && out.contains("12-24"), "{out}");

    drop(guard);
    assert_eq!(leftovers(), Vec::<String>::new(), "down left these behind");
}

/// Runs `down` whatever way the test ends.
struct Down(PathBuf, PathBuf);

impl Drop for Down {
    fn drop(&mut self) {
        let o = script(&self.0, &self.1, &["down"]);
        if !o.status.success() {
            eprintln!("down: {}", text(&o));
        }
    }
}
