//! The seccomp policy of every lease and every sliver: a deny-list modelled on Docker's default
//! profile (`profiles/seccomp/default.json`), with Docker's capability conditions.
//!
//! Denied (EPERM) unless the command keeps the capability named for the group, as Docker does:
//!
//! | group | syscalls | unless kept |
//! |-------|----------|-------------|
//! | namespaces | `unshare`, `setns`, `clone` with any `CLONE_NEW*` flag | CAP_SYS_ADMIN |
//! | mounts | `mount`, `umount2`, `pivot_root`, `fsopen`, `fsconfig`, `fsmount`, `fspick`, `move_mount`, `open_tree`, `open_tree_attr`, `mount_setattr` | CAP_SYS_ADMIN |
//! | kernel surface | `bpf`, `perf_event_open`, `fanotify_init`, `lookup_dcookie`, `quotactl`, `quotactl_fd`, `swapon`, `swapoff`, `nfsservctl`, `name_to_handle_at` | CAP_SYS_ADMIN |
//! | other processes | `ptrace`, `process_vm_readv`, `process_vm_writev`, `kcmp`, `userfaultfd` | CAP_SYS_PTRACE |
//! | modules | `init_module`, `finit_module`, `delete_module` | CAP_SYS_MODULE |
//! | boot | `kexec_load`, `kexec_file_load`, `reboot` | CAP_SYS_BOOT |
//! | clock | `settimeofday`, `clock_settime`, `clock_adjtime` | CAP_SYS_TIME |
//! | accounting | `acct` | CAP_SYS_PACCT |
//! | kernel log | `syslog` | CAP_SYSLOG |
//! | file handles | `open_by_handle_at` | CAP_DAC_READ_SEARCH |
//! | I/O ports (x86) | `iopl`, `ioperm` | CAP_SYS_RAWIO |
//! | always | `keyctl`, `add_key`, `request_key` (keyrings are not namespaced), `io_uring_setup`, `io_uring_enter`, `io_uring_register` (its operations bypass this filter), and on x86 the obsolete `_sysctl`, `uselib`, `ustat`, `sysfs` | - |
//!
//! `clone3` fails with ENOSYS unless CAP_SYS_ADMIN is kept: its flags sit in memory, where
//! seccomp cannot read them, and ENOSYS makes libc fall back to `clone`, whose flags it can
//! (Docker and runc do the same). On x86_64 every x32-ABI syscall (number with bit 30 set)
//! fails too: the same numbers with that bit would pass a deny-list by number. A syscall of
//! another architecture kills the process (seccompiler's arch check).
//!
//! With [`Policy::deny_ip_sockets`], `socket()` of any family but AF_UNIX fails too (a lease
//! without `net` where no network namespace could be made).
//!
//! Why a deny-list and not Docker's allowlist: the commands behind the wall are our own
//! inference binaries, shells and probes, on x86_64 and aarch64 kernels from 4.19 on; an
//! allowlist that misses one syscall a libc or runtime starts using breaks a station in the
//! field, and what an allowlist would additionally refuse (the syscalls Docker leaves out
//! that exist on no supported kernel, or need a capability the command never holds) gives
//! nothing the capability drop does not already give. Every call that creates or enters a
//! namespace, changes a mount, loads code into the kernel, or reaches another process's
//! memory is on the list.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use crate::caps::cap;

/// Why the filter could not be built or installed.
#[derive(Debug, thiserror::Error)]
pub enum WallError {
    /// seccompiler refused the rules (a bug here, or an architecture it does not know).
    #[error("building the seccomp filter: {0}")]
    Build(String),
    /// The kernel refused to install it.
    #[error("installing the seccomp filter: {source}")]
    Install {
        /// The error of `seccomp(SECCOMP_SET_MODE_FILTER)` or `prctl(PR_SET_NO_NEW_PRIVS)`.
        source: std::io::Error,
    },
}

impl WallError {
    /// True when the kernel (or an emulator such as qemu-user) has no seccomp filters at all
    /// (ENOSYS, or EINVAL for SECCOMP_SET_MODE_FILTER), as opposed to refusing this one.
    pub fn unsupported(&self) -> bool {
        matches!(self, WallError::Install { source }
            if matches!(source.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EINVAL)))
    }
}

/// What the filter allows beyond the base policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// The capabilities the command keeps (bit N = capability N): a group of the table above
    /// is allowed when its capability is kept, as in Docker's profile.
    pub kept_caps: u64,
    /// Deny `socket()` of every family but AF_UNIX.
    pub deny_ip_sockets: bool,
}

