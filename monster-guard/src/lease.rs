//! Running a command under a grant: capability isolation, a lease, revocation watch.
//!
//! The command runs in its own process group. monster-guard polls every 50 ms: when the child
//! exits, its status is passed through; when the lease (or the grant) expires, or the grant is
//! revoked (the signed revocation list is re-read every poll), or monster-guard itself gets
//! SIGINT/SIGTERM, the whole group gets SIGTERM, then SIGKILL after the grace period, and
//! monster-guard exits with [`EXIT_LEASE_EXPIRED`], [`EXIT_REVOKED`] or [`EXIT_INTERRUPTED`].

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::Pid;

use crate::error::{GuardError, Result};
use crate::grant::{Caps, RevocationList, SignedGrant};

/// Exit status when the lease (or the grant's expiry) ended the command.
pub const EXIT_LEASE_EXPIRED: u8 = 124;
/// Exit status when the grant was revoked while the command ran.
pub const EXIT_REVOKED: u8 = 125;
/// Exit status when monster-guard was interrupted (SIGINT/SIGTERM) and stopped the command.
pub const EXIT_INTERRUPTED: u8 = 130;

const POLL: Duration = Duration::from_millis(50);

/// What to run, under which grant and limits.
pub struct LeaseRequest<'a> {
    /// The verified grant the command runs under.
    pub grant: &'a SignedGrant,
    /// The capabilities requested for this run (a subset of the grant's).
    pub caps: &'a Caps,
    /// Lease length.
    pub lease: Duration,
    /// Time between SIGTERM and SIGKILL.
    pub grace: Duration,
    /// The command and its arguments.
    pub cmd: &'a [String],
    /// Revocation list to watch, and the key it must be signed with.
    pub revoked_path: &'a Path,
    /// The issuer key that signs the revocation list.
    pub issuer: &'a ed25519_dalek::VerifyingKey,
}

static GOT_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: i32) {
    GOT_SIGNAL.store(sig, Ordering::SeqCst);
}

/// Why a lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    Expired,
    Revoked,
    Interrupted,
}

/// Runs the command under the lease and returns monster-guard's exit status.
pub fn run(req: &LeaseRequest<'_>, now_unix: u64) -> Result<u8> {
    let (program, args) = req
        .cmd
        .split_first()
        .ok_or_else(|| GuardError::Invalid("no command given after --".into()))?;
    // The lease never outlives the grant.
    let grant_left = Duration::from_secs(req.grant.grant.expires.saturating_sub(now_unix));
    let lease = req.lease.min(grant_left);
    let isolate_net = !req.caps.has("net");
    let isolate_fs = !req.caps.has("fs");
    let root = nix::unistd::geteuid().is_root();

    let mut command = Command::new(program);
    command
        .args(args)
        .process_group(0)
        .env("MONSTER_GUARD_GRANT", &req.grant.grant.name)
        .env("MONSTER_GUARD_CAPS", req.caps.to_string())
        .env(
            "MONSTER_GUARD_LEASE_SECS",
            format!("{}", lease.as_secs_f64()),
        );
    // SAFETY: the closure runs in the forked child before exec; it only makes raw syscalls
    // (prctl, unshare, mount) with static arguments and allocates nothing.
    unsafe {
        command.pre_exec(move || isolate(isolate_net, isolate_fs, root));
    }
    install_signal_handlers();
    let started = Instant::now();
    let mut child = command.spawn().map_err(|e| {
        GuardError::Lease(format!(
            "cannot start {program:?}{}: {e}",
            if isolate_net || isolate_fs {
                format!(
                    " with isolation (net: {}, read-only fs: {})",
                    isolate_net, isolate_fs
                )
            } else {
                String::new()
            }
        ))
    })?;
    let pgid = Pid::from_raw(child.id() as i32);
    tracing::info!(pid = child.id(), lease_s = lease.as_secs_f64(), caps = %req.caps, "command started");

    let stop = loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(exit_of(status)),
            Ok(None) => {}
            Err(e) => return Err(GuardError::Lease(format!("wait for {program:?}: {e}"))),
        }
        if GOT_SIGNAL.load(Ordering::SeqCst) != 0 {
            break Stop::Interrupted;
        }
        if started.elapsed() >= lease {
            break Stop::Expired;
        }
        match RevocationList::load(req.revoked_path, req.issuer) {
            Ok(list) if list.revokes(req.grant) => break Stop::Revoked,
            Ok(_) => {}
            Err(e) => {
                // Fail closed: a revocation list that cannot be trusted ends the lease.
                eprintln!("monster-guard: {}", e.full());
                break Stop::Revoked;
            }
        }
        std::thread::sleep(POLL);
    };
    let how = terminate(&mut child, pgid, req.grace);
    let (what, code) = match stop {
        Stop::Expired => (
            format!("lease of {:.1}s expired", lease.as_secs_f64()),
            EXIT_LEASE_EXPIRED,
        ),
        Stop::Revoked => (
            format!("grant {:?} was revoked", req.grant.grant.name),
            EXIT_REVOKED,
        ),
        Stop::Interrupted => ("interrupted".to_string(), EXIT_INTERRUPTED),
    };
    eprintln!(
        "monster-guard: {what} after {:.2}s; stopped process group {pgid} ({how}); exit {code}",
        started.elapsed().as_secs_f64()
    );
    Ok(code)
}

