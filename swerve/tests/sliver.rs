//! End-to-end tests of the real `swerve` binary against a real busybox + bash rootfs built by
//! `scripts/make-rootfs.sh` (once per test run, under target/tmp).
//!
//! They need root (namespaces, mounts, cgroups). Not root: each test prints why and passes,
//! unless SWERVE_REQUIRE_ROOT=1, in which case it fails.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{field, have_root, rootfs, run_bounded, text, Node};

#[test]
fn inside_the_sliver_everything_is_the_slivers() {
    if !have_root("inside_the_sliver_everything_is_the_slivers") {
        return;
    }
    let root = rootfs();
    let node = Node::admit("scratch", root);
    let script = "echo HOSTNAME=$(hostname); echo PID=$$; echo LS=$(ls / | tr '\\n' ' '); \
                  set -- /proc/[0-9]*; echo PROCS=$*; echo NET=$(ls /sys/class/net | tr '\\n' ' '); \
                  echo LINKS=$(ip -o link | cut -d: -f2 | tr -d ' ' | tr '\\n' ' '); \
                  echo ARCH=$(uname -m); . /etc/os-release; echo OSID=$ID; \
                  echo CAPEFF=$(grep CapEff /proc/self/status | cut -f2); \
                  echo ROOTRO=$(touch /etc/x 2>/dev/null && echo rw || echo ro)";
    let out = node.swerve(&[
        "cline",
        "base:scratch",
        "--hostname",
        "test-sliver",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let so = text(&out.stdout);
    assert!(
        out.status.success(),
        "cline failed: {}\n{so}",
        text(&out.stderr)
    );

    assert_eq!(field(&so, "HOSTNAME"), "test-sliver");
    let pid: u32 = field(&so, "PID").parse().unwrap();
    assert!(
        pid <= 3,
        "sh should be PID 2 (child of swerve's init), got {pid}"
    );

    let mut want: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    want.sort();
    assert_eq!(
        field(&so, "LS").split_whitespace().collect::<Vec<_>>(),
        want
    );

    // Listed with shell builtins, so nothing else is running: exactly init (1) and sh (2).
    let procs: Vec<&str> = field(&so, "PROCS").split_whitespace().collect();
    assert_eq!(procs, ["/proc/1", "/proc/2"], "only the sliver's processes");

    assert_eq!(
        field(&so, "NET").trim(),
        "lo",
        "only loopback in /sys/class/net"
    );
    assert_eq!(field(&so, "LINKS").trim(), "lo", "only loopback in ip link");

    // uname -m and os-release come from the rootfs' binaries and files, not the host's.
    let host_arch = text(&Command::new("uname").arg("-m").output().unwrap().stdout);
    assert_eq!(field(&so, "ARCH"), host_arch.trim());
    assert_eq!(field(&so, "OSID"), "aeon-sliver");
    let host_os = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
    assert!(
        !host_os.contains("ID=aeon-sliver"),
        "host os-release must differ for this check"
    );

    assert_eq!(
        field(&so, "CAPEFF"),
        "0000000000000000",
        "capabilities dropped"
    );
    assert_eq!(field(&so, "ROOTRO"), "ro", "rootfs is read-only");
}

#[test]
fn exit_status_is_the_commands() {
    if !have_root("exit_status_is_the_commands") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let code = |args: &[&str]| {
        let mut a = vec!["cline", "base:scratch", "--"];
        a.extend_from_slice(args);
        node.swerve(&a).status.code()
    };
    assert_eq!(code(&["sh", "-c", "exit 42"]), Some(42));
    assert_eq!(code(&["true"]), Some(0));
    assert_eq!(code(&["sh", "-c", "kill -TERM $$"]), Some(128 + 15));
    assert_eq!(code(&["no-such-command"]), Some(127));
    // --cpu-secs: a busy loop gets SIGXCPU (24) after one CPU second.
    let mut a = vec![
        "cline",
        "base:scratch",
        "--cpu-secs",
        "1",
        "--",
        "sh",
        "-c",
        "while :; do :; done",
    ];
    assert_eq!(node.swerve(&a).status.code(), Some(128 + 24));
    // A bind target missing from the rootfs is a setup error: nothing runs.
    a = vec![
        "cline",
        "base:scratch",
        "--bind",
        "/etc:/nonexistent",
        "--",
        "true",
    ];
    let out = node.swerve(&a);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("/nonexistent"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_mount_made_inside_is_not_visible_outside() {
    if !have_root("a_mount_made_inside_is_not_visible_outside") {
        return;
    }
    let root = rootfs();
    let node = Node::admit("scratch", root);
    let flags = tempfile::tempdir().unwrap();
    let bind = format!("{}:/tmp/out", flags.path().display());
    let mut c = node.cmd(&[
        "cline",
        "base:scratch",
        "--cap",
        "CAP_SYS_ADMIN",
        "--bind",
        &bind,
        "--",
        "sh",
        "-c",
        "mount -t tmpfs swerve-leak-probe /mnt && grep -c swerve-leak-probe /proc/self/mountinfo && touch /tmp/out/mounted && sleep 2",
    ]);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let flag = flags.path().join("mounted");
    let start = Instant::now();
    while !flag.exists() {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("sliver exited early with {s}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sliver never mounted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // While the sliver is alive: neither its tmpfs nor its rootfs bind appears on the host.
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !host.contains("swerve-leak-probe"),
        "mount leaked to the host"
    );
    assert!(
        !host.contains(root.to_str().unwrap()),
        "rootfs bind leaked to the host"
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "1", "the mount did exist inside");
}

#[test]
fn a_modified_rootfs_is_refused_naming_the_path() {
    if !have_root("a_modified_rootfs_is_refused_naming_the_path") {
        return;
    }
    let copy = tempfile::tempdir().unwrap();
    let dir = copy.path().join("rootfs");
    let st = Command::new("cp")
        .arg("-a")
        .arg(rootfs())
        .arg(&dir)
        .status()
        .unwrap();
    assert!(st.success());
    let node = Node::admit("mine", &dir);
    let ok = node.swerve(&["cline", "base:mine", "--", "echo", "RAN"]);
    assert_eq!(text(&ok.stdout).trim(), "RAN", "{}", text(&ok.stderr));

    std::fs::write(dir.join("etc/os-release"), "ID=tampered\n").unwrap();
    let out = node.swerve(&["cline", "base:mine", "--", "echo", "RAN"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        !text(&out.stdout).contains("RAN"),
        "the command must not run"
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("/etc/os-release") && err.contains("does not match"),
        "{err}"
    );

    let certs = node.swerve(&["certs", "--verify"]);
    assert_eq!(certs.status.code(), Some(1));
    assert!(
        text(&certs.stdout).contains("CHANGED /etc/os-release"),
        "{}",
        text(&certs.stdout)
    );

    // A base that was never admitted is refused too.
    let out = node.swerve(&[
        "cline",
        "base:unknown",
        "--rootfs",
        dir.to_str().unwrap(),
        "--",
        "echo",
        "RAN",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("no certificate"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn pids_limit_stops_a_fork_bomb() {
    if !have_root("pids_limit_stops_a_fork_bomb") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    // The bomb runs in the background; after 2 s the shell lists the sliver's processes with a
    // builtin (no fork needed) and exits, and PID 1's exit takes the rest of the namespace down.
    let script = "mkfifo /tmp/f; bomb(){ bomb | bomb & }; bomb 2>/tmp/err; \
                  read -t 2 x <> /tmp/f; echo PROCS=$(echo /proc/[0-9]*); \
                  echo REFUSED=$(grep -c fork /tmp/err)";
    let start = Instant::now();
    let out = run_bounded(
        node.cmd(&[
            "cline",
            "base:scratch",
            "--pids",
            "20",
            "--",
            "sh",
            "-c",
            script,
        ]),
        Duration::from_secs(30),
    );
    let took = start.elapsed();
    let so = text(&out.stdout);
    assert!(out.status.success(), "{so}\n{}", text(&out.stderr));
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let procs = field(&so, "PROCS").split_whitespace().count();
    assert!(procs <= 20, "{procs} processes despite --pids 20");
    let refused: u64 = field(&so, "REFUSED").parse().unwrap();
    assert!(refused > 0, "the bomb never hit the limit:\n{so}");
    assert!(
        text(&out.stderr).contains("pids limit"),
        "{}",
        text(&out.stderr)
    );
    // The sliver's cgroup is gone.
    let leftovers = std::fs::read_dir("/sys/fs/cgroup/pids")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("swerve-"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(leftovers, 0, "cgroup left behind");
}

#[test]
fn dry_run_prints_the_steps_in_order_and_runs_nothing() {
    if !have_root("dry_run_prints_the_steps_in_order_and_runs_nothing") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let out = node.swerve(&[
        "cline",
        "base:scratch",
        "--dry-run",
        "--pids",
        "20",
        "--",
        "echo",
        "RAN",
    ]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!so.lines().any(|l| l == "RAN"));
    let order = [
        "PR_SET_NO_NEW_PRIVS",
        "pids.max=20",
        "clone(new mount, uts, ipc, pid, net namespaces)",
        "PR_SET_PDEATHSIG",
        "setsid()",
        "close_range(3",
        "KEYCTL_JOIN_SESSION_KEYRING",
        "MS_REC|MS_PRIVATE",
        "unshare(CLONE_NEWCGROUP)",
        "AT_RECURSIVE, RDONLY|NOSUID|NODEV",
        "mount(proc",
        "/proc/sys",
        "mask (",
        "pivot_root",
        "MNT_DETACH",
        "sethostname(sliver-scratch)",
        "SIOCSIFFLAGS, lo",
        "drop all capabilities",
        "seccomp deny-list (EPERM): keyctl,add_key,request_key",
        "execvp",
    ];
    let mut at = 0;
    for step in order {
        let i = so[at..]
            .find(step)
            .unwrap_or_else(|| panic!("{step} missing or out of order in:\n{so}"));
        at += i;
    }
}

#[test]
fn veth_lets_the_host_reach_a_server_inside() {
    if !have_root("veth_lets_the_host_reach_a_server_inside") {
        return;
    }
    if Command::new("ip").arg("-V").output().is_err() {
        eprintln!("veth test skipped: the host has no iproute2 `ip` (needed for --net veth)");
        return;
    }
    let node = Node::admit("scratch", rootfs());
    // A private address inside a network namespace this test creates.
    let octet = 100 + (std::process::id() % 100);
    let addr = format!("10.213.{octet}.2");
    let net = format!("veth:{addr}/24");
    // The sliver says when it is up (its veth exists by then); only then does the test send
    // anything to the address, so no packet for it ever leaves through the host's default route.
    let flags = tempfile::tempdir().unwrap();
    let bind = format!("{}:/tmp/out", flags.path().display());
    let mut c = node.cmd(&[
        "cline",
        "base:scratch",
        "--net",
        &net,
        "--bind",
        &bind,
        "--",
        "sh",
        "-c",
        "touch /tmp/out/up; exec nc -ll -p 8080 -e echo hello-from-sliver",
    ]);
    let mut child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !flags.path().join("up").exists() {
        if let Some(s) = child.try_wait().unwrap() {
            panic!("sliver exited early with {s}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sliver never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let route = text(
        &Command::new("ip")
            .args(["route", "get", &addr])
            .output()
            .unwrap()
            .stdout,
    );
    if !route.contains(" dev sw") {
        let _ = child.kill();
        panic!("{addr} is not routed through the sliver's veth: {route}");
    }
    let start = Instant::now();
    let got = loop {
        match std::net::TcpStream::connect_timeout(
            &format!("{addr}:8080").parse().unwrap(),
            Duration::from_millis(300),
        ) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let mut v = String::new();
                match s.read_to_string(&mut v) {
                    Ok(_) if !v.is_empty() => break v,
                    Ok(_) if start.elapsed() < Duration::from_secs(10) => {
                        eprintln!("empty answer from the sliver; retrying");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Ok(_) => break v,
                    // Accepted by the kernel before nc was ready to answer: try again.
                    Err(e) if start.elapsed() < Duration::from_secs(10) => {
                        eprintln!("read from the sliver: {e}; retrying");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                    Err(e) => panic!("read from the sliver: {e}"),
                }
            }
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                let _ = child.kill();
                panic!("could not reach the sliver at {addr}: {e}");
            }
        }
    };
    // The server runs until stopped: SIGTERM to swerve is forwarded through PID 1 to nc.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("SIGTERM did not stop the sliver");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        got.trim(),
        "hello-from-sliver",
        "sliver said: {}",
        text(&out.stderr)
    );
    assert_eq!(
        status.code(),
        Some(128 + 15),
        "exit status after a forwarded SIGTERM"
    );
}

/// Runs `swerve ARGS` as uid/gid 65534 (nobody) with `home` as SWERVE_HOME.
fn swerve_as_nobody(home: &std::path::Path, args: &[&str]) -> std::process::Output {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(common::SWERVE);
    c.args(args)
        .env("SWERVE_HOME", home)
        .env_remove("MONSTER_GUARD_HOME");
    // SAFETY: only setgroups/setresgid/setresuid between fork and exec.
    unsafe {
        c.pre_exec(|| {
            if libc::setgroups(0, std::ptr::null()) < 0
                || libc::setresgid(65534, 65534, 65534) < 0
                || libc::setresuid(65534, 65534, 65534) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    run_bounded(c, Duration::from_secs(60))
}

/// Unprivileged slivers: a caller without root gets a user namespace (root inside is the caller
/// outside) and the same walls: read-only nosuid+nodev rootfs, read-only /proc/sys, masked
/// /proc/keys, no capabilities.
#[test]
fn an_unprivileged_caller_gets_a_user_namespace_with_the_same_walls() {
    if !have_root("an_unprivileged_caller_gets_a_user_namespace_with_the_same_walls") {
        return;
    }
    // The kernel may refuse user namespaces to unprivileged users (sysctls, AppArmor): then
    // there is nothing to test here.
    let allowed = {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new("true");
        // SAFETY: as in swerve_as_nobody, plus unshare.
        unsafe {
            c.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) < 0
                    || libc::setresgid(65534, 65534, 65534) < 0
                    || libc::setresuid(65534, 65534, 65534) < 0
                    || libc::unshare(libc::CLONE_NEWUSER) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        c.status().is_ok_and(|s| s.success())
    };
    if !allowed {
        eprintln!("skipped: this kernel refuses user namespaces to uid 65534");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    let home = dir.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let st = Command::new("cp")
        .arg("-a")
        .arg(rootfs())
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success());
    let st = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&root)
        .arg(&home)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = swerve_as_nobody(
        &home,
        &["admit", "base:mine", "--rootfs", root.to_str().unwrap()],
    );
    assert!(out.status.success(), "admit: {}", text(&out.stderr));
    let script = "echo UIDMAP=$(cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //'); \
                  echo ROOT=$(awk '$5 == \"/\" { print $6 }' /proc/self/mountinfo); \
                  echo SYS=$(awk '$5 == \"/proc/sys\" { split($6, a, \",\"); print a[1] }' /proc/self/mountinfo); \
                  echo KEYS=$(wc -c < /proc/keys); \
                  echo CAPEFF=$(grep CapEff /proc/self/status | cut -f2);";
    let out = swerve_as_nobody(&home, &["cline", "base:mine", "--", "sh", "-c", script]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    assert_eq!(field(&so, "UIDMAP"), "0 65534 1", "{so}");
    let opts: Vec<&str> = field(&so, "ROOT").split(',').collect();
    assert!(
        opts[0] == "ro" && opts.contains(&"nosuid") && opts.contains(&"nodev"),
        "{opts:?}"
    );
    assert_eq!(field(&so, "SYS"), "ro", "{so}");
    assert_eq!(field(&so, "KEYS"), "0", "{so}");
    assert_eq!(field(&so, "CAPEFF"), "0000000000000000", "{so}");
}
