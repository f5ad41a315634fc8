//! Escape attempts from inside a sliver, one test per reproduction of issue 16 (items 1-6) and of
//! issue 32 (items 6, 7), run as an attacker would: from the command, against the real `swerve`
//! binary as root.
//!
//! Some attempts need a syscall busybox has no applet for (TIOCSTI, keyctl). For those this test
//! binary is copied into a rootfs (with the shared libraries it has loaded) as `/probe` and run
//! inside as `/probe --exact probe`, with SWERVE_PROBE naming the attempt (see [`probe`]).

mod common;

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{field, have_root, rootfs, run_bounded, text, Node};

/// `c 1 11` (/dev/kmsg) inside the probe rootfs, for the nodev test.
const KMSG_NODE: &str = "kmsg";

/// A copy of the busybox rootfs with this test binary as /probe (plus the shared libraries it
/// has loaded, at the same paths) and a `c 1 11` node at /kmsg; built once per test run.
fn probe_rootfs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = rootfs();
        let dir = base.with_file_name(format!(
            "{}-probe",
            base.file_name().unwrap().to_string_lossy()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let st = Command::new("cp")
            .arg("-a")
            .arg(base)
            .arg(&dir)
            .status()
            .expect("cp -a rootfs");
        assert!(st.success(), "cp -a {} failed", base.display());
        let exe = std::env::current_exe().expect("current_exe");
        std::fs::copy(&exe, dir.join("probe")).expect("copy the probe");
        // The loader and libraries this process runs with are the ones the probe needs.
        let maps = std::fs::read_to_string("/proc/self/maps").expect("read /proc/self/maps");
        for lib in maps.lines().filter_map(|l| l.split_whitespace().nth(5)) {
            let lib = Path::new(lib);
            let name = lib.file_name().map(|n| n.to_string_lossy().into_owned());
            if !name.is_some_and(|n| n.contains(".so")) || !lib.is_absolute() {
                continue;
            }
            let to = dir.join(lib.strip_prefix("/").unwrap());
            if to.exists() {
                continue;
            }
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(lib, &to)
                .unwrap_or_else(|e| panic!("copy {} into the rootfs: {e}", lib.display()));
        }
        nix::sys::stat::mknod(
            &dir.join(KMSG_NODE),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 11),
        )
        .expect("mknod kmsg c 1 11");
        dir
    })
}

/// Runs `/probe` for `attempt` in a sliver of base:probe; returns its output. The attempt and
/// SWERVE_PROBE_KEYS (when `prepare` sets it) reach the probe through --setenv/--keep-env: the
/// caller's environment does not.
fn run_probe(node: &Node, attempt: &str, prepare: impl FnOnce(&mut Command)) -> Output {
    let setenv = format!("SWERVE_PROBE={attempt}");
    let mut c = node.cmd(&[
        "cline",
        "base:probe",
        "--setenv",
        &setenv,
        "--keep-env",
        "SWERVE_PROBE_KEYS",
        "--",
        "/probe",
        "--exact",
        "probe",
        "--nocapture",
        "--test-threads=1",
    ]);
    prepare(&mut c);
    run_bounded(c, Duration::from_secs(60))
}

fn errno_name(e: nix::errno::Errno) -> String {
    format!("{e:?}")
}

