//! Executes a [`Plan`]: swerve on the host clones PID 1 of the sliver into new namespaces; PID 1
//! builds the root, pivots into it, forks the command and stays as its init (reaping children and
//! forwarding signals); the command drops privileges and execs. Every step is one syscall (or a
//! short, named group) and every error names the step and its errno.
//!
//! Exit codes of [`run`]: the command's own status; 128+N when it was killed by signal N;
//! 125 when the sliver could not be set up (the reason is printed, the command never ran);
//! 126 when the command could not be executed; 127 when it was not found in the rootfs.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{chdir, chroot, fork, pivot_root, sethostname, ForkResult, Pid};

use crate::cgroup::Cgroups;
use crate::error::{Result, SwerveError};
use crate::mounts::{self, Attrs};
use crate::netdev;
use crate::plan::{NetMode, Op, Phase, Plan, MASKED_PATHS, READONLY_PATHS};

/// Exit code when the sliver could not be set up.
pub const EXIT_SETUP: i32 = 125;
/// Exit code when the command could not be executed.
pub const EXIT_CANNOT_EXEC: i32 = 126;
/// Exit code when the command was not found.
pub const EXIT_NOT_FOUND: i32 = 127;

/// Signals swerve and PID 1 pass on to the command.
const FORWARDED: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

fn step(step: impl Into<String>) -> impl FnOnce(Errno) -> SwerveError {
    let step = step.into();
    move |errno| SwerveError::Step { step, errno }
}

fn waited_set() -> SigSet {
    let mut s = SigSet::empty();
    for sig in FORWARDED {
        s.add(sig);
    }
    s.add(Signal::SIGCHLD);
    s
}

/// SWERVE_FORCE_FALLBACKS=1 takes the paths kernels before 5.9/5.12 take (one close per fd
/// instead of close_range, remounting each mount instead of mount_setattr), so the tests cover
/// them on a newer kernel too.
fn force_fallbacks() -> bool {
    std::env::var_os("SWERVE_FORCE_FALLBACKS").is_some_and(|v| v == "1")
}

/// Compiles the seccomp deny-list (each listed syscall fails with EPERM) for this architecture.
pub fn compile_seccomp(names: &[String]) -> Result<seccompiler::BpfProgram> {
    let filter = serde_json::json!({
        "sliver": {
            "mismatch_action": "allow",
            "match_action": { "errno": libc::EPERM },
            "filter": names.iter().map(|n| serde_json::json!({ "syscall": n })).collect::<Vec<_>>(),
        }
    });
    let text = filter.to_string();
    let fail = |reason: String| SwerveError::BadArg {
        what: "--seccomp-deny",
        value: names.join(","),
        reason,
    };
    let arch: seccompiler::TargetArch = std::env::consts::ARCH
        .try_into()
        .map_err(|e| fail(format!("{e:?}")))?;
    let mut map =
        seccompiler::compile_from_json(text.as_bytes(), arch).map_err(|e| fail(e.to_string()))?;
    map.remove("sliver")
        .ok_or_else(|| fail("filter missing after compilation".into()))
}

/// The sliver's two seccomp layers, compiled before the clone and installed in this order
/// right before exec: the wall every lease and sliver shares, then the deny-list.
pub struct Filters {
    /// sandbox-wall's policy (namespaces, mounts, bpf, perf, ptrace, keyrings, io_uring, ...),
    /// lifted per group only for a capability kept with `--cap`, as Docker's profile does.
    wall: sandbox_wall::Filter,
    /// [`crate::plan::SECCOMP_DENY_ALWAYS`] plus `--seccomp-deny`'s names.
    deny: seccompiler::BpfProgram,
}

impl Filters {
    /// Compiles both layers for `plan`.
    pub fn new(plan: &Plan) -> Result<Filters> {
        let kept_caps = plan
            .spec
            .caps_keep
            .iter()
            .fold(0u64, |m, c| m | (1u64 << c.index()));
        let policy = sandbox_wall::Policy {
            kept_caps,
            deny_ip_sockets: false,
        };
        let wall = sandbox_wall::Filter::new(&policy).map_err(|e| SwerveError::StepOther {
            step: "seccomp policy".into(),
            reason: e.to_string(),
        })?;
        Ok(Filters {
            wall,
            deny: compile_seccomp(&plan.seccomp_deny())?,
        })
    }
}

