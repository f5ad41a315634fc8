//! The sliver's setup, as a list of operations in the order they run (bubblewrap style).
//! `--dry-run` prints this list; [`crate::sliver::run`] executes exactly it.

use std::ffi::OsString;
use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::error::{Result, SwerveError};

/// Device nodes bind-mounted from the host into the sliver's `/dev` tmpfs.
pub const DEV_NODES: [&str; 6] = ["null", "zero", "full", "random", "urandom", "tty"];

/// /proc paths made read-only (bound onto themselves, then remounted read-only): runc's default
/// `readonlyPaths`. Writing a sysctl such as `kernel/core_pattern` (a `|prog` pattern runs as
/// host root) or `sysrq-trigger` would reach the host.
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Paths hidden inside: a file gets a read-only bind of `/dev/null`, a directory an empty
/// read-only tmpfs; absent ones are skipped. runc's default `maskedPaths`, plus `/proc/interrupts`
/// and `/sys/devices/virtual/powercap` (moby's additions: interrupt counts and RAPL energy
/// counters are side channels).
pub const MASKED_PATHS: [&str; 13] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/sys/devices/virtual/tpm",
];

/// Syscalls every sliver is denied (EPERM), whatever `--seccomp-deny` adds: the kernel keyrings
/// are not namespaced, and uid 0 in the host's user namespace reaches root's user keyring
/// (`@u`) from a fresh session keyring too (Docker's default profile denies these three).
pub const SECCOMP_DENY_ALWAYS: [&str; 3] = ["keyctl", "add_key", "request_key"];

/// PATH given to the command inside the sliver (unless `--setenv PATH=...`).
pub const SLIVER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// HOME given to the command inside the sliver (unless `--setenv HOME=...`).
pub const SLIVER_HOME: &str = "/root";

/// The command's whole environment, as runc and `bwrap --clearenv` start: `PATH`
/// ([`SLIVER_PATH`]), `HOME` ([`SLIVER_HOME`]), the caller's `TERM` if set, then each `--keep-env
/// NAME` the caller has set (an unset one is skipped), then each `--setenv NAME=VALUE`. A later
/// entry replaces an earlier one of the same name. Nothing else of the caller's environment (its
/// secrets, SWERVE_HOME, MONSTER_GUARD_HOME) reaches the command.
pub fn command_env(
    keep: &[String],
    set: &[(String, String)],
    caller: impl Fn(&str) -> Option<OsString>,
) -> Vec<(String, OsString)> {
    let mut env: Vec<(String, OsString)> = vec![
        ("PATH".into(), SLIVER_PATH.into()),
        ("HOME".into(), SLIVER_HOME.into()),
    ];
    let mut put = |name: &str, value: OsString| match env.iter_mut().find(|(n, _)| n == name) {
        Some(slot) => slot.1 = value,
        None => env.push((name.to_string(), value)),
    };
    let kept = std::iter::once("TERM").chain(keep.iter().map(String::as_str));
    for name in kept {
        if let Some(v) = caller(name) {
            put(name, v);
        }
    }
    for (name, value) in set {
        put(name, value.into());
    }
    env
}

/// Checks an environment variable name (`--keep-env`, `--setenv`): not empty, no `=` or NUL.
pub fn parse_env_name(s: &str) -> std::result::Result<String, String> {
    if s.is_empty() || s.contains(['=', '\0']) {
        return Err(format!("{s:?} is not a variable name (not empty, no '=')"));
    }
    Ok(s.to_string())
}

/// Parses `--setenv NAME=VALUE` (VALUE may be empty; no NUL).
pub fn parse_setenv(s: &str) -> std::result::Result<(String, String), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=VALUE"))?;
    if value.contains('\0') {
        return Err(format!("the value of {name} contains a NUL byte"));
    }
    Ok((parse_env_name(name)?, value.to_string()))
}

/// How the sliver is networked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetMode {
    /// A new network namespace with only loopback (the default).
    Loopback,
    /// Share the host's network namespace.
    Host,
    /// A new network namespace plus a veth pair: `eth0` inside with `sliver`/`prefix`, and
    /// `sw<PID>` on the host with `host`/`prefix`.
    Veth {
        /// Address of `eth0` inside.
        sliver: Ipv4Addr,
        /// Address of the host end.
        host: Ipv4Addr,
        /// Prefix length.
        prefix: u8,
    },
}

