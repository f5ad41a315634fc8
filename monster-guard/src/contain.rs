//! Containing a leased command's whole process tree, and starting it with only what its caps
//! allow.
//!
//! monster-guard starts a *reaper* (a clone of itself, never exec'd) that sets the command up
//! and forks it. The reaper is, in order of preference (`--contain auto`):
//!
//! 1. **pid 1 of a new PID namespace** (`clone(CLONE_NEWPID)`, or with `CLONE_NEWUSER` where
//!    the caller lacks CAP_SYS_ADMIN but user namespaces are allowed). When pid 1 exits the
//!    kernel kills every other process of the namespace, double-forked and setsid'd ones
//!    included, and waits for them before pid 1 is reaped. The reaper dies with monster-guard
//!    (`PR_SET_PDEATHSIG=SIGKILL`), so `kill -9` of monster-guard kills the whole tree. A
//!    process inside cannot signal pid 1 with SIGKILL.
//! 2. **a subreaper** (`PR_SET_CHILD_SUBREAPER`, needs no privilege): every orphaned
//!    descendant is re-parented to the reaper instead of the host's init, so the tree under it
//!    is the whole tree; to stop it the reaper walks `/proc` for its descendants and kills them
//!    until none is left. It dies with monster-guard through a catchable death signal
//!    (`PR_SET_PDEATHSIG=SIGUSR2`) on which it kills the tree first. Weaker than 1: a command
//!    that kills the reaper (same user) while monster-guard is itself killed could escape;
//!    monster-guard is a subreaper too, and sweeps its own descendants at the end.
//!
//! Either way, when the command exits, what it left running is killed: the lease covers the
//! command and everything it started, never more than the command's own lifetime.
//!
//! The command then runs with (in this order, in the reaper, inherited by the command): a new
//! session (`setsid`: no controlling terminal, no TIOCSTI into the caller's); a private mount
//! namespace in which the kernel's tunables (`/proc/sys`, `/proc/sysrq-trigger`, `/sys`) are
//! read-only (uid 0 writes them by file mode alone, without any capability: `core_pattern` is
//! a host escape) and, without `fs`, every mount is read-only (`mount_setattr(AT_RECURSIVE)`,
//! else a remount of each); no_new_privs; the capability sets reduced to what its caps map to
//! ([`crate::linux_caps`]); a new cgroup namespace (a cgroup filesystem it mounted would show
//! only its own subtree); an empty read-only tmpfs over the guard's home and swerve's (each
//! holds a node signing key), /dev/null over every block device in /dev (the key's blocks on
//! the raw disk), and neither path in its environment; and last, right before the
//! fork of the command, the wall's seccomp filter ([`sandbox_wall::seccomp`]: no namespace
//! creation, no mount, no bpf, perf, keyrings, ptrace, io_uring, ...), which also denies every
//! socket family but AF_UNIX without `net` where no network namespace could be made. Without
//! a mount namespace the guard's home cannot be hidden: the command then does not start,
//! unless monster-guard itself already runs under a seccomp filter (nested in a sliver or a
//! lease, whose own wall then bounds what the command can do with the inner guard's key), and
//! then it says so. Without `fs` and no mount namespace possible, the command does not start
//! either (there is no unprivileged read-only filesystem on these kernels).

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sched::CloneFlags;
use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::error::{GuardError, Result};

/// Which containment `run --contain` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    /// The strongest that works here: a PID namespace, else a subreaper.
    Auto,
    /// A PID namespace or nothing.
    Pidns,
    /// A subreaper (no PID namespace), e.g. to test the fallback.
    Subreaper,
}

impl std::str::FromStr for Want {
    type Err = GuardError;
    fn from_str(s: &str) -> Result<Want> {
        match s {
            "auto" => Ok(Want::Auto),
            "pidns" => Ok(Want::Pidns),
            "subreaper" => Ok(Want::Subreaper),
            _ => Err(GuardError::Invalid(format!(
                "--contain {s:?}: use auto, pidns or subreaper"
            ))),
        }
    }
}