/// `open_tree_attr` (Linux 6.15): the same number on every architecture, not yet in libc.
const SYS_OPEN_TREE_ATTR: i64 = 467;

/// `kexec_file_load`: libc's musl aarch64 target (the device build) lacks the constant.
#[cfg(target_arch = "aarch64")]
const SYS_KEXEC_FILE_LOAD: i64 = 294;
#[cfg(target_arch = "x86_64")]
const SYS_KEXEC_FILE_LOAD: i64 = 320;
#[cfg(not(any(target_arch = "aarch64", target_arch = "x86_64")))]
const SYS_KEXEC_FILE_LOAD: i64 = libc::SYS_kexec_file_load;

/// The syscalls denied outright, each with the capability that lifts the denial (None: always).
pub fn denied() -> Vec<(&'static str, i64, Option<u32>)> {
    let admin = Some(cap::SYS_ADMIN);
    let ptrace = Some(cap::SYS_PTRACE);
    let boot = Some(cap::SYS_BOOT);
    let module = Some(cap::SYS_MODULE);
    let time = Some(cap::SYS_TIME);
    #[allow(unused_mut)]
    let mut v = vec![
        // Namespaces (clone's flags are filtered separately).
        ("unshare", libc::SYS_unshare, admin),
        ("setns", libc::SYS_setns, admin),
        // Mounts, old and new API.
        ("mount", libc::SYS_mount, admin),
        ("umount2", libc::SYS_umount2, admin),
        ("pivot_root", libc::SYS_pivot_root, admin),
        ("fsopen", libc::SYS_fsopen, admin),
        ("fsconfig", libc::SYS_fsconfig, admin),
        ("fsmount", libc::SYS_fsmount, admin),
        ("fspick", libc::SYS_fspick, admin),
        ("move_mount", libc::SYS_move_mount, admin),
        ("open_tree", libc::SYS_open_tree, admin),
        ("open_tree_attr", SYS_OPEN_TREE_ATTR, admin),
        ("mount_setattr", libc::SYS_mount_setattr, admin),
        // Kernel attack surface.
        ("bpf", libc::SYS_bpf, admin),
        ("perf_event_open", libc::SYS_perf_event_open, admin),
        ("fanotify_init", libc::SYS_fanotify_init, admin),
        ("lookup_dcookie", libc::SYS_lookup_dcookie, admin),
        ("quotactl", libc::SYS_quotactl, admin),
        ("quotactl_fd", libc::SYS_quotactl_fd, admin),
        ("swapon", libc::SYS_swapon, admin),
        ("swapoff", libc::SYS_swapoff, admin),
        ("nfsservctl", libc::SYS_nfsservctl, admin),
        ("name_to_handle_at", libc::SYS_name_to_handle_at, admin),
        // Other processes' memory and state.
        ("ptrace", libc::SYS_ptrace, ptrace),
        ("process_vm_readv", libc::SYS_process_vm_readv, ptrace),
        ("process_vm_writev", libc::SYS_process_vm_writev, ptrace),
        ("kcmp", libc::SYS_kcmp, ptrace),
        ("userfaultfd", libc::SYS_userfaultfd, ptrace),
        // Kernel code and the machine itself.
        ("init_module", libc::SYS_init_module, module),
        ("finit_module", libc::SYS_finit_module, module),
        ("delete_module", libc::SYS_delete_module, module),
        ("kexec_load", libc::SYS_kexec_load, boot),
        ("kexec_file_load", SYS_KEXEC_FILE_LOAD, boot),
        ("reboot", libc::SYS_reboot, boot),
        ("settimeofday", libc::SYS_settimeofday, time),
        ("clock_settime", libc::SYS_clock_settime, time),
        ("clock_adjtime", libc::SYS_clock_adjtime, time),
        ("acct", libc::SYS_acct, Some(cap::SYS_PACCT)),
        ("syslog", libc::SYS_syslog, Some(cap::SYSLOG)),
        (
            "open_by_handle_at",
            libc::SYS_open_by_handle_at,
            Some(cap::DAC_READ_SEARCH),
        ),
        // Always: keyrings are not namespaced (uid 0 reaches root's user keyring from any
        // session); io_uring's operations are not seen by seccomp.
        ("keyctl", libc::SYS_keyctl, None),
        ("add_key", libc::SYS_add_key, None),
        ("request_key", libc::SYS_request_key, None),
        ("io_uring_setup", libc::SYS_io_uring_setup, None),
        ("io_uring_enter", libc::SYS_io_uring_enter, None),
        ("io_uring_register", libc::SYS_io_uring_register, None),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        ("iopl", libc::SYS_iopl, Some(cap::SYS_RAWIO)),
        ("ioperm", libc::SYS_ioperm, Some(cap::SYS_RAWIO)),
        ("_sysctl", libc::SYS__sysctl, None),
        ("uselib", libc::SYS_uselib, None),
        ("ustat", libc::SYS_ustat, None),
        ("sysfs", libc::SYS_sysfs, None),
    ]);
    v
}