/// Not a test of its own: the attempts the tests below make from inside a sliver. Outside one
/// (SWERVE_PROBE unset) it does nothing.
#[test]
fn probe() {
    let Ok(attempt) = std::env::var("SWERVE_PROBE") else {
        return;
    };
    // The harness has printed "test probe ... " without a newline.
    println!();
    match attempt.as_str() {
        // Item 2: the terminal the sliver was started from.
        "tiocsti" => {
            // SAFETY: getsid/getpid take and return integers.
            let (sid, pid) = unsafe { (libc::getsid(0), libc::getpid()) };
            println!("SID={sid}");
            println!("PID={pid}");
            let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
            // Fields after the parenthesised name: state ppid pgrp session tty_nr ...
            let after = stat.rsplit_once(") ").map(|(_, a)| a).unwrap_or("");
            println!("TTY_NR={}", after.split_whitespace().nth(4).unwrap_or("?"));
            match std::fs::File::open("/dev/tty") {
                Ok(_) => println!("DEVTTY=opened"),
                Err(e) => println!("DEVTTY={}", e.raw_os_error().unwrap_or(0)),
            }
            let c: u8 = b'\n';
            // SAFETY: TIOCSTI reads one byte from the pointer, which points at `c`.
            let r = unsafe { libc::ioctl(0, libc::TIOCSTI, &c as *const u8) };
            if r == 0 {
                println!("TIOCSTI=ok");
            } else {
                println!("TIOCSTI={}", errno_name(nix::errno::Errno::last()));
            }
        }
        // Item 4: keys the host put in its session keyring and in root's user keyring.
        "keys" => {
            let descs = std::env::var("SWERVE_PROBE_KEYS").unwrap_or_default();
            for (i, desc) in descs.split(',').enumerate() {
                let d = CString::new(desc).unwrap();
                for (ring, name) in [
                    (libc::KEY_SPEC_SESSION_KEYRING, "session"),
                    (libc::KEY_SPEC_USER_KEYRING, "user"),
                ] {
                    // Search the keyring, linking what is found into our session keyring (which
                    // makes it ours to read), then read it.
                    // SAFETY: keyctl with integer arguments and NUL-terminated strings we own.
                    let id = unsafe {
                        libc::syscall(
                            libc::SYS_keyctl,
                            libc::KEYCTL_SEARCH,
                            ring,
                            c"user".as_ptr(),
                            d.as_ptr(),
                            libc::KEY_SPEC_SESSION_KEYRING,
                        )
                    };
                    if id < 0 {
                        println!(
                            "KEY{i}_{name}=search:{}",
                            errno_name(nix::errno::Errno::last())
                        );
                        continue;
                    }
                    let mut buf = [0u8; 256];
                    // SAFETY: KEYCTL_READ writes at most buf.len() bytes into buf.
                    let n = unsafe {
                        libc::syscall(
                            libc::SYS_keyctl,
                            libc::KEYCTL_READ,
                            id,
                            buf.as_mut_ptr(),
                            buf.len(),
                        )
                    };
                    if n < 0 {
                        println!(
                            "KEY{i}_{name}=read:{}",
                            errno_name(nix::errno::Errno::last())
                        );
                    } else {
                        let n = (n as usize).min(buf.len());
                        println!("KEY{i}_{name}={}", String::from_utf8_lossy(&buf[..n]));
                    }
                }
            }
            let keys = std::fs::read_to_string("/proc/keys").unwrap_or_default();
            println!("PROC_KEYS_LINES={}", keys.lines().count());
        }
        other => panic!("unknown SWERVE_PROBE {other}"),
    }
}

/// Item 1: /proc/sys (and the rest of runc's read-only /proc paths) cannot be written; runc's
/// masked paths show nothing. Writes put back the value just read, so the host's sysctls never
/// change even where a write gets through.
#[test]
fn proc_sys_is_read_only_and_kernel_paths_are_masked() {
    if !have_root("proc_sys_is_read_only_and_kernel_paths_are_masked") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let script = r#"
        i=0
        for f in kernel/core_pattern kernel/randomize_va_space kernel/pid_max vm/overcommit_memory; do
            v=$(cat /proc/sys/$f)
            if (printf '%s\n' "$v" > /proc/sys/$f) 2>/tmp/err; then r=written; else r=$(cat /tmp/err); fi
            echo "W_$i=$f: $r"; i=$((i+1))
        done
        # Never written: each must be a read-only mount of its own.
        for p in /proc/sys /proc/sysrq-trigger /proc/irq /proc/bus /proc/fs; do
            [ -e "$p" ] || continue
            o=$(awk -v p="$p" '$5 == p { split($6, a, ","); print a[1] }' /proc/self/mountinfo | tail -n 1)
            echo "RO $p ${o:-not-a-mount}"
        done
        for f in kcore keys timer_list sched_debug latency_stats; do
            if [ -e /proc/$f ]; then echo "MASKED /proc/$f $(wc -c < /proc/$f)"; fi
        done
        echo FIRMWARE=$(ls -A /sys/firmware | wc -l)
        if (echo x > /proc/kcore) 2>/dev/null; then echo KCORE_W=written; else echo KCORE_W=refused; fi
    "#;
    let out = node.swerve(&["cline", "base:scratch", "--", "sh", "-c", script]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    for i in 0..4 {
        let w = field(&so, &format!("W_{i}"));
        assert!(
            w.ends_with("Read-only file system"),
            "a sysctl was writable from inside: {w}\n{so}"
        );
    }
    let ro: Vec<&str> = so.lines().filter(|l| l.starts_with("RO ")).collect();
    assert!(ro.len() >= 3, "{so}");
    for l in ro {
        assert!(l.ends_with(" ro"), "not mounted read-only: {l}\n{so}");
    }
    let masked: Vec<&str> = so.lines().filter(|l| l.starts_with("MASKED ")).collect();
    assert!(!masked.is_empty(), "{so}");
    for l in masked {
        assert!(
            l.ends_with(" 0"),
            "a masked path shows something: {l}\n{so}"
        );
    }
    if Path::new("/sys/firmware").is_dir() {
        assert_eq!(field(&so, "FIRMWARE"), "0", "{so}");
    }
    assert_eq!(field(&so, "KCORE_W"), "refused", "{so}");
}

/// A pseudo-terminal pair: (master, slave), both O_NOCTTY.
fn open_pty() -> (OwnedFd, OwnedFd) {
    // SAFETY: posix_openpt/grantpt/unlockpt/ptsname_r on a fd we own, into a buffer we own.
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        assert!(m >= 0, "posix_openpt");
        let master = OwnedFd::from_raw_fd(m);
        assert_eq!(libc::grantpt(m), 0, "grantpt");
        assert_eq!(libc::unlockpt(m), 0, "unlockpt");
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        assert!(s >= 0, "open the pty slave");
        (master, OwnedFd::from_raw_fd(s))
    }
}