/// How the started tree is contained.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tree {
    /// The reaper is pid 1 of a new PID namespace (`userns`: inside a new user namespace).
    PidNamespace { userns: bool },
    /// The reaper is a subreaper in the caller's PID namespace.
    Subreaper { userns: bool },
}

impl std::fmt::Display for Tree {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (what, userns) = match self {
            Tree::PidNamespace { userns } => ("a PID namespace", userns),
            Tree::Subreaper { userns } => ("a subreaper", userns),
        };
        f.write_str(what)?;
        if *userns {
            f.write_str(" (in a user namespace)")?;
        }
        Ok(())
    }
}

/// How the network is withheld from a command without `net`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetIsolation {
    /// The command has `net`.
    None,
    /// A new network namespace (only a down loopback).
    Namespace,
    /// seccomp: socket() of any family but AF_UNIX, and io_uring, fail with EPERM.
    SocketsDenied,
}

/// What to start.
pub struct Spec<'a> {
    /// Program and arguments.
    pub cmd: &'a [String],
    /// Variables added to the environment.
    pub env: Vec<(String, String)>,
    /// Withhold the network.
    pub isolate_net: bool,
    /// Make the root mount read-only.
    pub isolate_fs: bool,
    /// Capability mask the command may keep.
    pub allowed_caps: u64,
    /// The containment asked for.
    pub want: Want,
    /// Directories the command must not see (the guard's home, swerve's): an empty tmpfs
    /// goes over each, and variables naming them are left out of the environment.
    pub hide: Vec<PathBuf>,
    /// Run without the seccomp filter where the kernel cannot install one.
    pub allow_no_seccomp: bool,
}

/// A started, contained command.
pub struct Started {
    /// The reaper's pid (monster-guard's child).
    pub reaper: Pid,
    /// How the tree is contained.
    pub tree: Tree,
    /// How the network is withheld.
    pub net: NetIsolation,
}

/// What the reaper needs, prepared before the clone (the child only makes syscalls and small
/// allocations on its own copy of this single-threaded process).
struct Prepared {
    argv: Vec<CString>,
    envp: Vec<CString>,
    isolate_fs: bool,
    allowed_caps: u64,
    /// The wall's filter for this attempt (with IP sockets denied where no netns was made).
    wall: Option<sandbox_wall::Filter>,
    allow_no_seccomp: bool,
    /// The directories covered by an empty tmpfs, as paths for mount(2).
    hide: Vec<CString>,
    /// The caller's working directory, entered again after the hiding mounts (a cwd inside a
    /// hidden directory would otherwise still reach its files).
    cwd: Option<CString>,
}

fn cstr(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes())
        .map_err(|_| GuardError::Invalid(format!("{s:?}: contains a NUL byte")))
}

/// One way to clone the reaper.
struct Attempt {
    flags: CloneFlags,
    pidns: bool,
    userns: bool,
    /// Fork the reaper plainly and let it `unshare(flags)` itself: for where `clone` refuses
    /// namespace flags (qemu-user's clone emulation takes only fork- and thread-like flags; it
    /// passes `unshare` through). With `CLONE_NEWPID` the reaper stays outside and the command
    /// becomes pid 1 of the new namespace: when it exits, or is killed with its parent reaper
    /// (`PR_SET_PDEATHSIG`), the kernel kills the rest of the namespace.
    unshare: bool,
}