impl NetMode {
    /// Parses `none`/`loopback`, `host`, or `veth:IP/PREFIX[,HOSTIP]` (host IP defaults to the
    /// first address of the network, or the second if that is the sliver's).
    pub fn parse(s: &str) -> Result<NetMode> {
        let bad = |reason: &str| SwerveError::BadArg {
            what: "--net",
            value: s.to_string(),
            reason: reason.to_string(),
        };
        match s {
            "none" | "loopback" | "lo" => return Ok(NetMode::Loopback),
            "host" => return Ok(NetMode::Host),
            _ => {}
        }
        let spec = s.strip_prefix("veth:").ok_or_else(|| {
            bad("expected loopback, host or veth:IP/PREFIX[,HOSTIP] (e.g. veth:10.77.0.2/24)")
        })?;
        let (cidr, host) = match spec.split_once(',') {
            Some((c, h)) => (c, Some(h)),
            None => (spec, None),
        };
        let (ip, prefix) = cidr.split_once('/').unwrap_or((cidr, "24"));
        let sliver: Ipv4Addr = ip.parse().map_err(|_| bad("not an IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| bad("bad prefix length"))?;
        if !(8..=30).contains(&prefix) {
            return Err(bad("prefix length must be 8..=30"));
        }
        let mask = u32::MAX << (32 - prefix);
        let net = u32::from(sliver) & mask;
        let host = match host {
            Some(h) => h.parse().map_err(|_| bad("host address is not IPv4"))?,
            None => {
                let first = Ipv4Addr::from(net + 1);
                if first == sliver {
                    Ipv4Addr::from(net + 2)
                } else {
                    first
                }
            }
        };
        if u32::from(host) & mask != net || host == sliver {
            return Err(bad(
                "host address must be another address in the same network",
            ));
        }
        if u32::from(sliver) == net || u32::from(sliver) == net | !mask {
            return Err(bad(
                "the sliver address is the network or broadcast address",
            ));
        }
        Ok(NetMode::Veth {
            sliver,
            host,
            prefix,
        })
    }
}

/// One `--bind SRC:DST[:OPTS]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    /// Host path.
    pub src: PathBuf,
    /// Absolute path inside the sliver.
    pub dst: PathBuf,
    /// Read-only, every mount under DST included.
    pub ro: bool,
    /// Device nodes under DST may be opened (default: nodev).
    pub dev: bool,
}

impl Bind {
    /// Parses `SRC:DST[:OPTS]`, OPTS a comma-separated list of `ro`, `rw`, `dev`; SRC must
    /// exist, DST must be absolute without `..`.
    pub fn parse(s: &str) -> Result<Bind> {
        let bad = |reason: &str| SwerveError::BadArg {
            what: "--bind",
            value: s.to_string(),
            reason: reason.to_string(),
        };
        let parts: Vec<&str> = s.split(':').collect();
        let (src, dst, opts) = match parts.as_slice() {
            [src, dst] => (*src, *dst, ""),
            [src, dst, opts] => (*src, *dst, *opts),
            _ => return Err(bad("expected SRC:DST or SRC:DST:OPTS (OPTS: ro, rw, dev)")),
        };
        let (mut ro, mut dev) = (false, false);
        for o in opts.split(',').filter(|o| !o.is_empty()) {
            match o {
                "ro" => ro = true,
                "rw" => ro = false,
                "dev" => dev = true,
                _ => return Err(bad(&format!("unknown option {o:?} (ro, rw, dev)"))),
            }
        }
        let dst = PathBuf::from(dst);
        if !dst.is_absolute()
            || dst
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
            || dst == Path::new("/")
        {
            return Err(bad(
                "DST must be an absolute path inside the sliver, without '..', not /",
            ));
        }
        let src = std::fs::canonicalize(src).map_err(|e| bad(&format!("SRC: {e}")))?;
        Ok(Bind { src, dst, ro, dev })
    }
}

/// Everything the user asked for, validated.
#[derive(Debug, Clone)]
pub struct SliverSpec {
    /// Base name (without `base:`).
    pub base: String,
    /// The rootfs, canonical absolute path.
    pub rootfs: PathBuf,
    /// Hostname inside.
    pub hostname: String,
    /// Extra bind mounts, in order.
    pub binds: Vec<Bind>,
    /// Networking.
    pub net: NetMode,
    /// `--mem` in bytes: memory cgroup limit and RLIMIT_DATA.
    pub mem: Option<u64>,
    /// `--pids`: pids cgroup limit (required) and RLIMIT_NPROC.
    pub pids: Option<u64>,
    /// `--cpu-secs`: RLIMIT_CPU.
    pub cpu_secs: Option<u64>,
    /// Capabilities kept (all others are dropped from every set, bounding included).
    pub caps_keep: Vec<caps::Capability>,
    /// Syscalls that fail with EPERM (besides [`SECCOMP_DENY_ALWAYS`]).
    pub seccomp_deny: Vec<String>,
    /// File descriptors above 2 passed into the sliver on purpose (`--pass-fd`); every other
    /// one is closed.
    pub pass_fds: Vec<i32>,
    /// Leave the rootfs writable (default: read-only).
    pub rw: bool,
    /// With `rw`: where writes go. `Some`: an overlay upper layer, so the base stays as
    /// certified; `None`: the base itself (only where the kernel has no overlayfs).
    pub overlay: Option<Overlay>,
    /// Create a user namespace (when not root).
    pub user_ns: bool,
    /// The command and its arguments.
    pub argv: Vec<String>,
    /// The command's whole environment ([`command_env`]), in order.
    pub env: Vec<(String, OsString)>,
}

/// `--rw` through overlayfs: the certified rootfs is the lower layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlay {
    /// `--upper DIR`: the upper layer is kept in DIR/upper (DIR/work beside it), on a nosuid,nodev
    /// mount; `None`: a tmpfs that exists only in the sliver's mount namespace.
    pub upper: Option<PathBuf>,
}