/// Runs the plan; returns the exit code swerve should exit with.
pub fn run(plan: &Plan) -> Result<i32> {
    let spec = &plan.spec;
    let seccomp = Some(Filters::new(plan)?);
    // Block the signals we forward (and SIGCHLD) before cloning, so none is lost or acted on
    // by default in the window before each process starts waiting for them.
    let waited = waited_set();
    let old_mask = waited
        .thread_swap_mask(SigmaskHow::SIG_BLOCK)
        .map_err(step("sigprocmask"))?;
    let (go_rd, go_wr) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(step("pipe2"))?;

    let mut cgroups: Option<Cgroups> = None;
    let mut child: Option<Pid> = None;
    let result = (|| -> Result<()> {
        for op in plan
            .ops
            .iter()
            .filter(|o| matches!(o.phase(), Phase::Host | Phase::HostAfterClone))
        {
            match op {
                // 1. no_new_privs: nothing below (not even a setuid binary in the rootfs) can
                //    gain privileges through exec.
                Op::NoNewPrivs => {
                    // SAFETY: prctl with integer arguments only.
                    Errno::result(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })
                        .map_err(step("prctl(PR_SET_NO_NEW_PRIVS)"))?;
                }
                // 2. The cgroup exists with its limits before any sliver process does.
                Op::CgroupCreate => {
                    cgroups = Some(Cgroups::create(
                        &std::process::id().to_string(),
                        spec.pids,
                        spec.mem,
                    )?);
                }
                // 3. clone() PID 1 into new namespaces; it blocks on the pipe until released.
                Op::Clone => {
                    let mut flags = CloneFlags::CLONE_NEWNS
                        | CloneFlags::CLONE_NEWUTS
                        | CloneFlags::CLONE_NEWIPC
                        | CloneFlags::CLONE_NEWPID;
                    if spec.net != NetMode::Host {
                        flags |= CloneFlags::CLONE_NEWNET;
                    }
                    if spec.user_ns {
                        flags |= CloneFlags::CLONE_NEWUSER;
                    }
                    let mut stack = vec![0u8; 1 << 20];
                    let (rd, wr) = (go_rd.as_raw_fd(), go_wr.as_raw_fd());
                    let seccomp = seccomp.as_ref();
                    let cb = Box::new(move || init_main(plan, rd, wr, seccomp));
                    // SAFETY: swerve is single-threaded here; the child runs on its own copy of
                    // the address space (no CLONE_VM) and never returns into the parent's frames:
                    // init_main ends in exit().
                    let pid =
                        unsafe { nix::sched::clone(cb, &mut stack, flags, Some(libc::SIGCHLD)) }
                            .map_err(|errno| {
                                let step = format!(
                                    "clone(new {} namespaces)",
                                    plan.namespaces().join(",")
                                );
                                if matches!(
                                    errno,
                                    Errno::EPERM
                                        | Errno::EINVAL
                                        | Errno::ENOSPC
                                        | Errno::EUSERS
                                        | Errno::EACCES
                                ) {
                                    SwerveError::NoPrivileges { step, errno }
                                } else {
                                    SwerveError::Step { step, errno }
                                }
                            })?;
                    child = Some(pid);
                }
                // 4. User namespace only: map root inside to the caller outside.
                Op::IdMaps => {
                    let pid = child.map(|p| p.as_raw()).unwrap_or(0);
                    let uid = nix::unistd::getuid();
                    let gid = nix::unistd::getgid();
                    for (file, text) in [
                        ("uid_map", format!("0 {uid} 1\n")),
                        ("setgroups", "deny\n".to_string()),
                        ("gid_map", format!("0 {gid} 1\n")),
                    ] {
                        let p = format!("/proc/{pid}/{file}");
                        fs::write(&p, text).map_err(|e| SwerveError::io("write", p, e))?;
                    }
                }
                // 5. Move PID 1 into the cgroup before it runs anything.
                Op::CgroupAttach => {
                    if let (Some(cg), Some(pid)) = (&cgroups, child) {
                        cg.attach(pid.as_raw())?;
                    }
                }
                // 6. Host end of the veth pair; the peer lands in the sliver's net namespace.
                Op::VethHost => {
                    if let (NetMode::Veth { host, prefix, .. }, Some(pid)) = (&spec.net, child) {
                        netdev::veth_host(&format!("sw{pid}"), pid.as_raw(), *host, *prefix)?;
                    }
                }
                _ => {}
            }
        }
        Ok(())
    })();

    if let Err(e) = result {
        if let Some(pid) = child {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
        }
        let _ = old_mask.thread_set_mask();
        return Err(e);
    }
    let Some(init) = child else {
        return Err(SwerveError::StepOther {
            step: "clone".into(),
            reason: "plan has no clone".into(),
        });
    };
    // Release PID 1.
    nix::unistd::write(&go_wr, b"1").map_err(step("write(release pipe)"))?;
    drop(go_wr);
    drop(go_rd);

    // Wait for PID 1, forwarding signals to it (it forwards them to the command).
    let code = wait_for(init, &waited, init)?;
    // Teardown: the namespaces died with PID 1; remove the cgroup.
    if let Some(mut cg) = cgroups {
        if let Some(n) = cg.pids_max_hits().filter(|n| *n > 0) {
            tracing::warn!(
                "the sliver hit its pids limit ({} processes): {n} fork(s) refused",
                spec.pids.unwrap_or(0)
            );
        }
        cg.remove();
    }
    let _ = old_mask.thread_set_mask();
    Ok(code)
}