/// The ways to try, strongest first. `nested`: monster-guard already runs under a seccomp
/// filter (see [`start`]).
fn attempts(spec: &Spec<'_>, nested: bool) -> Vec<Attempt> {
    // Always a mount namespace (kernel tunables read-only, key homes hidden; without `fs`,
    // every mount read-only) and a cgroup namespace.
    let mut ns = CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWCGROUP;
    if spec.isolate_net {
        ns |= CloneFlags::CLONE_NEWNET;
    }
    let pid = CloneFlags::CLONE_NEWPID;
    let user = CloneFlags::CLONE_NEWUSER;
    let mut v = Vec::new();
    let a = |flags, pidns, userns| Attempt {
        flags,
        pidns,
        userns,
        unshare: false,
    };
    if spec.want != Want::Subreaper {
        v.push(a(pid | ns, true, false));
        v.push(a(user | pid | ns, true, true));
    }
    if spec.want != Want::Pidns {
        v.push(a(ns, false, false));
        v.push(a(user | ns, false, true));
        // No namespace at all: only when a read-only filesystem is not required (the network
        // is then withheld by seccomp, and kernel tunables keep the caller's mount flags), and
        // only nested in another wall: the key homes cannot be hidden without a mount
        // namespace.
        if !spec.isolate_fs && (spec.hide.is_empty() || nested) {
            v.push(a(CloneFlags::empty(), false, false));
        }
    }
    v
}

fn describe(flags: CloneFlags) -> String {
    let names = [
        (CloneFlags::CLONE_NEWUSER, "NEWUSER"),
        (CloneFlags::CLONE_NEWPID, "NEWPID"),
        (CloneFlags::CLONE_NEWNET, "NEWNET"),
        (CloneFlags::CLONE_NEWNS, "NEWNS"),
        (CloneFlags::CLONE_NEWCGROUP, "NEWCGROUP"),
    ];
    let v: Vec<&str> = names
        .iter()
        .filter(|(f, _)| flags.contains(*f))
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        "fork".into()
    } else {
        format!("clone({})", v.join("|"))
    }
}

/// Starts the reaper and, under it, the command. Reports on stderr which containment it fell
/// back to when the strongest one cannot be had here.
pub fn start(spec: &Spec<'_>) -> Result<Started> {
    let (program, _) = spec
        .cmd
        .split_first()
        .ok_or_else(|| GuardError::Invalid("no command given after --".into()))?;
    let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os()
        .filter(|(k, _)| !spec.env.iter().any(|(x, _)| OsStr::new(x) == k))
        .filter(|(k, v)| !names_a_key_home(k, v, &spec.hide))
        .collect();
    env.extend(spec.env.iter().map(|(k, v)| (k.into(), v.into())));
    let mut prepared = Prepared {
        argv: spec
            .cmd
            .iter()
            .map(|a| cstr(OsStr::new(a)))
            .collect::<Result<_>>()?,
        envp: env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.clone();
                kv.push("=");
                kv.push(v);
                cstr(&kv)
            })
            .collect::<Result<_>>()?,
        isolate_fs: spec.isolate_fs,
        allowed_caps: spec.allowed_caps,
        wall: None,
        allow_no_seccomp: spec.allow_no_seccomp,
        hide: spec
            .hide
            .iter()
            .map(|p| cstr(p.as_os_str()))
            .collect::<Result<_>>()?,
        cwd: std::env::current_dir()
            .ok()
            .and_then(|d| cstr(d.as_os_str()).ok()),
    };
    let nested = sandbox_wall::seccomp::already_filtered();
    // monster-guard is a subreaper too: if the reaper dies first, orphans come here, and the
    // final sweep finds them.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };

    let mut failures = Vec::new();
    for at in attempts(spec, nested) {
        let net = if !spec.isolate_net {
            NetIsolation::None
        } else if at.flags.contains(CloneFlags::CLONE_NEWNET) {
            NetIsolation::Namespace
        } else {
            NetIsolation::SocketsDenied
        };
        let policy = sandbox_wall::Policy {
            kept_caps: spec.allowed_caps,
            deny_ip_sockets: net == NetIsolation::SocketsDenied,
        };
        prepared.wall =
            Some(sandbox_wall::Filter::new(&policy).map_err(|e| GuardError::Lease(e.to_string()))?);
        let mut at = at;
        let spawned = match spawn(&prepared, &at, program) {
            Err(Spawn::Clone(Errno::EINVAL)) if !at.flags.is_empty() => {
                at.unshare = true;
                spawn(&prepared, &at, program)
            }
            r => r,
        };
        match spawned {
            Ok(reaper) => {
                let tree = if at.pidns {
                    Tree::PidNamespace { userns: at.userns }
                } else {
                    Tree::Subreaper { userns: at.userns }
                };
                // Said when it is weaker than a PID namespace (a user namespace is the normal
                // way for a caller without CAP_SYS_ADMIN, and as strong).
                if !at.flags.contains(CloneFlags::CLONE_NEWNS) && !spec.hide.is_empty() {
                    eprintln!(
                        "monster-guard: no mount namespace can be made here ({}): the command can read this guard's home {} (allowed only because monster-guard itself runs under a seccomp filter, nested in a sliver or a lease)",
                        failures.join("; "),
                        spec.hide[0].display()
                    );
                }
                if !at.pidns && !failures.is_empty() {
                    eprintln!(
                        "monster-guard: a PID namespace failed here ({}); the lease contains the command with {tree}{}",
                        failures.join("; "),
                        match (net, at.flags.contains(CloneFlags::CLONE_NEWNS)) {
                            (NetIsolation::SocketsDenied, _) => ", its IP sockets denied by seccomp (no network namespace), and /proc/sys and /sys with the caller's mount flags (no mount namespace)",
                            (_, false) => ", and /proc/sys and /sys with the caller's mount flags (no mount namespace)",
                            _ => "",
                        }
                    );
                }
                return Ok(Started { reaper, tree, net });
            }
            Err(Spawn::Clone(errno)) => failures.push(format!("{}: {errno}", describe(at.flags))),
            Err(Spawn::Setup(msg)) => return Err(GuardError::Lease(msg)),
        }
    }
    let need = match (spec.want, spec.isolate_fs) {
        (Want::Pidns, _) => "a PID namespace (--contain pidns)",
        (_, true) => "a private mount namespace for the read-only root the caps require (no `fs`)",
        _ if !spec.hide.is_empty() && !nested => {
            "a private mount namespace to hide the guard's home (its node key) from the command"
        }
        _ => "a reaper",
    };
    Err(GuardError::Lease(format!(
        "cannot contain {program:?}: {need} cannot be created here ({}); refusing to run it less \
         contained than its grant requires",
        failures.join("; ")
    )))
}