/// The `clone` flags that create a namespace (CLONE_NEWTIME is accepted only by `clone3` and
/// `unshare`, both denied).
pub const CLONE_NEW_FLAGS: [(&str, libc::c_int); 7] = [
    ("CLONE_NEWNS", libc::CLONE_NEWNS),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER),
    ("CLONE_NEWPID", libc::CLONE_NEWPID),
    ("CLONE_NEWNET", libc::CLONE_NEWNET),
];

/// The compiled policy: built before the fork, installed by [`Filter::apply`] right before exec.
#[derive(Clone, Debug)]
pub struct Filter {
    programs: Vec<BpfProgram>,
}

fn build<E: std::fmt::Display>(e: E) -> WallError {
    WallError::Build(e.to_string())
}

fn arch() -> Result<seccompiler::TargetArch, WallError> {
    std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| build(e))
}

fn program(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, WallError> {
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(errno as u32),
        arch()?,
    )
    .map_err(build)?;
    filter.try_into().map_err(build)
}

fn arg0(op: SeccompCmpOp, value: u64) -> Result<SeccompRule, WallError> {
    // Dword: the flags and the address family are ints (the low half of the register).
    let c = SeccompCondition::new(0, SeccompCmpArgLen::Dword, op, value).map_err(build)?;
    SeccompRule::new(vec![c]).map_err(build)
}

/// x86_64 only: every x32-ABI syscall fails (EPERM). The x32 numbers are the x86_64 ones with
/// bit 30 set and the same audit arch, so a deny-list by number would let them through.
#[cfg(target_arch = "x86_64")]
fn x32_guard() -> BpfProgram {
    const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    let i = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    vec![
        i(LD_W_ABS, 0, 0, 4),                           // 0: A = seccomp_data.arch
        i(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),              // 1: another arch: allow here (see 5)
        i(LD_W_ABS, 0, 0, 0),                           // 2: A = seccomp_data.nr
        i(JGE_K, 0, 1, 0x4000_0000),                    // 3: x32 bit set?
        i(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32), // 4: deny
        i(RET_K, 0, 0, RET_ALLOW),                      // 5: the main program decides
    ]
}

impl Filter {
    /// Compiles the policy for this architecture.
    pub fn new(policy: &Policy) -> Result<Filter, WallError> {
        let kept = |c: Option<u32>| c.is_some_and(|c| policy.kept_caps & (1u64 << c) != 0);
        let admin = kept(Some(cap::SYS_ADMIN));
        let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for (_, nr, unless) in denied() {
            if !kept(unless) {
                rules.insert(nr, vec![]);
            }
        }
        if !admin {
            // Any one namespace flag is enough to deny (the rules of one syscall are OR'ed).
            let ns = CLONE_NEW_FLAGS
                .iter()
                .map(|&(_, f)| arg0(SeccompCmpOp::MaskedEq(f as u64), f as u64))
                .collect::<Result<Vec<_>, _>>()?;
            rules.insert(libc::SYS_clone, ns);
        }
        if policy.deny_ip_sockets {
            rules.insert(
                libc::SYS_socket,
                vec![arg0(SeccompCmpOp::Ne, libc::AF_UNIX as u64)?],
            );
        }
        let mut programs = vec![program(rules, libc::EPERM)?];
        if !admin {
            programs.push(program(
                [(libc::SYS_clone3, vec![])].into_iter().collect(),
                libc::ENOSYS,
            )?);
        }
        #[cfg(target_arch = "x86_64")]
        programs.push(x32_guard());
        Ok(Filter { programs })
    }

    /// Installs the filter in the calling thread (no_new_privs first; the filter is inherited
    /// by every child and kept across exec). Only syscalls: safe between fork and exec.
    pub fn apply(&self) -> Result<(), WallError> {
        for p in &self.programs {
            seccompiler::apply_filter(p).map_err(|e| WallError::Install {
                source: match e {
                    seccompiler::Error::Seccomp(io) | seccompiler::Error::Prctl(io) => io,
                    other => std::io::Error::other(other.to_string()),
                },
            })?;
        }
        Ok(())
    }
}