/// Item 2: a sliver started from a terminal cannot push keystrokes into it (TIOCSTI): the
/// command runs in a session of its own, without a controlling terminal.
#[test]
fn a_sliver_cannot_type_into_the_callers_terminal() {
    if !have_root("a_sliver_cannot_type_into_the_callers_terminal") {
        return;
    }
    let node = Node::admit("probe", probe_rootfs());
    let (_master, slave) = open_pty();
    let stdin = slave.try_clone().unwrap();
    let out = run_probe(&node, "tiocsti", |c| {
        c.stdin(Stdio::from(stdin));
        // SAFETY: only async-signal-safe syscalls between fork and exec: swerve starts as the
        // leader of a new session whose controlling terminal is the pty (its stdin), as from a
        // login shell.
        unsafe {
            c.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    });
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    assert_eq!(
        field(&so, "TIOCSTI"),
        "EPERM",
        "TIOCSTI into the caller's terminal:\n{so}"
    );
    // Nothing was pushed into the terminal's input.
    let mut pending: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into `pending`.
    unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut pending) };
    assert_eq!(pending, 0, "input injected into the caller's terminal");
    // A session of the sliver's own (0 inside = a session led from outside the namespace) and
    // no controlling terminal.
    let sid: i32 = field(&so, "SID").parse().unwrap();
    assert!(sid > 0, "the command is in the caller's session:\n{so}");
    assert_eq!(field(&so, "TTY_NR"), "0", "controlling terminal:\n{so}");
    assert_eq!(
        field(&so, "DEVTTY"),
        libc::ENXIO.to_string(),
        "/dev/tty opened:\n{so}"
    );
}