enum Spawn {
    /// The clone itself failed (try the next way).
    Clone(Errno),
    /// The reaper could not set the command up, or exec failed.
    Setup(String),
}

fn pipe() -> std::result::Result<(OwnedFd, OwnedFd), Spawn> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Spawn::Setup(format!("pipe: {e}")))
}

fn spawn(p: &Prepared, at: &Attempt, program: &str) -> std::result::Result<Pid, Spawn> {
    let (go_r, go_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let fds = [
        go_r.as_raw_fd(),
        go_w.as_raw_fd(),
        err_r.as_raw_fd(),
        err_w.as_raw_fd(),
    ];
    let init = match (at.pidns, at.unshare) {
        (false, _) => Init::Host,
        (true, false) => Init::Reaper,
        (true, true) => Init::Command,
    };
    let mountns = at.flags.contains(CloneFlags::CLONE_NEWNS);
    let (clone_flags, unshare_flags) = if at.unshare {
        (CloneFlags::empty(), at.flags)
    } else {
        (at.flags, CloneFlags::empty())
    };
    let mut stack = vec![0u8; 256 << 10];
    let cb = Box::new(move || reaper_main(p, fds, init, mountns, unshare_flags));
    // SAFETY: monster-guard is single-threaded here; the child runs on its own copy of the
    // address space (no CLONE_VM) and never returns into the parent's frames: reaper_main ends
    // in _exit().
    let reaper = unsafe { nix::sched::clone(cb, &mut stack, clone_flags, Some(libc::SIGCHLD)) }
        .map_err(Spawn::Clone)?;
    drop(go_r);
    drop(err_w);
    // Release the reaper, then read its setup report: empty (EOF) when the command exec'd.
    let _ = nix::unistd::write(&go_w, b"g");
    drop(go_w);
    let mut report = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match nix::unistd::read(err_r.as_raw_fd(), &mut buf) {
            Ok(0) => break,
            Ok(n) => report.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
    }
    if report.is_empty() {
        return Ok(reaper);
    }
    let _ = kill(reaper, Signal::SIGKILL);
    let _ = waitpid(reaper, None);
    // The reaper's own unshare failed: as a failed clone, the next way is tried.
    if let Some(errno) = report.strip_prefix(UNSHARE_FAILED.as_bytes()) {
        let n = std::str::from_utf8(errno).ok().and_then(|e| e.parse().ok());
        return Err(Spawn::Clone(Errno::from_raw(n.unwrap_or(libc::EINVAL))));
    }
    Err(Spawn::Setup(format!(
        "cannot start {program:?}: {}",
        String::from_utf8_lossy(&report)
    )))
}

/// Where the tree's PID namespace has its init, which the kernel makes the tree's end.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Init {
    /// No PID namespace: the reaper is a subreaper in the caller's.
    Host,
    /// The reaper is pid 1 of a new PID namespace.
    Reaper,
    /// The command is pid 1 of a new PID namespace the reaper unshared; the reaper, outside,
    /// sees the tree as its descendants.
    Command,
}