/// Waits for `target` with the waited signals blocked: forwards them to `forward_to`, reaps any
/// child on SIGCHLD; returns `target`'s exit code (128+N when killed by signal N).
fn wait_for(target: Pid, waited: &SigSet, forward_to: Pid) -> Result<i32> {
    loop {
        // Reap first: SIGCHLD may have arrived before we blocked in sigwait.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG | WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == target => return Ok(code),
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == target => {
                    return Ok(128 + sig as i32)
                }
                Ok(WaitStatus::StillAlive) => break,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(Errno::ECHILD) => {
                    return Err(SwerveError::StepOther {
                        step: "waitpid".into(),
                        reason: "the child vanished".into(),
                    })
                }
                Err(errno) => {
                    return Err(SwerveError::Step {
                        step: "waitpid".into(),
                        errno,
                    })
                }
            }
        }
        match waited.wait() {
            Ok(Signal::SIGCHLD) => continue,
            Ok(sig) => {
                let _ = kill(forward_to, sig);
            }
            Err(_) => continue,
        }
    }
}

/// State PID 1 carries between its steps.
struct InitState {
    /// False when pivot_root failed and we chrooted instead.
    pivoted: bool,
}

/// PID 1 of the sliver. Never returns.
fn init_main(plan: &Plan, go_rd: RawFd, go_wr: RawFd, seccomp: Option<&Filters>) -> isize {
    let _ = nix::unistd::close(go_wr);
    // If swerve dies, the sliver dies with it.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) };
    let mut b = [0u8; 1];
    // SAFETY: reading one byte into a buffer we own from a pipe fd inherited from the parent.
    let n = unsafe { libc::read(go_rd, b.as_mut_ptr().cast(), 1) };
    let _ = nix::unistd::close(go_rd);
    if n != 1 {
        // The host side failed and has reported why; do nothing.
        std::process::exit(EXIT_SETUP);
    }
    let mut st = InitState { pivoted: true };
    for op in plan.ops.iter().filter(|o| o.phase() == Phase::Init) {
        if *op == Op::ForkCommand {
            break;
        }
        if let Err(e) = init_op(plan, op, &mut st) {
            eprintln!("swerve: {e}");
            std::process::exit(EXIT_SETUP);
        }
    }
    // ForkCommand: the command runs as our child; we stay PID 1.
    // SAFETY: single-threaded; the child only runs setup code and execs.
    let cmd = match unsafe { fork() } {
        Ok(ForkResult::Child) => command_main(plan, seccomp),
        Ok(ForkResult::Parent { child }) => child,
        Err(errno) => {
            eprintln!("swerve: fork(command): {errno}");
            std::process::exit(EXIT_SETUP);
        }
    };
    // Reap: every orphan in the sliver is reparented to us; when the command exits we exit
    // with its status and the kernel kills whatever is left in the PID namespace.
    let code = match wait_for(cmd, &waited_set(), cmd) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("swerve: init: {e}");
            EXIT_SETUP
        }
    };
    std::process::exit(code)
}