/// One setup operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Host: `prctl(PR_SET_NO_NEW_PRIVS)`; inherited by everything below.
    NoNewPrivs,
    /// Host: create the sliver's cgroup(s) and write the limits.
    CgroupCreate,
    /// Host: `clone()` PID 1 of the sliver into new namespaces.
    Clone,
    /// Host: write the child's uid/gid maps (user namespace only).
    IdMaps,
    /// Host: move PID 1 into the cgroup(s) before it runs anything.
    CgroupAttach,
    /// Host: create the veth pair (`ip link add ... netns PID`), address and raise the host end.
    VethHost,
    /// Init: `setsid()`: a new session without a controlling terminal (no TIOCSTI into the
    /// caller's terminal, no signals from it except those swerve forwards).
    NewSession,
    /// Init: close every fd above 2 except `--pass-fd` ones (`close_range`, or one `close` per
    /// open fd on kernels before 5.9); the command inherits only those.
    CloseFds,
    /// Init: join a fresh, empty session keyring (`keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)`).
    SessionKeyring,
    /// Init: `mount(/, MS_REC|MS_PRIVATE)` so nothing propagates to the host.
    MakeRootPrivate,
    /// Init: `unshare(CLONE_NEWCGROUP)`, once in the sliver's own cgroup: the cgroups it can
    /// name are its own subtree (the limits sit on the parent, out of its view).
    CgroupNamespace,
    /// Init: bind the rootfs onto itself (pivot_root needs a mount point).
    BindRootfs,
    /// Init (`--rw` with overlayfs, instead of [`Op::BindRootfs`]): an overlay over the rootfs
    /// path, lower layer the certified tree (read-only bind), upper layer a fresh tmpfs or the
    /// kept `--upper` directory (both nosuid, nodev).
    OverlayRootfs,
    /// Init: nosuid+nodev (and read-only unless `--rw`) on the rootfs bind and every mount
    /// under it.
    RootfsFlags,
    /// Init: fresh procfs at /proc (we are in the new PID namespace already).
    MountProc,
    /// Init: [`READONLY_PATHS`] read-only.
    ProcReadOnly,
    /// Init: read-only sysfs at /sys (shows only this network namespace's interfaces).
    MountSys,
    /// Init: [`MASKED_PATHS`] hidden.
    MaskPaths,
    /// Init: tmpfs at /tmp.
    MountTmp,
    /// Init: tmpfs at /dev.
    MountDev,
    /// Init: bind one host device node into /dev.
    DevNode(&'static str),
    /// Init: /dev/fd, stdin, stdout, stderr symlinks, /dev/shm.
    DevLinks,
    /// Init: a user `--bind`.
    Bind(Bind),
    /// Init: `pivot_root(".", ".")` in the new root (chroot fallback with a warning).
    PivotRoot,
    /// Init: `umount2(old root, MNT_DETACH)`.
    DetachOldRoot,
    /// Init: `sethostname`.
    SetHostname,
    /// Init: bring `lo` up (ioctl SIOCSIFFLAGS).
    LoopbackUp,
    /// Init: address and raise `eth0` (ioctl SIOCSIFADDR/SIOCSIFNETMASK/SIOCSIFFLAGS).
    VethSliver,
    /// Init: fork the command; init stays PID 1, reaps and forwards signals.
    ForkCommand,
    /// Command: setrlimit.
    Rlimits,
    /// Command: drop capabilities (bounding, inheritable, ambient, effective, permitted).
    DropCaps,
    /// Command: install the seccomp deny-list ([`SECCOMP_DENY_ALWAYS`] plus `--seccomp-deny`).
    Seccomp,
    /// Command: `execvp`.
    Exec,
    /// Init: wait for the command, exit with its status (the kernel then kills the rest).
    Reap,
    /// Host: remove the cgroup(s).
    CgroupRemove,
}