/// How the reaper reports that its `unshare` failed (followed by the errno), so the next way
/// is tried as after a failed clone.
const UNSHARE_FAILED: &str = "\u{1}unshare:";

/// The signals the reaper handles synchronously.
fn handled() -> SigSet {
    let mut s = SigSet::empty();
    for sig in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGUSR2,
        Signal::SIGCHLD,
    ] {
        s.add(sig);
    }
    s
}

fn report(fd: RawFd, msg: &str) -> ! {
    // SAFETY: writes a buffer we own to a descriptor we own, then exits without unwinding.
    unsafe {
        libc::write(fd, msg.as_ptr().cast(), msg.len());
        libc::_exit(126)
    }
}

/// The reaper: set up, fork the command, then reap and relay until the command exits.
fn reaper_main(
    p: &Prepared,
    fds: [RawFd; 4],
    init: Init,
    mountns: bool,
    unshare: CloneFlags,
) -> isize {
    let [go_r, go_w, err_r, err_w] = fds;
    // SAFETY: closing our copies of the parent's pipe ends.
    unsafe {
        libc::close(go_w);
        libc::close(err_r);
    }
    let fail = |step: &str, e: std::io::Error| -> ! { report(err_w, &format!("{step}: {e}")) };
    let errno = std::io::Error::last_os_error;
    let pidns = init == Init::Reaper;
    // 1. Die with monster-guard: at once with a PID namespace (the kernel then kills the rest;
    //    a command that is its init dies with the reaper, step 9); as a subreaper, with a
    //    signal it catches to kill its tree first.
    let death = if init == Init::Host {
        libc::SIGUSR2
    } else {
        libc::SIGKILL
    };
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, death, 0, 0, 0) } != 0 {
        fail("prctl(PR_SET_PDEATHSIG)", errno());
    }
    // 2. Handled signals stay pending until the loop takes them.
    if let Err(e) = handled().thread_block() {
        fail("sigprocmask", e.into());
    }
    // 3. Wait for monster-guard's go; end of file means it is already gone.
    let mut b = [0u8; 1];
    // SAFETY: reads one byte into a buffer we own.
    if unsafe { libc::read(go_r, b.as_mut_ptr().cast(), 1) } != 1 {
        // SAFETY: exit without unwinding into the parent's frames.
        unsafe { libc::_exit(126) };
    }
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(go_r) };
    // 3b. The namespaces a plain fork did not make (see [`Attempt::unshare`]).
    if !unshare.is_empty() {
        if let Err(e) = nix::sched::unshare(unshare) {
            report(err_w, &format!("{UNSHARE_FAILED}{}", e as i32));
        }
    }
    // 4. A new session: no controlling terminal to push keystrokes into.
    if let Err(e) = nix::unistd::setsid() {
        fail("setsid", e.into());
    }
    // 5. In the private mount namespace: kernel tunables (/proc/sys, /proc/sysrq-trigger,
    //    /sys) read-only, since uid 0 writes them by file mode alone, with no capability;
    //    without `fs`, every mount read-only.
    if mountns {
        if let Err(e) = readonly_mounts(p.isolate_fs, &p.hide) {
            report(err_w, &e);
        }
        // 5b. The working directory again, through the new mounts: a cwd inside a hidden
        //     directory would still reach its files; one that no longer resolves becomes /.
        if let Some(cwd) = &p.cwd {
            // SAFETY: chdir with a NUL-terminated path we own.
            let stayed = unsafe { libc::chdir(cwd.as_ptr()) } != 0;
            // SAFETY: as above, a literal.
            if stayed && unsafe { libc::chdir(c"/".as_ptr()) } != 0 {
                fail("chdir(/)", errno());
            }
        }
    }
    // 6. Outside a PID namespace, orphans of the tree come to the reaper.
    // SAFETY: prctl with integer arguments only.
    if init == Init::Host && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        fail("prctl(PR_SET_CHILD_SUBREAPER)", errno());
    }
    // 7. no_new_privs and the capability sets reduced to the grant's ceiling.
    if let Err(e) = crate::linux_caps::drop_to(p.allowed_caps) {
        fail("dropping capabilities", e);
    }
    // 8. The wall's seccomp filter, last before the command: no namespace, mount, bpf, perf,
    //    keyring, ptrace or io_uring call; without `net` and without a network namespace, no
    //    IP sockets either.
    if let Some(wall) = &p.wall {
        match wall.apply() {
            Ok(()) => {}
            Err(e) if e.unsupported() && p.allow_no_seccomp => {
                eprintln!("monster-guard: warning: {e}; running without a seccomp filter (--allow-no-seccomp)");
            }
            Err(e) if e.unsupported() => report(
                err_w,
                &format!("{e}: this kernel (or emulator) has no seccomp filters; refusing to run without them (--allow-no-seccomp to run anyway)"),
            ),
            Err(e) => report(err_w, &e.to_string()),
        }
    }
    // 9. The command. As the init of the reaper's PID namespace, it dies with the reaper: a
    //    pipe whose write end only the reaper holds tells it whether the reaper died before
    //    its death signal was set.
    let alive = match init {
        Init::Command => match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(p) => Some(p),
            Err(e) => fail("pipe", e.into()),
        },
        _ => None,
    };
    // SAFETY: the reaper is single-threaded; the child only makes syscalls and execs.
    let cmd = match unsafe { nix::unistd::fork() } {
        Err(e) => fail("fork", e.into()),
        Ok(nix::unistd::ForkResult::Child) => {
            if let Some((r, w)) = alive {
                drop(w);
                // SAFETY: prctl with integer arguments only.
                if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
                    fail("prctl(PR_SET_PDEATHSIG)", errno());
                }
                let mut fd = [libc::pollfd {
                    fd: r.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                }];
                // SAFETY: polls one descriptor we own, without waiting.
                if unsafe { libc::poll(fd.as_mut_ptr(), 1, 0) } != 0 {
                    // Hung up: the reaper is gone, and so is the lease.
                    // SAFETY: exit without unwinding into the parent's frames.
                    unsafe { libc::_exit(126) };
                }
            }
            let _ = SigSet::empty().thread_set_mask();
            let e = nix::unistd::execvpe(&p.argv[0], &p.argv, &p.envp).unwrap_err();
            report(err_w, &format!("exec: {}", std::io::Error::from(e)));
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
    };
    // The write end stays open for the reaper's lifetime; the read end is the command's.
    let _alive_w = alive.map(|(_, w)| w);
    // SAFETY: closing our copy: monster-guard sees end of file once the command has exec'd.
    unsafe { libc::close(err_w) };
    reap(cmd, pidns)
}