fn rootfs_path(root: &Path, inside: &str) -> PathBuf {
    root.join(inside.trim_start_matches('/'))
}

/// A mount point the rootfs must provide (creating it would change the certified tree).
fn need_dir(root: &Path, inside: &str) -> Result<PathBuf> {
    let p = rootfs_path(root, inside);
    if p.is_dir() {
        Ok(p)
    } else {
        Err(SwerveError::StepOther {
            step: format!("mount point {}", p.display()),
            reason: format!("the rootfs has no {inside} directory (scripts/make-rootfs.sh creates it; re-admit after adding it)"),
        })
    }
}

/// One PID 1 setup step.
fn init_op(plan: &Plan, op: &Op, st: &mut InitState) -> Result<()> {
    let spec = &plan.spec;
    let root = spec.rootfs.as_path();
    let none = None::<&str>;
    match op {
        // Nothing we mount may propagate back to the host.
        Op::MakeRootPrivate => mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)
            .map_err(step("mount(/, MS_REC|MS_PRIVATE)")),
        // swerve attached us to the sliver's cgroup before releasing us: that cgroup becomes
        // the root of every cgroup path the sliver can name or mount.
        Op::CgroupNamespace => nix::sched::unshare(CloneFlags::CLONE_NEWCGROUP)
            .map_err(step("unshare(CLONE_NEWCGROUP)")),
        // pivot_root needs the new root to be a mount point.
        Op::BindRootfs => mount(
            Some(root),
            root,
            none,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            none,
        )
        .map_err(step(format!(
            "mount({0}, {0}, MS_BIND|MS_REC)",
            root.display()
        ))),
        // --rw: writes go to an upper layer, never to the certified base (overlay.rs).
        Op::OverlayRootfs => crate::overlay::mount_rootfs(
            root,
            spec.overlay.as_ref().and_then(|o| o.upper.as_deref()),
            spec.user_ns,
        ),
        // Leave the caller's session: a command without a controlling terminal cannot push
        // input into it (TIOCSTI) and gets no signals from it but those swerve forwards.
        Op::NewSession => nix::unistd::setsid().map(drop).map_err(step("setsid()")),
        // Nothing the caller had open reaches the command, unless passed on purpose.
        Op::CloseFds => close_fds(&spec.pass_fds, force_fallbacks()),
        // The caller's session keyring (inherited through clone) is not ours to search.
        Op::SessionKeyring => {
            // SAFETY: keyctl with an integer command and a NULL name.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_keyctl,
                    libc::KEYCTL_JOIN_SESSION_KEYRING,
                    std::ptr::null::<libc::c_char>(),
                )
            };
            match Errno::result(r) {
                Ok(_) => Ok(()),
                // A kernel without keyrings has nothing to leak.
                Err(Errno::ENOSYS) => {
                    tracing::debug!("keyctl: ENOSYS (kernel without keyrings)");
                    Ok(())
                }
                Err(errno) => Err(SwerveError::Step {
                    step: "keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)".into(),
                    errno,
                }),
            }
        }
        // The certified tree stays as certified, and no device node or setuid file in it
        // (nor in anything mounted under it) works.
        Op::RootfsFlags => mounts::set_recursive(
            root,
            Attrs {
                rdonly: !spec.rw,
                nosuid: true,
                nodev: true,
            },
            force_fallbacks(),
        ),
        Op::MountProc => {
            let p = need_dir(root, "/proc")?;
            let fl = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(Some("proc"), &p, Some("proc"), fl, none)
                .map_err(step(format!("mount(proc, {})", p.display())))
        }
        // runc's readonlyPaths: sysctls and sysrq-trigger act on the host.
        Op::ProcReadOnly => {
            for inside in READONLY_PATHS {
                mounts::read_only(&rootfs_path(root, inside), force_fallbacks())?;
            }
            Ok(())
        }
        // runc's maskedPaths: kernel memory, keys, timers and firmware stay out of sight.
        Op::MaskPaths => {
            for inside in MASKED_PATHS {
                mounts::mask(&rootfs_path(root, inside), Path::new("/dev/null"))?;
            }
            Ok(())
        }
        Op::MountSys => {
            let p = rootfs_path(root, "/sys");
            if !p.is_dir() {
                tracing::debug!("rootfs has no /sys; not mounting sysfs");
                return Ok(());
            }
            let fl =
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            if let Err(errno) = mount(Some("sysfs"), &p, Some("sysfs"), fl, none) {
                // Not fatal: /sys is a convenience (e.g. --net host in a user namespace).
                tracing::warn!(
                    "mount(sysfs, {}): {errno}; continuing without /sys",
                    p.display()
                );
            }
            Ok(())
        }
        Op::MountTmp => {
            let p = need_dir(root, "/tmp")?;
            mount(
                Some("tmpfs"),
                &p,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some("mode=1777"),
            )
            .map_err(step(format!("mount(tmpfs, {})", p.display())))
        }
        Op::MountDev => {
            let p = need_dir(root, "/dev")?;
            mount(
                Some("tmpfs"),
                &p,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
                Some("mode=0755"),
            )
            .map_err(step(format!("mount(tmpfs, {})", p.display())))
        }
        Op::DevNode(name) => {
            let host = PathBuf::from(format!("/dev/{name}"));
            if !host.exists() {
                tracing::warn!("host has no {}; not binding it", host.display());
                return Ok(());
            }
            let p = rootfs_path(root, &format!("/dev/{name}"));
            fs::File::create(&p).map_err(|e| SwerveError::io("create", &p, e))?;
            mount(Some(&host), &p, none, MsFlags::MS_BIND, none).map_err(step(format!(
                "mount({}, {}, MS_BIND)",
                host.display(),
                p.display()
            )))
        }
        Op::DevLinks => {
            let dev = rootfs_path(root, "/dev");
            for (name, target) in [
                ("fd", "/proc/self/fd"),
                ("stdin", "/proc/self/fd/0"),
                ("stdout", "/proc/self/fd/1"),
                ("stderr", "/proc/self/fd/2"),
            ] {
                let p = dev.join(name);
                symlink(target, &p).map_err(|e| SwerveError::io("symlink", &p, e))?;
            }
            let shm = dev.join("shm");
            fs::create_dir(&shm).map_err(|e| SwerveError::io("mkdir", &shm, e))?;
            Ok(())
        }
        Op::Bind(b) => {
            let dst = rootfs_path(root, &b.dst.to_string_lossy());
            if fs::symlink_metadata(&dst).is_err() {
                // Only our own tmpfs mounts may grow new mount points.
                let on_tmpfs = b.dst.starts_with("/tmp") || b.dst.starts_with("/dev");
                if !on_tmpfs {
                    return Err(SwerveError::StepOther {
                        step: format!("bind {}:{}", b.src.display(), b.dst.display()),
                        reason: "destination does not exist in the rootfs (creating it would change the certified base; use a path under /tmp or one the rootfs has)".into(),
                    });
                }
                if let Some(parent) = dst.parent() {
                    fs::create_dir_all(parent).map_err(|e| SwerveError::io("mkdir", parent, e))?;
                }
                if b.src.is_dir() {
                    fs::create_dir(&dst).map_err(|e| SwerveError::io("mkdir", &dst, e))?;
                } else {
                    fs::File::create(&dst).map_err(|e| SwerveError::io("create", &dst, e))?;
                }
            }
            mount(
                Some(&b.src),
                &dst,
                none,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                none,
            )
            .map_err(step(format!(
                "mount({}, {}, MS_BIND|MS_REC)",
                b.src.display(),
                dst.display()
            )))?;
            // Every mount under SRC came along (MS_REC): the flags go on each of them.
            mounts::set_recursive(
                &dst,
                Attrs {
                    rdonly: b.ro,
                    nosuid: true,
                    nodev: !b.dev,
                },
                force_fallbacks(),
            )
        }
        // pivot_root(".", ".") stacks the old root on top of the new one; fall back to
        // MS_MOVE + chroot where pivot_root is impossible (e.g. the host root is an initramfs).
        Op::PivotRoot => {
            chdir(root).map_err(step(format!("chdir({})", root.display())))?;
            match pivot_root(".", ".") {
                Ok(()) => Ok(()),
                Err(errno) => {
                    eprintln!(
                        "swerve: warning: pivot_root({}): {errno}; falling back to chroot (the old root stays reachable to a process with CAP_SYS_CHROOT)",
                        root.display()
                    );
                    st.pivoted = false;
                    mount(Some("."), "/", none, MsFlags::MS_MOVE, none)
                        .map_err(step(format!("mount({}, /, MS_MOVE)", root.display())))?;
                    chroot(".").map_err(step(format!("chroot({})", root.display())))?;
                    chdir("/").map_err(step("chdir(/)"))
                }
            }
        }
        Op::DetachOldRoot => {
            if st.pivoted {
                umount2(".", MntFlags::MNT_DETACH)
                    .map_err(step("umount2(old root, MNT_DETACH)"))?;
            }
            chdir("/").map_err(step("chdir(/)"))
        }
        Op::SetHostname => {
            sethostname(&spec.hostname).map_err(step(format!("sethostname({})", spec.hostname)))
        }
        Op::LoopbackUp => netdev::link_up("lo"),
        Op::VethSliver => match spec.net {
            NetMode::Veth { sliver, prefix, .. } => netdev::set_ipv4("eth0", sliver, prefix),
            _ => Ok(()),
        },
        _ => Ok(()),
    }
}