/// Where an operation runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// In swerve on the host, before the clone.
    Host,
    /// In swerve on the host, after the clone, before PID 1 is released.
    HostAfterClone,
    /// In PID 1 of the sliver.
    Init,
    /// In the command's process, before exec.
    Command,
    /// After the command has finished.
    Teardown,
}

impl Op {
    /// The phase this operation belongs to.
    pub fn phase(&self) -> Phase {
        use Op::*;
        match self {
            NoNewPrivs | CgroupCreate | Clone => Phase::Host,
            IdMaps | CgroupAttach | VethHost => Phase::HostAfterClone,
            NewSession | CloseFds | SessionKeyring | MakeRootPrivate | CgroupNamespace
            | BindRootfs | OverlayRootfs | RootfsFlags | MountProc | ProcReadOnly | MountSys
            | MaskPaths | MountTmp | MountDev | DevNode(_) | DevLinks | Bind(_) | PivotRoot
            | DetachOldRoot | SetHostname | LoopbackUp | VethSliver | ForkCommand => Phase::Init,
            Rlimits | DropCaps | Seccomp | Exec => Phase::Command,
            Reap | CgroupRemove => Phase::Teardown,
        }
    }
}

/// The planned operations for one sliver.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The validated request.
    pub spec: SliverSpec,
    /// The operations, in execution order.
    pub ops: Vec<Op>,
}

impl Plan {
    /// Builds the fixed-order plan for `spec`.
    pub fn new(spec: SliverSpec) -> Plan {
        let mut ops = vec![Op::NoNewPrivs];
        let cgroup = spec.pids.is_some() || spec.mem.is_some();
        if cgroup {
            ops.push(Op::CgroupCreate);
        }
        ops.push(Op::Clone);
        if spec.user_ns {
            ops.push(Op::IdMaps);
        }
        if cgroup {
            ops.push(Op::CgroupAttach);
        }
        if matches!(spec.net, NetMode::Veth { .. }) {
            ops.push(Op::VethHost);
        }
        ops.extend([
            Op::NewSession,
            Op::CloseFds,
            Op::SessionKeyring,
            Op::MakeRootPrivate,
            Op::CgroupNamespace,
            Op::BindRootfs,
            Op::RootfsFlags,
            Op::MountProc,
            Op::ProcReadOnly,
            Op::MountSys,
            Op::MaskPaths,
            Op::MountTmp,
            Op::MountDev,
        ]);
        ops.extend(DEV_NODES.iter().map(|n| Op::DevNode(n)));
        ops.push(Op::DevLinks);
        ops.extend(spec.binds.iter().cloned().map(Op::Bind));
        ops.extend([Op::PivotRoot, Op::DetachOldRoot, Op::SetHostname]);
        if spec.net != NetMode::Host {
            ops.push(Op::LoopbackUp);
        }
        if matches!(spec.net, NetMode::Veth { .. }) {
            ops.push(Op::VethSliver);
        }
        ops.extend([
            Op::ForkCommand,
            Op::Rlimits,
            Op::DropCaps,
            Op::Seccomp,
            Op::Exec,
            Op::Reap,
        ]);
        if cgroup {
            ops.push(Op::CgroupRemove);
        }
        if spec.rw && spec.overlay.is_some() {
            // The base is never the mount the sliver writes to.
            for op in ops.iter_mut().filter(|o| **o == Op::BindRootfs) {
                *op = Op::OverlayRootfs;
            }
        }
        Plan { spec, ops }
    }