/// Makes the mount at `path` and every mount under it read-only (`mount_tree`: one
/// `mount_setattr` where the kernel has it (5.12+), else a read-only remount of each mount from
/// /proc/self/mountinfo, keeping its nosuid/nodev/noexec flags, which a user namespace may not
/// clear).
fn readonly_tree(path: &str) -> std::result::Result<(), String> {
    let rdonly = mount_tree::Attrs {
        rdonly: true,
        ..mount_tree::Attrs::default()
    };
    mount_tree::set_recursive(std::path::Path::new(path), rdonly, false).map_err(|e| e.to_string())
}

/// Binds /dev/null over every block device node in /dev (symlinks such as /dev/disk/* lead to
/// these nodes; creating a new one takes CAP_MKNOD, which no lease keeps).
fn mask_block_devices() -> std::result::Result<(), String> {
    use nix::mount::{mount, MsFlags};
    use std::os::unix::fs::FileTypeExt;
    let Ok(rd) = std::fs::read_dir("/dev") else {
        return Ok(());
    };
    for e in rd.flatten() {
        // file_type() does not follow symlinks: only the nodes themselves.
        if !e.file_type().is_ok_and(|t| t.is_block_device()) {
            continue;
        }
        let p = e.path();
        mount(
            Some("/dev/null"),
            &p,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|err| format!("mount(/dev/null, {}, MS_BIND): {err}", p.display()))?;
    }
    Ok(())
}