/// Closes every fd above 2 except `keep` (whose close-on-exec flag is cleared, so they reach the
/// command): `close_range` where the kernel has it (5.9+), else one `close` per fd listed in
/// /proc/self/fd (or, without /proc, per fd below RLIMIT_NOFILE).
fn close_fds(keep: &[RawFd], fallback: bool) -> Result<()> {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&f| f > 2).collect();
    keep.sort_unstable();
    keep.dedup();
    for &fd in &keep {
        nix::fcntl::fcntl(fd, nix::fcntl::F_SETFD(nix::fcntl::FdFlag::empty()))
            .map_err(step(format!("fcntl({fd}, F_SETFD, 0) (--pass-fd)")))?;
    }
    // The ranges to close: [3, k1-1], [k1+1, k2-1], ..., [kn+1, max].
    let mut ranges = Vec::new();
    let mut first: libc::c_uint = 3;
    for &k in &keep {
        let k = k as libc::c_uint;
        if k > first {
            ranges.push((first, k - 1));
        }
        first = k + 1;
    }
    ranges.push((first, libc::c_uint::MAX));
    if !fallback {
        let mut done = true;
        for &(lo, hi) in &ranges {
            // SAFETY: close_range only closes descriptors; nothing in this process uses them
            // afterwards (those it needs were opened before and are not in these ranges, or are
            // opened again later).
            let r = unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0) };
            match Errno::result(r) {
                Ok(_) => {}
                Err(Errno::ENOSYS) => {
                    done = false;
                    break;
                }
                Err(errno) => {
                    return Err(SwerveError::Step {
                        step: format!("close_range({lo}, {hi})"),
                        errno,
                    })
                }
            }
        }
        if done {
            return Ok(());
        }
    }
    let open: Vec<RawFd> = match fs::read_dir("/proc/self/fd") {
        // Collected first: the directory's own fd is closed when the iterator is dropped.
        Ok(rd) => rd
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect(),
        Err(_) => {
            let max = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
                .map(|(_, hard)| hard.min(1 << 20))
                .unwrap_or(1 << 16);
            (3..max as RawFd).collect()
        }
    };
    for fd in open {
        if fd > 2 && !keep.contains(&fd) {
            // SAFETY: as above; EBADF (the listing's own, already closed fd) is harmless.
            unsafe { libc::close(fd) };
        }
    }
    Ok(())
}