/// Whether the calling process already runs under a seccomp filter (`Seccomp: 2` in
/// /proc/self/status): inside a sliver or a lease.
pub fn already_filtered() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp:").map(|v| v.trim() == "2"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` in a forked child under the filter; returns the child's exit code.
    fn in_child(policy: Policy, f: fn() -> i32) -> i32 {
        let filter = Filter::new(&policy).unwrap();
        // SAFETY: the child only makes syscalls (seccomp install, the probed ones) and _exits.
        match unsafe { libc::fork() } {
            0 => {
                let code = match filter.apply() {
                    Ok(()) => f(),
                    Err(_) => 99,
                };
                // SAFETY: exit without running the test harness's handlers.
                unsafe { libc::_exit(code) }
            }
            pid => {
                let mut st = 0;
                // SAFETY: waits for our own child.
                unsafe { libc::waitpid(pid, &mut st, 0) };
                libc::WEXITSTATUS(st)
            }
        }
    }

    fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    #[test]
    fn namespace_creation_is_denied_and_clone3_is_enosys() {
        let code = in_child(Policy::default(), || {
            // SAFETY: unshare with flags only; fails under the filter.
            let r = unsafe {
                libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP)
            };
            if r == 0 || errno() != libc::EPERM {
                return 1;
            }
            // SAFETY: clone3 with a null argument: the filter answers before the kernel reads it.
            let r = unsafe { libc::syscall(libc::SYS_clone3, 0usize, 0usize) };
            if r != -1 || errno() != libc::ENOSYS {
                return 2;
            }
            // SAFETY: a plain fork (clone without namespace flags) still works.
            match unsafe { libc::fork() } {
                // SAFETY: the child leaves at once, running nothing.
                0 => unsafe { libc::_exit(0) },
                -1 => return 3,
                pid => {
                    let mut st = 0;
                    // SAFETY: reaps our own child.
                    unsafe { libc::waitpid(pid, &mut st, 0) };
                }
            }
            // SAFETY: mount with a null source and a path: fails under the filter.
            let r = unsafe {
                libc::mount(
                    c"none".as_ptr(),
                    c"/".as_ptr(),
                    c"cgroup2".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            };
            if r == 0 || errno() != libc::EPERM {
                return 4;
            }
            0
        });
        assert_eq!(code, 0, "a namespace or mount call got through");
    }

    #[test]
    fn sockets_are_denied_only_when_asked() {
        fn inet() -> i32 {
            // SAFETY: socket() returns a descriptor or -1.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd >= 0 {
                // SAFETY: closing the descriptor we just got.
                unsafe { libc::close(fd) };
                0
            } else {
                10
            }
        }
        let denied = Policy {
            deny_ip_sockets: true,
            ..Policy::default()
        };
        assert_eq!(in_child(denied, inet), 10);
        assert_eq!(in_child(Policy::default(), inet), 0);
        assert_eq!(
            in_child(denied, || {
                // SAFETY: as above, AF_UNIX stays allowed.
                let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
                i32::from(fd < 0)
            }),
            0
        );
    }

    #[test]
    fn keeping_cap_sys_admin_lifts_the_namespace_group_only() {
        let p = Policy {
            kept_caps: 1 << cap::SYS_ADMIN,
            ..Policy::default()
        };
        let names = |p: &Policy| -> Vec<&str> {
            denied()
                .into_iter()
                .filter(|(_, _, c)| !c.is_some_and(|c| p.kept_caps & (1 << c) != 0))
                .map(|(n, _, _)| n)
                .collect()
        };
        let admin = names(&p);
        assert!(!admin.contains(&"mount") && !admin.contains(&"unshare"));
        assert!(admin.contains(&"keyctl") && admin.contains(&"ptrace"));
        let none = names(&Policy::default());
        for n in [
            "unshare",
            "setns",
            "mount",
            "fsopen",
            "bpf",
            "perf_event_open",
            "keyctl",
        ] {
            assert!(none.contains(&n), "{n} not denied");
        }
        #[cfg(all(
            target_env = "gnu",
            any(target_arch = "x86_64", target_arch = "aarch64")
        ))]
        assert_eq!(SYS_KEXEC_FILE_LOAD, libc::SYS_kexec_file_load);
        // Each number once (a duplicate would silently merge two groups' conditions).
        let mut nrs: Vec<i64> = denied().iter().map(|d| d.1).collect();
        nrs.sort_unstable();
        nrs.dedup();
        assert_eq!(nrs.len(), denied().len());
    }
}