/// Whether the variable `k=v` names a hidden directory (so the command is not even told where
/// the key is): the homes' own variables, and any value that contains one of the paths.
fn names_a_key_home(k: &OsStr, v: &OsStr, hide: &[PathBuf]) -> bool {
    if k == "MONSTER_GUARD_HOME" || k == "SWERVE_HOME" {
        return true;
    }
    let v = v.as_bytes();
    hide.iter().any(|h| {
        let h = h.as_os_str().as_bytes();
        !h.is_empty() && v.windows(h.len()).any(|w| w == h)
    })
}

/// The mount steps of the reaper in its own mount namespace (see [`reaper_main`], step 5).
fn readonly_mounts(everything: bool, hide: &[CString]) -> std::result::Result<(), String> {
    use nix::mount::{mount, MsFlags};
    // Keep every change here out of the caller's namespace.
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("mount(/, MS_REC|MS_PRIVATE): {e}"))?;
    // The key homes: an empty, read-only tmpfs over each (the node key is out of sight).
    for dir in hide {
        mount(
            Some("tmpfs"),
            dir.as_c_str(),
            Some("tmpfs"),
            MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            Some("size=4k,mode=0555"),
        )
        .map_err(|e| format!("mount(tmpfs, {}): {e}", dir.to_string_lossy()))?;
    }
    // Block devices: uid 0 opens them by file mode alone (root's, 0600 or 0660), so a command
    // without capabilities could read the hidden key's blocks from the raw disk.
    if !hide.is_empty() {
        mask_block_devices()?;
    }
    if everything {
        return readonly_tree("/");
    }
    for path in ["/proc/sys", "/proc/sysrq-trigger", "/sys"] {
        if !std::path::Path::new(path).exists() {
            continue;
        }
        mount_tree::bind_read_only(std::path::Path::new(path), false).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Reaps children and relays signals until the command exits; then ends the rest of the tree
/// and exits with the command's status (128+N for signal N).
fn reap(cmd: Pid, pidns: bool) -> ! {
    let set = handled();
    let timeout = libc::timespec {
        tv_sec: 0,
        tv_nsec: 100_000_000,
    };
    loop {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == cmd => finish(pidns, code),
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == cmd => {
                    finish(pidns, 128 + sig as i32)
                }
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) | Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        // SAFETY: sigtimedwait on a set of blocked signals, with a timeout we own.
        let sig = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &timeout) };
        match sig {
            libc::SIGTERM | libc::SIGINT | libc::SIGHUP => {
                if let Ok(s) = Signal::try_from(sig) {
                    signal_tree(pidns, s);
                }
            }
            // monster-guard died, or its grace ran out: kill everything now.
            libc::SIGUSR2 => finish(pidns, 128 + libc::SIGKILL),
            _ => {}
        }
    }
}

