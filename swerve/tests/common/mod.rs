//! Helpers shared by the end-to-end sliver tests: the busybox rootfs (built once per test binary),
//! an isolated SWERVE_HOME with a base admitted, and bounded runs of the real `swerve` binary.
//!
//! The tests need root (namespaces, mounts, cgroups). Not root: each test prints why and passes,
//! unless SWERVE_REQUIRE_ROOT=1, in which case it fails.
#![allow(dead_code)] // each test binary uses a different subset

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const SWERVE: &str = env!("CARGO_BIN_EXE_swerve");

pub fn have_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("SWERVE_REQUIRE_ROOT").as_deref() == Ok("1") {
        panic!("{test}: needs root (namespaces, mounts, cgroups) and SWERVE_REQUIRE_ROOT=1");
    }
    eprintln!("{test}: skipped: needs root (namespaces, mounts, cgroups); set SWERVE_REQUIRE_ROOT=1 to fail instead");
    false
}

/// The busybox rootfs, built once per test run.
pub fn rootfs() -> &'static Path {
    static ROOTFS: OnceLock<PathBuf> = OnceLock::new();
    ROOTFS.get_or_init(|| {
        let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        std::fs::create_dir_all(&tmp).expect("create target tmpdir");
        // Remove the rootfs of earlier runs.
        let ours = format!("swerve-rootfs-{}", std::process::id());
        if let Ok(rd) = std::fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with("swerve-rootfs-") && n != ours {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let dir = tmp.join(ours);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make-rootfs.sh");
        let t = Instant::now();
        let out = Command::new("bash")
            .arg(&script)
            .arg(&dir)
            .output()
            .expect("run make-rootfs.sh");
        assert!(
            out.status.success(),
            "make-rootfs.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("built rootfs {} in {:?}", dir.display(), t.elapsed());
        dir
    })
}

/// A fresh SWERVE_HOME with `rootfs` admitted as base:NAME.
pub struct Node {
    pub home: tempfile::TempDir,
}

impl Node {
    pub fn admit(name: &str, rootfs: &Path) -> Node {
        let home = tempfile::tempdir().expect("tempdir");
        let n = Node { home };
        let out = n.swerve(&[
            "admit",
            &format!("base:{name}"),
            "--rootfs",
            rootfs.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "admit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        n
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(SWERVE);
        c.args(args)
            .env("SWERVE_HOME", self.home.path())
            .env_remove("MONSTER_GUARD_HOME");
        c
    }

    pub fn swerve(&self, args: &[&str]) -> Output {
        run_bounded(self.cmd(args), Duration::from_secs(60))
    }
}

/// Runs a command to completion, failing the test if it takes longer than `limit`.
pub fn run_bounded(mut c: Command, limit: Duration) -> Output {
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn swerve");
    let mut so = child.stdout.take().unwrap();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = so.read_to_end(&mut v);
        v
    });
    let t_err = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = se.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("swerve did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Output {
        status,
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
    }
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The value printed after `KEY=` on its own line.
pub fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in output:\n{out}"))
}