/// The command's process: restores signal defaults, applies the Command-phase ops, execs.
fn command_main(plan: &Plan, seccomp: Option<&Filters>) -> ! {
    // Rust ignores SIGPIPE and we blocked the forwarded signals: undo both for the command.
    // SAFETY: resetting a disposition to SIG_DFL.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let _ = SigSet::all().thread_unblock();
    for op in plan.ops.iter().filter(|o| o.phase() == Phase::Command) {
        if let Err((code, e)) = command_op(plan, op, seccomp) {
            eprintln!("swerve: {e}");
            // SAFETY: _exit in a forked child skips the parent's atexit handlers.
            unsafe { libc::_exit(code) };
        }
    }
    // SAFETY: see above.
    unsafe { libc::_exit(EXIT_CANNOT_EXEC) }
}

fn command_op(
    plan: &Plan,
    op: &Op,
    seccomp: Option<&Filters>,
) -> std::result::Result<(), (i32, SwerveError)> {
    use nix::sys::resource::{setrlimit, Resource};
    let spec = &plan.spec;
    let setup = |e: SwerveError| (EXIT_SETUP, e);
    match op {
        Op::Rlimits => {
            // RLIMIT_DATA (private writable memory) rather than RLIMIT_AS, so mmapped model
            // files do not count against --mem.
            let limits = [
                (Resource::RLIMIT_DATA, spec.mem, "RLIMIT_DATA"),
                (Resource::RLIMIT_NPROC, spec.pids, "RLIMIT_NPROC"),
                (Resource::RLIMIT_CPU, spec.cpu_secs, "RLIMIT_CPU"),
            ];
            for (res, v, name) in limits {
                if let Some(v) = v {
                    // CPU: SIGXCPU at the soft limit, SIGKILL a second later at the hard one.
                    let hard = if name == "RLIMIT_CPU" {
                        v.saturating_add(1)
                    } else {
                        v
                    };
                    setrlimit(res, v, hard)
                        .map_err(step(format!("setrlimit({name}, {v})")))
                        .map_err(setup)?;
                }
            }
            Ok(())
        }
        Op::DropCaps => drop_caps(&spec.caps_keep).map_err(setup),
        Op::Seccomp => {
            if let Some(f) = seccomp {
                f.wall.apply().map_err(|e| {
                    setup(SwerveError::StepOther {
                        step: "seccomp(SET_MODE_FILTER) (the wall)".into(),
                        reason: e.to_string(),
                    })
                })?;
                seccompiler::apply_filter(&f.deny).map_err(|e| {
                    setup(SwerveError::StepOther {
                        step: "seccomp(SET_MODE_FILTER)".into(),
                        reason: e.to_string(),
                    })
                })?;
            }
            Ok(())
        }
        Op::Exec => {
            use std::os::unix::ffi::OsStrExt;
            let nul = |what: &str| {
                (
                    EXIT_CANNOT_EXEC,
                    SwerveError::StepOther {
                        step: "execvpe".into(),
                        reason: format!("{what} contains NUL"),
                    },
                )
            };
            let argv: Vec<CString> = spec
                .argv
                .iter()
                .map(|a| CString::new(a.as_bytes()))
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| nul("an argument"))?;
            // The command's environment is spec.env and nothing else; execvpe searches the PATH
            // of this process, so it gets the command's.
            let mut envp = Vec::with_capacity(spec.env.len());
            for (name, value) in &spec.env {
                let mut kv = name.as_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(value.as_bytes());
                envp.push(CString::new(kv).map_err(|_| nul(name))?);
                if name == "PATH" {
                    std::env::set_var("PATH", value);
                }
            }
            let Some(prog) = argv.first() else {
                return Err((
                    EXIT_CANNOT_EXEC,
                    SwerveError::StepOther {
                        step: "execvp".into(),
                        reason: "no command".into(),
                    },
                ));
            };
            let errno = match nix::unistd::execvpe(prog, &argv, &envp) {
                Err(e) => e,
                Ok(never) => match never {},
            };
            let code = if errno == Errno::ENOENT {
                EXIT_NOT_FOUND
            } else {
                EXIT_CANNOT_EXEC
            };
            Err((
                code,
                SwerveError::Step {
                    step: format!("execvpe({}) in the rootfs", spec.argv[0]),
                    errno,
                },
            ))
        }
        _ => Ok(()),
    }
}

/// Drops every capability not in `keep` from the bounding, inheritable, ambient, effective and
/// permitted sets (the one implementation leases share: [`sandbox_wall::caps::drop_to`]).
fn drop_caps(keep: &[caps::Capability]) -> Result<()> {
    let mask = keep.iter().fold(0u64, |m, c| m | (1u64 << c.index()));
    match sandbox_wall::caps::drop_to(mask) {
        Ok(0) => Ok(()),
        Ok(n) => Err(SwerveError::StepOther {
            step: "prctl(PR_CAPBSET_DROP)".into(),
            reason: format!("{n} capabilities stayed in the bounding set (no CAP_SETPCAP)"),
        }),
        Err(e) => Err(SwerveError::StepOther {
            step: "capset".into(),
            reason: e.to_string(),
        }),
    }
}