/// In the child, before exec: die with the parent, then drop what the caps do not grant.
fn isolate(net: bool, fs: bool, root: bool) -> std::io::Result<()> {
    use nix::mount::{mount, MsFlags};
    use nix::sched::{unshare, CloneFlags};
    let err = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
    // If monster-guard dies, the command must not outlive its lease unsupervised.
    nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(err)?;
    let mut flags = CloneFlags::empty();
    if net {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if fs {
        flags |= CloneFlags::CLONE_NEWNS;
    }
    if flags.is_empty() {
        return Ok(());
    }
    if !root {
        // Unprivileged: a user namespace makes the others possible (where the kernel allows it).
        flags |= CloneFlags::CLONE_NEWUSER;
    }
    unshare(flags).map_err(err)?;
    if fs {
        // Keep our mount changes out of the parent namespace, then make the root read-only.
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(err)?;
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(err)?;
    }
    Ok(())
}

fn install_signal_handlers() {
    let action = signal::SigAction::new(
        signal::SigHandler::Handler(on_signal),
        signal::SaFlags::empty(),
        signal::SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        let _ = unsafe { signal::sigaction(s, &action) };
    }
}

/// SIGTERM to the group; SIGKILL to whatever is left after `grace`. Returns what it took.
fn terminate(child: &mut Child, pgid: Pid, grace: Duration) -> &'static str {
    let _ = signal::killpg(pgid, Signal::SIGTERM);
    let t = Instant::now();
    let mut reaped = false;
    while t.elapsed() < grace {
        if !reaped {
            reaped = matches!(child.try_wait(), Ok(Some(_)));
        }
        // After the leader is reaped, an empty group answers ESRCH.
        if reaped && signal::killpg(pgid, None).is_err() {
            return "SIGTERM";
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = signal::killpg(pgid, Signal::SIGKILL);
    let _ = child.wait();
    "SIGKILL after grace"
}

fn exit_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => c.clamp(0, 255) as u8,
        (None, Some(s)) => (128 + s).clamp(0, 255) as u8,
        _ => crate::EXIT_ERROR,
    }
}

/// Parses a duration: `2`, `2s`, `1.5`, `90s`, `5m`, `2h`, `1d`.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, 's')) => (&t[..i], 1.0),
        Some((i, 'm')) => (&t[..i], 60.0),
        Some((i, 'h')) => (&t[..i], 3600.0),
        Some((i, 'd')) => (&t[..i], 86400.0),
        _ => (t, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| {
        GuardError::Invalid(format!(
            "bad duration {s:?}: use seconds, or a number with s, m, h or d"
        ))
    })?;
    let secs = v * mult;
    if !(secs.is_finite() && secs > 0.0 && secs < 1e10) {
        return Err(GuardError::Invalid(format!(
            "bad duration {s:?}: must be positive"
        )));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-3").is_err());
    }
}