/// Sends `sig` to every process of the tree but the reaper.
fn signal_tree(pidns: bool, sig: Signal) {
    if pidns {
        // From pid 1, -1 is every other process of the namespace.
        let _ = kill(Pid::from_raw(-1), sig);
    } else {
        for pid in descendants(std::process::id() as i32) {
            let _ = kill(Pid::from_raw(pid), sig);
        }
    }
}

/// Ends the tree and exits with `code`. In a PID namespace the kernel kills the others when
/// pid 1 exits; a subreaper kills its descendants until none is left.
fn finish(pidns: bool, code: i32) -> ! {
    if !pidns {
        kill_descendants(std::process::id() as i32, Duration::from_secs(5));
    }
    // SAFETY: exit without unwinding into the parent's frames.
    unsafe { libc::_exit(code.clamp(0, 255)) }
}

/// SIGKILLs every descendant of `root` and reaps them, until none is left (new ones forked
/// meanwhile are orphaned by their killed parent and found again) or `limit` passes.
pub fn kill_descendants(root: i32, limit: Duration) {
    let t = Instant::now();
    loop {
        let d = descendants(root);
        for &pid in &d {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        while let Ok(s) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if s == WaitStatus::StillAlive {
                break;
            }
        }
        if d.is_empty() || t.elapsed() > limit {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every live descendant of `root`, from `/proc/*/stat` (zombies excluded: they are dead).
pub fn descendants(root: i32) -> Vec<i32> {
    let mut kids: Vec<(i32, i32)> = Vec::new();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for e in rd.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // After the command name (which may hold spaces and parentheses): state, ppid, ...
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let state = f.next().unwrap_or("");
        if let Some(ppid) = f.next().and_then(|s| s.parse::<i32>().ok()) {
            if state != "Z" && state != "X" {
                kids.push((ppid, pid));
            }
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pp, c) in &kids {
            if pp == p && !out.contains(&c) {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(isolate_fs: bool, hide: Vec<PathBuf>) -> Spec<'static> {
        Spec {
            cmd: &[],
            env: vec![],
            isolate_net: true,
            isolate_fs,
            allowed_caps: 0,
            want: Want::Auto,
            hide,
            allow_no_seccomp: false,
        }
    }

    /// Issue 32.2: without a mount namespace the key homes cannot be hidden, so the ladder
    /// ends before the plain fork, unless monster-guard is itself behind another wall.
    #[test]
    fn no_namespace_fallback_only_nested_or_with_nothing_to_hide() {
        let plain = |s: &Spec<'_>, nested| attempts(s, nested).iter().any(|a| a.flags.is_empty());
        let home = vec![PathBuf::from("/guard")];
        assert!(!plain(&spec(false, home.clone()), false));
        assert!(plain(&spec(false, home.clone()), true));
        assert!(plain(&spec(false, vec![]), false));
        assert!(!plain(&spec(true, home), true));
        // Every namespace attempt brings a cgroup namespace and a mount namespace.
        for a in attempts(&spec(false, vec![]), false) {
            if !a.flags.is_empty() {
                assert!(a
                    .flags
                    .contains(CloneFlags::CLONE_NEWCGROUP | CloneFlags::CLONE_NEWNS));
            }
        }
    }

    #[test]
    fn variables_naming_a_key_home_are_left_out() {
        let hide = [PathBuf::from("/root/.monster-guard")];
        let named = |k: &str, v: &str| names_a_key_home(OsStr::new(k), OsStr::new(v), &hide);
        assert!(named("MONSTER_GUARD_HOME", "/elsewhere"));
        assert!(named("SWERVE_HOME", ""));
        assert!(named("KEY", "/root/.monster-guard/node.key"));
        assert!(named("PATH", "/bin:/root/.monster-guard/bin"));
        assert!(!named("HOME", "/root"));
        assert!(!named("MONSTER_GUARD_GRANT", "qwen"));
    }
}