/// Dups `fd` to each of `at` in the child before exec (as a shell's `5</` does).
fn inherit_fd(c: &mut Command, fd: RawFd, at: &'static [RawFd]) {
    // SAFETY: dup2 only, between fork and exec; dup2 clears close-on-exec on the copy.
    unsafe {
        c.pre_exec(move || {
            for &n in at {
                if libc::dup2(fd, n) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}

/// Item 3: file descriptors the caller leaves open do not reach the command, unless passed on
/// purpose with --pass-fd.
#[test]
fn inherited_file_descriptors_are_closed_unless_passed() {
    if !have_root("inherited_file_descriptors_are_closed_unless_passed") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let host_root = std::fs::File::open("/").unwrap();
    let script = "for n in 5 9 100; do \
                    if [ -e /proc/self/fd/$n ]; then echo FD$n=open; else echo FD$n=closed; fi; done; \
                  ls /proc/self/fd/5/ 2>/dev/null | grep -qx work && echo FD5_LISTS_HOST=yes || true";
    let run = |extra: &[&str]| {
        let mut args = vec!["cline", "base:scratch"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let mut c = node.cmd(&args);
        inherit_fd(&mut c, host_root.as_raw_fd(), &[5, 9, 100]);
        let out = run_bounded(c, Duration::from_secs(60));
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let so = run(&[]);
    for n in [5, 9, 100] {
        assert_eq!(field(&so, &format!("FD{n}")), "closed", "{so}");
    }
    assert!(!so.contains("FD5_LISTS_HOST"), "{so}");

    let so = run(&["--pass-fd", "9"]);
    assert_eq!(field(&so, "FD9"), "open", "--pass-fd 9:\n{so}");
    assert_eq!(field(&so, "FD5"), "closed", "{so}");
    assert_eq!(field(&so, "FD100"), "closed", "{so}");

    // A fd that is not open (or one of 0-2) is a usage error, not a silent no-op.
    let out = node.swerve(&["cline", "base:scratch", "--pass-fd", "77", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--pass-fd"),
        "{}",
        text(&out.stderr)
    );
}

/// Removes the host keys the keyring test added, even when it fails.
struct HostKeys(Vec<i64>);

impl Drop for HostKeys {
    fn drop(&mut self) {
        for &id in &self.0 {
            // SAFETY: keyctl with integer arguments.
            unsafe { libc::syscall(libc::SYS_keyctl, libc::KEYCTL_INVALIDATE, id) };
        }
    }
}

fn add_host_key(desc: &str, payload: &str, ring: i32) -> i64 {
    let d = CString::new(desc).unwrap();
    // SAFETY: add_key with NUL-terminated strings and a payload buffer we own.
    let id = unsafe {
        libc::syscall(
            libc::SYS_add_key,
            c"user".as_ptr(),
            d.as_ptr(),
            payload.as_ptr(),
            payload.len(),
            ring,
        )
    };
    assert!(
        id > 0,
        "add_key({desc}): {}",
        std::io::Error::last_os_error()
    );
    id
}

/// Item 4: keys of the host (in the caller's session keyring and in root's user keyring) cannot
/// be found or read from inside, and /proc/keys lists nothing.
#[test]
fn host_keys_are_not_readable_inside() {
    if !have_root("host_keys_are_not_readable_inside") {
        return;
    }
    let node = Node::admit("probe", probe_rootfs());
    let pid = std::process::id();
    let (d0, d1) = (
        format!("swerve-test-session-{pid}"),
        format!("swerve-test-user-{pid}"),
    );
    let secret = format!("host-secret-{pid}");
    // Added from this thread and inherited by the swerve it spawns (keyrings are per thread).
    let _keys = HostKeys(vec![
        add_host_key(&d0, &secret, libc::KEY_SPEC_SESSION_KEYRING),
        add_host_key(&d1, &secret, libc::KEY_SPEC_USER_KEYRING),
    ]);
    let out = run_probe(&node, "keys", |c| {
        c.env("SWERVE_PROBE_KEYS", format!("{d0},{d1}"));
    });
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    assert!(!so.contains(&secret), "a host key was read inside:\n{so}");
    for k in ["KEY0_session", "KEY0_user", "KEY1_session", "KEY1_user"] {
        let v = field(&so, k);
        assert!(
            v.starts_with("search:") || v.starts_with("read:"),
            "{k}: {v}\n{so}"
        );
    }
    assert_eq!(field(&so, "PROC_KEYS_LINES"), "0", "{so}");
}

/// Mounts a tmpfs at `sub` in a private mount namespace of the child before it execs.
fn with_submount(c: &mut Command, sub: &Path) {
    let sub = CString::new(sub.as_os_str().as_bytes()).unwrap();
    // SAFETY: unshare and mount only, on strings prepared before the fork.
    unsafe {
        c.pre_exec(move || {
            if libc::unshare(libc::CLONE_NEWNS) < 0
                || libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ) < 0
                || libc::mount(
                    c"tmpfs".as_ptr(),
                    sub.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                ) < 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Item 5: `--bind SRC:DST:ro` is read-only all the way down: a mount under SRC (here a tmpfs,
/// and the host's /dev/shm under /dev) cannot be written through DST either. Binds are nodev too.
/// Run with mount_setattr and with its fallback (remounting each submount).
#[test]
fn read_only_binds_are_read_only_in_every_submount() {
    if !have_root("read_only_binds_are_read_only_in_every_submount") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir(src.path().join("sub")).unwrap();
    let bind = format!("{}:/mnt:ro", src.path().display());
    let script = "if (echo hi > /mnt/top) 2>/dev/null; then echo TOP=written; else echo TOP=refused; fi; \
                  if (echo hi > /mnt/sub/t) 2>/dev/null; then echo SUB=written; else echo SUB=refused; fi";
    for fallback in ["0", "1"] {
        let mut c = node.cmd(&[
            "cline",
            "base:scratch",
            "--bind",
            &bind,
            "--",
            "sh",
            "-c",
            script,
        ]);
        c.env("SWERVE_FORCE_FALLBACKS", fallback);
        with_submount(&mut c, &src.path().join("sub"));
        let out = run_bounded(c, Duration::from_secs(60));
        let so = text(&out.stdout);
        assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
        assert_eq!(field(&so, "TOP"), "refused", "fallbacks={fallback}\n{so}");
        assert_eq!(
            field(&so, "SUB"),
            "refused",
            "a submount of a read-only bind was writable (fallbacks={fallback})\n{so}"
        );
    }

    // The issue's own reproduction: /dev bound read-only, written through its /dev/shm mount.
    let shm_is_mount = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split_whitespace().nth(4) == Some("/dev/shm"));
    if !shm_is_mount {
        eprintln!("the host's /dev/shm is not a mount of its own: skipping the /dev case");
        return;
    }
    let name = format!("swerve-test-{}", std::process::id());
    let host_file = Path::new("/dev/shm").join(&name);
    let script = format!(
        "if (echo hi > /mnt/shm/{name}) 2>/dev/null; then echo SHM=written; else echo SHM=refused; fi; \
         if (cat /mnt/null) 2>/dev/null; then echo NULL=opened; else echo NULL=refused; fi"
    );
    let out = node.swerve(&[
        "cline",
        "base:scratch",
        "--bind",
        "/dev:/mnt:ro",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let leaked = host_file.exists();
    let _ = std::fs::remove_file(&host_file);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    assert_eq!(field(&so, "SHM"), "refused", "{so}");
    assert!(!leaked, "the sliver wrote {}", host_file.display());
    assert_eq!(
        field(&so, "NULL"),
        "refused",
        "device node opened in a bind:\n{so}"
    );
}

/// Item 6: the rootfs is nodev and nosuid: a `c 1 11` (kmsg) node an admitted rootfs carries
/// cannot be opened.
#[test]
fn device_nodes_in_the_rootfs_cannot_be_opened() {
    if !have_root("device_nodes_in_the_rootfs_cannot_be_opened") {
        return;
    }
    let node = Node::admit("probe", probe_rootfs());
    let script = format!(
        "if (echo swerve-nodev-test > /{KMSG_NODE}) 2>/dev/null; then echo KMSG=written; else echo KMSG=refused; fi; \
         awk '$5 == \"/\" {{ print \"ROOT_OPTS=\" $6 }}' /proc/self/mountinfo"
    );
    let mut args = vec!["cline", "base:probe", "--", "sh", "-c", &script];
    for rw in [false, true] {
        if rw {
            args.insert(2, "--rw");
        }
        let out = node.swerve(&args);
        let so = text(&out.stdout);
        assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
        assert_eq!(field(&so, "KMSG"), "refused", "rw={rw}:\n{so}");
        let opts: Vec<&str> = field(&so, "ROOT_OPTS").split(',').collect();
        assert!(
            opts.contains(&"nodev") && opts.contains(&"nosuid"),
            "rootfs mount options {opts:?} (rw={rw})"
        );
        assert_eq!(opts[0], if rw { "rw" } else { "ro" });
    }
}

/// `--die-with-parent` by default: when swerve is killed, every process of the sliver dies.
#[test]
fn the_sliver_dies_with_swerve() {
    if !have_root("the_sliver_dies_with_swerve") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let mut child = node
        .cmd(&[
            "cline",
            "base:scratch",
            "--",
            "sh",
            "-c",
            "sleep 60 & sleep 60",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let swerve_pid = child.id() as i32;
    // The sliver's processes, seen from the host: swerve's child (PID 1 inside) and its
    // descendants.
    let ppid_of = |pid: i32| -> Option<i32> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        s.rsplit_once(") ")?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let all_pids = || -> Vec<i32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect()
    };
    let start = Instant::now();
    let sliver: Vec<i32> = loop {
        let pids = all_pids();
        let mut tree = vec![swerve_pid];
        let mut grew = true;
        while grew {
            grew = false;
            for &p in &pids {
                if !tree.contains(&p) && ppid_of(p).is_some_and(|pp| tree.contains(&pp)) {
                    tree.push(p);
                    grew = true;
                }
            }
        }
        // init and two sleeps (sh execs the last one).
        if tree.len() >= 4 {
            break tree[1..].to_vec();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sliver never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    loop {
        let alive: Vec<i32> = sliver
            .iter()
            .copied()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, a)| a.starts_with('Z')))
            })
            .collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "sliver processes {alive:?} outlived swerve"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A private copy of the busybox rootfs with `/etc/swerve-test` reading `CERTIFIED`: the --rw
/// tests write to their base, which must not be the one the tests beside them run.
fn private_rootfs(tag: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(&format!("swerve-{tag}-"))
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .expect("tempdir");
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", rootfs().display()))
        .arg(dir.path())
        .status()
        .expect("cp -a rootfs");
    assert!(st.success(), "cp -a {} failed", rootfs().display());
    std::fs::write(dir.path().join("etc/swerve-test"), "CERTIFIED\n").unwrap();
    dir
}

/// A sliver left running: its stdout lines arrive on a channel, a line on its stdin lets it go on.
struct Running {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Running {
    /// Starts `c` (a `swerve cline`) with piped stdin and stdout.
    fn start(mut c: Command) -> Running {
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn swerve");
        let out = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(out).lines().map_while(|l| l.ok()) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Running { child, lines }
    }

    /// The next line that starts with `KEY=`, its value.
    fn expect(&self, key: &str) -> String {
        loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| panic!("no {key}= from the running sliver: {e}"));
            if let Some(v) = l.strip_prefix(&format!("{key}=")) {
                return v.to_string();
            }
        }
    }

    /// Lets the sliver go on (a line on its stdin) and waits for it.
    fn release(&mut self) -> std::process::ExitStatus {
        use std::io::Write;
        let mut stdin = self.child.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
        drop(stdin);
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the running sliver did not exit"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Issue 32 item 6 (first half): a --rw sliver rewrote the certified rootfs under a running
/// read-only sliver of the same base, which then read `TAMPERED-BY-A`. Now --rw writes to an
/// overlay upper layer: the read-only sliver keeps reading the certified bytes, the base on the
/// host is unchanged and still certifies, and the next --rw sliver starts from it afresh.
#[test]
fn a_rw_sliver_does_not_write_through_to_the_base() {
    if !have_root("a_rw_sliver_does_not_write_through_to_the_base") {
        return;
    }
    let dir = private_rootfs("rw");
    let root = dir.path();
    let node = Node::admit("rwbase", root);
    let mut ro = Running::start(node.cmd(&[
        "cline",
        "base:rwbase",
        "--",
        "sh",
        "-c",
        "echo BEFORE=$(cat /etc/swerve-test); read go; echo AFTER=$(cat /etc/swerve-test); \
         if [ -e /new-file ]; then echo NEW=seen; else echo NEW=absent; fi",
    ]));
    assert_eq!(ro.expect("BEFORE"), "CERTIFIED");

    let out = node.swerve(&[
        "cline",
        "base:rwbase",
        "--rw",
        "--",
        "sh",
        "-c",
        "echo TAMPERED-BY-A > /etc/swerve-test && echo new > /new-file && \
         echo IN=$(cat /etc/swerve-test) && rm /bin/ls && echo RM=done",
    ]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    // The --rw sliver sees its own writes.
    assert_eq!(field(&so, "IN"), "TAMPERED-BY-A", "{so}");
    assert_eq!(field(&so, "RM"), "done", "{so}");

    assert!(ro.release().success());
    assert_eq!(
        ro.expect("AFTER"),
        "CERTIFIED",
        "the read-only sliver read what the --rw one wrote"
    );
    assert_eq!(ro.expect("NEW"), "absent");

    assert_eq!(
        std::fs::read_to_string(root.join("etc/swerve-test")).unwrap(),
        "CERTIFIED\n",
        "the --rw sliver wrote the base on the host"
    );
    assert!(
        !root.join("new-file").exists(),
        "a file appeared in the base"
    );
    assert!(
        root.join("bin/ls").exists(),
        "a file vanished from the base"
    );
    let certs = node.swerve(&["certs", "--verify"]);
    assert!(
        certs.status.success(),
        "the base no longer certifies:\n{}{}",
        text(&certs.stdout),
        text(&certs.stderr)
    );
    // Nothing is kept: the next --rw sliver starts from the certified tree.
    let out = node.swerve(&[
        "cline",
        "base:rwbase",
        "--rw",
        "--",
        "sh",
        "-c",
        "echo AGAIN=$(cat /etc/swerve-test)",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(field(&text(&out.stdout), "AGAIN"), "CERTIFIED");
}

/// Unmounts a mount the test made on the host, even when the test fails.
struct HostMount(PathBuf);

impl Drop for HostMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Issue 32 item 6 (second half): a setuid-root file a --rw sliver made was setuid on the host.
/// Now it never reaches the host (the upper layer is a tmpfs of the sliver's own); kept with
/// --upper DIR, it lies on a nosuid mount (swerve refuses a DIR that is not on one).
#[test]
fn setuid_files_made_by_a_rw_sliver_are_not_setuid_on_the_host() {
    if !have_root("setuid_files_made_by_a_rw_sliver_are_not_setuid_on_the_host") {
        return;
    }
    let dir = private_rootfs("suid");
    let root = dir.path();
    let node = Node::admit("suid", root);
    let script = "cp /bin/busybox /bin/suid-sh && chmod 4755 /bin/suid-sh && \
                  if [ -u /bin/suid-sh ]; then echo SUID=set; else echo SUID=unset; fi";
    let out = node.swerve(&["cline", "base:suid", "--rw", "--", "sh", "-c", script]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    assert_eq!(field(&so, "SUID"), "set", "{so}");
    assert!(
        !root.join("bin/suid-sh").exists(),
        "the sliver's setuid file is on the host"
    );
    let certs = node.swerve(&["certs", "--verify"]);
    assert!(certs.status.success(), "{}", text(&certs.stdout));

    // Kept: refused where setuid would work on the host, and without --rw.
    let keep = tempfile::Builder::new()
        .prefix("swerve-upper-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let upper = keep.path().to_str().unwrap();
    let out = node.swerve(&["cline", "base:suid", "--rw", "--upper", upper, "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("nosuid"),
        "{}",
        text(&out.stderr)
    );
    nix::mount::mount(
        Some("tmpfs"),
        keep.path(),
        Some("tmpfs"),
        nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
        None::<&str>,
    )
    .expect("mount a nosuid,nodev tmpfs for --upper");
    let _mounted = HostMount(keep.path().to_path_buf());
    let out = node.swerve(&["cline", "base:suid", "--upper", upper, "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "--upper without --rw");

    let out = node.swerve(&[
        "cline",
        "base:suid",
        "--rw",
        "--upper",
        upper,
        "--",
        "sh",
        "-c",
        script,
    ]);
    let so = text(&out.stdout);
    assert!(out.status.success(), "{}\n{so}", text(&out.stderr));
    assert_eq!(field(&so, "SUID"), "set", "{so}");
    let kept = keep.path().join("upper/bin/suid-sh");
    let meta = std::fs::metadata(&kept).expect("the kept upper holds the sliver's file");
    use std::os::unix::fs::PermissionsExt;
    assert_ne!(meta.permissions().mode() & 0o4000, 0, "{}", kept.display());
    let st = nix::sys::statvfs::statvfs(&kept).unwrap();
    assert!(
        st.flags().contains(nix::sys::statvfs::FsFlags::ST_NOSUID),
        "the kept setuid file is on a mount where setuid works"
    );
    assert!(!root.join("bin/suid-sh").exists());
    // The next sliver with the same --upper starts from what the last one left.
    let out = node.swerve(&[
        "cline",
        "base:suid",
        "--rw",
        "--upper",
        upper,
        "--",
        "sh",
        "-c",
        "[ -e /bin/suid-sh ] && echo KEPT=yes",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(field(&text(&out.stdout), "KEPT"), "yes");
    let certs = node.swerve(&["certs", "--verify"]);
    assert!(certs.status.success(), "{}", text(&certs.stdout));
}

/// Issue 32 item 6, on a kernel without overlayfs (SWERVE_NO_OVERLAY=1 answers as one would):
/// --rw writes the base in place, so it is refused while another sliver of the base runs, says
/// so when it runs alone, and the base then no longer certifies.
#[test]
fn without_overlayfs_rw_writes_in_place_only_when_alone() {
    if !have_root("without_overlayfs_rw_writes_in_place_only_when_alone") {
        return;
    }
    let dir = private_rootfs("inplace");
    let root = dir.path();
    let node = Node::admit("inplace", root);
    let mut ro = Running::start(node.cmd(&[
        "cline",
        "base:inplace",
        "--",
        "sh",
        "-c",
        "echo UP=1; read go; echo AFTER=$(cat /etc/swerve-test)",
    ]));
    assert_eq!(ro.expect("UP"), "1");
    let in_place = |script: &str| {
        let mut c = node.cmd(&["cline", "base:inplace", "--rw", "--", "sh", "-c", script]);
        c.env("SWERVE_NO_OVERLAY", "1");
        run_bounded(c, Duration::from_secs(60))
    };
    let out = in_place("echo TAMPERED > /etc/swerve-test; echo RAN=1");
    let se = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{se}\n{}", text(&out.stdout));
    assert!(se.contains("base:inplace is in use"), "{se}");
    assert!(!text(&out.stdout).contains("RAN"));
    // With overlayfs, --rw shares the base with the running sliver.
    let out = node.swerve(&["cline", "base:inplace", "--rw", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(ro.release().success());
    assert_eq!(ro.expect("AFTER"), "CERTIFIED");

    let out = in_place("echo TAMPERED > /etc/swerve-test; echo RAN=1");
    let se = text(&out.stderr);
    assert!(out.status.success(), "{se}");
    assert!(se.contains("warning") && se.contains("in place"), "{se}");
    assert_eq!(
        std::fs::read_to_string(root.join("etc/swerve-test")).unwrap(),
        "TAMPERED\n"
    );
    let out = node.swerve(&["cline", "base:inplace", "--", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("/etc/swerve-test"),
        "{}",
        text(&out.stderr)
    );
}

/// Issue 32 item 7: the caller's whole environment (secrets included) reached the command. Now
/// the command gets PATH, HOME, the caller's TERM, and what --keep-env and --setenv name.
#[test]
fn the_callers_environment_does_not_reach_the_command() {
    if !have_root("the_callers_environment_does_not_reach_the_command") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let env_of = |extra: &[&str]| {
        let mut args = vec!["cline", "base:scratch"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "env"]);
        let mut c = node.cmd(&args);
        c.env("SWERVE_TEST_SECRET", "hunter2")
            .env("AWS_SECRET_ACCESS_KEY", "hunter3")
            .env("TERM", "xterm-swerve")
            .env("SWERVE_TEST_KEEP", "kept value")
            .env_remove("SWERVE_TEST_UNSET");
        let out = run_bounded(c, Duration::from_secs(60));
        assert!(out.status.success(), "{}", text(&out.stderr));
        let mut lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
        lines.sort();
        lines
    };
    let got = env_of(&[]);
    let mut want = vec![
        "HOME=/root".to_string(),
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        "TERM=xterm-swerve".into(),
    ];
    want.sort();
    assert_eq!(got, want, "the command's environment");

    let got = env_of(&[
        "--keep-env",
        "SWERVE_TEST_KEEP",
        "--keep-env",
        "SWERVE_TEST_UNSET",
        "--setenv",
        "SWERVE_TEST_SET=a=b",
        "--setenv",
        "HOME=/tmp",
    ]);
    let mut want = vec![
        "HOME=/tmp".to_string(),
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
        "SWERVE_TEST_KEEP=kept value".into(),
        "SWERVE_TEST_SET=a=b".into(),
        "TERM=xterm-swerve".into(),
    ];
    want.sort();
    assert_eq!(got, want, "--keep-env and --setenv");
    // PATH set by the caller is the one the command is looked up in.
    let out = node.swerve(&[
        "cline",
        "base:scratch",
        "--setenv",
        "PATH=/nowhere",
        "--",
        "env",
    ]);
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    for bad in ["NOVALUE", "=x"] {
        let out = node.swerve(&["cline", "base:scratch", "--setenv", bad, "--", "true"]);
        assert_eq!(out.status.code(), Some(2), "--setenv {bad}");
    }
}