    /// Every syscall the seccomp filter denies: [`SECCOMP_DENY_ALWAYS`], then `--seccomp-deny`'s
    /// others.
    pub fn seccomp_deny(&self) -> Vec<String> {
        let mut v: Vec<String> = SECCOMP_DENY_ALWAYS.iter().map(|s| s.to_string()).collect();
        for s in &self.spec.seccomp_deny {
            if !v.contains(s) {
                v.push(s.clone());
            }
        }
        v
    }

    /// Namespaces `clone()` creates, by name.
    pub fn namespaces(&self) -> Vec<&'static str> {
        let mut v = vec!["mount", "uts", "ipc", "pid"];
        if self.spec.net != NetMode::Host {
            v.push("net");
        }
        if self.spec.user_ns {
            v.push("user");
        }
        v
    }

    /// One line describing `op` with this spec's concrete values.
    pub fn describe(&self, op: &Op) -> String {
        let s = &self.spec;
        let root = s.rootfs.display();
        match op {
            Op::NoNewPrivs => "prctl(PR_SET_NO_NEW_PRIVS, 1)".into(),
            Op::CgroupCreate => {
                let mut l = Vec::new();
                if let Some(p) = s.pids {
                    l.push(format!("pids.max={p}"));
                }
                if let Some(m) = s.mem {
                    l.push(format!("memory limit={m}"));
                }
                format!("cgroup create swerve-<pid> ({}; v1 or v2, whichever the host has) and its child swerve-<pid>/sliver for the processes", l.join(", "))
            }
            Op::Clone => format!("clone(new {} namespaces) -> PID 1 of the sliver; it first sets prctl(PR_SET_PDEATHSIG, SIGKILL), so it dies with swerve", self.namespaces().join(", ")),
            Op::IdMaps => "write /proc/PID/{uid_map,setgroups,gid_map}: 0 -> caller".into(),
            Op::CgroupAttach => "cgroup attach PID 1 (swerve-<pid>/sliver/cgroup.procs)".into(),
            Op::VethHost => match &s.net {
                NetMode::Veth { host, prefix, .. } => format!(
                    "host: ip link add sw<pid> type veth peer name eth0 netns PID; ip addr add {host}/{prefix} dev sw<pid>; ip link set sw<pid> up"
                ),
                _ => "veth (unused)".into(),
            },
            Op::NewSession => "setsid() (no controlling terminal)".into(),
            Op::CloseFds => {
                let keep: Vec<String> = s.pass_fds.iter().map(|f| f.to_string()).collect();
                format!(
                    "close_range(3, ~0) (fallback: close each fd in /proc/self/fd){}",
                    if keep.is_empty() { String::new() } else { format!(" except --pass-fd {}", keep.join(",")) }
                )
            }
            Op::SessionKeyring => "keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL) (a fresh, empty session keyring)".into(),
            Op::MakeRootPrivate => "mount(none, /, MS_REC|MS_PRIVATE)".into(),
            Op::CgroupNamespace => "unshare(CLONE_NEWCGROUP)".into(),
            Op::BindRootfs if s.rw => format!(
                "mount({root}, {root}, MS_BIND|MS_REC) (--rw without overlayfs: the base itself is written; its lock held alone)"
            ),
            Op::BindRootfs => format!("mount({root}, {root}, MS_BIND|MS_REC)"),
            Op::OverlayRootfs => {
                let upper = match s.overlay.as_ref().and_then(|o| o.upper.as_ref()) {
                    Some(d) => format!("upperdir=keep/upper,workdir=keep/work (keep: {} bound MS_NOSUID|MS_NODEV, kept)", d.display()),
                    None => "upperdir=upper,workdir=work (on the staging tmpfs, gone with the sliver)".into(),
                };
                format!(
                    "mount(tmpfs, {root}/tmp, MS_NOSUID|MS_NODEV) (staging, this namespace only); mount({root}, lower, MS_BIND) then RDONLY; mount(overlay, {root}, MS_NOSUID|MS_NODEV, lowerdir=lower,{upper})"
                )
            }
            Op::RootfsFlags => format!(
                "mount_setattr({root}, AT_RECURSIVE, {}NOSUID|NODEV) (fallback: MS_REMOUNT|MS_BIND each mount under it)",
                if s.rw { "" } else { "RDONLY|" }
            ),
            Op::MountProc => format!("mount(proc, {root}/proc, proc, MS_NOSUID|MS_NODEV|MS_NOEXEC)"),
            Op::ProcReadOnly => format!(
                "read-only (bind onto itself, then RDONLY) if present: {}",
                READONLY_PATHS.join(" ")
            ),
            Op::MountSys => format!("mount(sysfs, {root}/sys, sysfs, MS_RDONLY|MS_NOSUID|MS_NODEV|MS_NOEXEC) if /sys exists"),
            Op::MaskPaths => format!(
                "mask (file: read-only bind of /dev/null; dir: read-only empty tmpfs) if present: {}",
                MASKED_PATHS.join(" ")
            ),
            Op::MountTmp => format!("mount(tmpfs, {root}/tmp, tmpfs, MS_NOSUID|MS_NODEV, mode=1777)"),
            Op::MountDev => format!("mount(tmpfs, {root}/dev, tmpfs, MS_NOSUID|MS_NOEXEC, mode=0755)"),
            Op::DevNode(n) => format!("mount(/dev/{n}, {root}/dev/{n}, MS_BIND)"),
            Op::DevLinks => "symlink /dev/{fd,stdin,stdout,stderr} -> /proc/self/fd/..., mkdir /dev/shm".into(),
            Op::Bind(b) => format!(
                "mount({}, {root}{}, MS_BIND|MS_REC); mount_setattr(AT_RECURSIVE, {}NOSUID{})",
                b.src.display(),
                b.dst.display(),
                if b.ro { "RDONLY|" } else { "" },
                if b.dev { "" } else { "|NODEV" }
            ),
            Op::PivotRoot => format!("chdir({root}); pivot_root(., .) (fallback: MS_MOVE + chroot, with a warning)"),
            Op::DetachOldRoot => "umount2(old root, MNT_DETACH); chdir(/)".into(),
            Op::SetHostname => format!("sethostname({})", s.hostname),
            Op::LoopbackUp => "ioctl(SIOCSIFFLAGS, lo, IFF_UP)".into(),
            Op::VethSliver => match &s.net {
                NetMode::Veth { sliver, prefix, .. } => {
                    format!("ioctl(SIOCSIFADDR/SIOCSIFNETMASK/SIOCSIFFLAGS, eth0, {sliver}/{prefix}, IFF_UP)")
                }
                _ => "veth (unused)".into(),
            },
            Op::ForkCommand => "fork() the command; PID 1 stays as init (reaps, forwards signals)".into(),
            Op::Rlimits => {
                let mut l = Vec::new();
                if let Some(m) = s.mem {
                    l.push(format!("RLIMIT_DATA={m}"));
                }
                if let Some(p) = s.pids {
                    l.push(format!("RLIMIT_NPROC={p}"));
                }
                if let Some(c) = s.cpu_secs {
                    l.push(format!("RLIMIT_CPU={c}"));
                }
                if l.is_empty() {
                    "setrlimit: none requested".into()
                } else {
                    format!("setrlimit({})", l.join(", "))
                }
            }
            Op::DropCaps => {
                if s.caps_keep.is_empty() {
                    "drop all capabilities (bounding, inheritable, ambient, effective, permitted)".into()
                } else {
                    let keep: Vec<String> = s.caps_keep.iter().map(|c| c.to_string()).collect();
                    format!("drop all capabilities except {}", keep.join(","))
                }
            }
            Op::Seccomp => format!(
                "seccomp: sandbox-wall's policy (no namespaces, mounts, bpf, perf, ptrace, io_uring, ...), then the seccomp deny-list (EPERM): {}",
                self.seccomp_deny().join(",")
            ),
            Op::Exec => {
                // Names only: a value may be a secret the caller passed on purpose.
                let path = s.env.iter().find(|(n, _)| n == "PATH").map(|(_, v)| v.to_string_lossy());
                let names: Vec<&str> = s.env.iter().map(|(n, _)| n.as_str()).collect();
                format!(
                    "execvpe({:?}) with only {} in the environment (PATH={})",
                    s.argv,
                    names.join(","),
                    path.unwrap_or_default()
                )
            }
            Op::Reap => "init: wait for the command, exit with its status (128+N if killed by signal N)".into(),
            Op::CgroupRemove => "cgroup rmdir".into(),
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut n = 0;
        let mut last = None;
        for op in &self.ops {
            let phase = op.phase();
            if last != Some(phase) {
                let title = match phase {
                    Phase::Host => "host",
                    Phase::HostAfterClone => "host, before releasing PID 1",
                    Phase::Init => "sliver PID 1 (init)",
                    Phase::Command => "command process",
                    Phase::Teardown => "teardown",
                };
                writeln!(f, "# {title}")?;
                last = Some(phase);
            }
            n += 1;
            writeln!(f, "{n:2}. {}", self.describe(op))?;
        }
        Ok(())
    }
}

/// Parses `--mem` (`512MiB`, `2G`; the workspace's size rule, `aeon_cli::size`).
pub fn parse_size(s: &str) -> Result<u64> {
    let v = aeon_cli::size::parse_size(s).map_err(|e| SwerveError::BadArg {
        what: "--mem",
        value: s.to_string(),
        reason: e.to_string(),
    })?;
    if v < (1 << 20) {
        return Err(SwerveError::BadArg {
            what: "--mem",
            value: s.to_string(),
            reason: "at least 1M".into(),
        });
    }
    Ok(v)
}

/// Parses a capability name (`CAP_NET_ADMIN`, `net_admin`, `NET_ADMIN`).
pub fn parse_cap(s: &str) -> Result<caps::Capability> {
    let up = s.to_ascii_uppercase();
    let name = if up.starts_with("CAP_") {
        up
    } else {
        format!("CAP_{up}")
    };
    name.parse().map_err(|_| SwerveError::BadArg {
        what: "--cap",
        value: s.to_string(),
        reason: "unknown capability (see capabilities(7))".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> SliverSpec {
        SliverSpec {
            base: "scratch".into(),
            rootfs: "/srv/rootfs".into(),
            hostname: "sliver-scratch".into(),
            binds: vec![],
            net: NetMode::Loopback,
            mem: None,
            pids: Some(20),
            cpu_secs: None,
            caps_keep: vec![],
            seccomp_deny: vec![],
            pass_fds: vec![],
            rw: false,
            overlay: None,
            user_ns: false,
            argv: vec!["sh".into()],
            env: command_env(&[], &[], |_| None),
        }
    }

    #[test]
    fn plan_order_is_fixed() {
        let p = Plan::new(spec());
        let pos = |op: &Op| p.ops.iter().position(|o| o == op).unwrap();
        assert_eq!(p.ops[0], Op::NoNewPrivs);
        assert!(pos(&Op::CgroupCreate) < pos(&Op::Clone));
        assert!(pos(&Op::Clone) < pos(&Op::MakeRootPrivate));
        assert!(pos(&Op::MakeRootPrivate) < pos(&Op::BindRootfs));
        assert!(pos(&Op::MountProc) < pos(&Op::PivotRoot));
        assert!(pos(&Op::PivotRoot) < pos(&Op::DetachOldRoot));
        assert!(pos(&Op::ForkCommand) < pos(&Op::DropCaps));
        assert!(pos(&Op::DropCaps) < pos(&Op::Exec));
        assert_eq!(p.ops.last(), Some(&Op::CgroupRemove));
        let text = p.to_string();
        assert!(text.contains("pivot_root"), "{text}");
        // Off the caller's terminal, its fds and its keyring before anything else happens.
        let init = pos(&Op::NewSession);
        assert_eq!(
            p.ops[init..init + 4],
            [
                Op::NewSession,
                Op::CloseFds,
                Op::SessionKeyring,
                Op::MakeRootPrivate
            ]
        );
        assert!(p.ops[..init].iter().all(|o| o.phase() != Phase::Init));
        assert!(pos(&Op::BindRootfs) < pos(&Op::RootfsFlags));
        assert!(pos(&Op::RootfsFlags) < pos(&Op::MountProc));
        assert!(pos(&Op::MountProc) < pos(&Op::ProcReadOnly));
        assert!(pos(&Op::MountSys) < pos(&Op::MaskPaths));
        assert!(pos(&Op::MaskPaths) < pos(&Op::PivotRoot));
        assert!(pos(&Op::DropCaps) < pos(&Op::Seccomp));
        assert_eq!(p.seccomp_deny(), ["keyctl", "add_key", "request_key"]);
        let mut s = spec();
        s.seccomp_deny = vec!["ptrace".into(), "keyctl".into()];
        assert_eq!(
            Plan::new(s).seccomp_deny(),
            ["keyctl", "add_key", "request_key", "ptrace"]
        );
    }

    #[test]
    fn net_modes_parse() {
        assert_eq!(NetMode::parse("host").unwrap(), NetMode::Host);
        assert_eq!(
            NetMode::parse("veth:10.77.0.2/24").unwrap(),
            NetMode::Veth {
                sliver: "10.77.0.2".parse().unwrap(),
                host: "10.77.0.1".parse().unwrap(),
                prefix: 24
            }
        );
        assert_eq!(
            NetMode::parse("veth:10.77.0.1/24").unwrap(),
            NetMode::Veth {
                sliver: "10.77.0.1".parse().unwrap(),
                host: "10.77.0.2".parse().unwrap(),
                prefix: 24
            }
        );
        assert!(NetMode::parse("veth:10.77.0.0/24").is_err());
        assert!(NetMode::parse("veth:10.77.0.2/24,10.78.0.1").is_err());
        assert!(NetMode::parse("bridge").is_err());
    }

    #[test]
    fn sizes_caps_and_binds_parse() {
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("12").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(
            parse_cap("net_admin").unwrap(),
            caps::Capability::CAP_NET_ADMIN
        );
        assert!(parse_cap("CAP_TELEPORT").is_err());
        let b = Bind::parse("/tmp:/mnt/x:ro").unwrap();
        assert!(b.ro && !b.dev && b.dst == Path::new("/mnt/x"));
        let b = Bind::parse("/tmp:/mnt/x:rw,dev").unwrap();
        assert!(!b.ro && b.dev);
        assert!(!Bind::parse("/tmp:/mnt/x").unwrap().dev);
        assert!(Bind::parse("/tmp:/mnt/x:suid").is_err());
        assert!(Bind::parse("/tmp:relative").is_err());
        assert!(Bind::parse("/tmp:/a/../b").is_err());
        assert!(Bind::parse("/does/not/exist:/x").is_err());
    }

    #[test]
    fn rw_with_overlay_never_binds_the_base() {
        let mut s = spec();
        s.rw = true;
        s.overlay = Some(Overlay { upper: None });
        let p = Plan::new(s);
        assert!(!p.ops.contains(&Op::BindRootfs));
        let pos = |op: &Op| p.ops.iter().position(|o| o == op).unwrap();
        assert!(pos(&Op::MakeRootPrivate) < pos(&Op::OverlayRootfs));
        assert!(pos(&Op::OverlayRootfs) < pos(&Op::RootfsFlags));
        assert!(p.to_string().contains("mount(overlay, /srv/rootfs"), "{p}");
        // Without overlayfs --rw binds the base (and cli.rs holds its lock exclusively).
        let mut s = spec();
        s.rw = true;
        let p = Plan::new(s);
        assert!(p.ops.contains(&Op::BindRootfs) && !p.ops.contains(&Op::OverlayRootfs));
    }

    #[test]
    fn the_environment_is_built_not_inherited() {
        let caller = |n: &str| match n {
            "TERM" => Some(OsString::from("xterm")),
            "KEEP" => Some(OsString::from("kept-value-42")),
            "SECRET" => Some(OsString::from("s")),
            _ => None,
        };
        let env = command_env(
            &["KEEP".into(), "UNSET".into()],
            &[("HOME".into(), "/tmp".into()), ("A".into(), "".into())],
            caller,
        );
        let got: Vec<(&str, &str)> = env
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [
                ("PATH", SLIVER_PATH),
                ("HOME", "/tmp"),
                ("TERM", "xterm"),
                ("KEEP", "kept-value-42"),
                ("A", "")
            ]
        );
        assert_eq!(command_env(&[], &[], |_| None).len(), 2);
        assert_eq!(parse_setenv("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(parse_setenv("A").is_err());
        assert!(parse_setenv("=x").is_err());
        assert!(parse_env_name("A=B").is_err());
        assert!(parse_env_name("").is_err());
        let text = Plan::new(SliverSpec { env, ..spec() }).to_string();
        assert!(text.contains("PATH,HOME,TERM,KEEP,A"), "{text}");
        assert!(
            !text.contains("kept-value-42"),
            "a value was printed: {text}"
        );
    }
}
