//! Running a command under a grant: containment, a lease, revocation watch.
//!
//! The command and every process it starts are contained ([`crate::contain`]: a PID namespace
//! whose pid 1 is monster-guard's reaper, else a subreaper) and start with only what the run's
//! caps allow (no_new_privs, capability sets reduced to `specs/caps.md`'s mapping, no network
//! without `net`, a read-only root without `fs`). monster-guard polls every 50 ms: when the
//! command exits, its status is passed through and whatever it left running is killed; when
//! the lease (or the grant) expires, or the grant is revoked (the signed revocation list is
//! re-checked every poll), or monster-guard itself gets SIGINT/SIGTERM/SIGHUP, the whole tree
//! gets SIGTERM, then SIGKILL after the grace period, and monster-guard exits with
//! [`EXIT_LEASE_EXPIRED`], [`EXIT_REVOKED`] or [`EXIT_INTERRUPTED`]. If monster-guard itself is
//! killed, the tree dies with it.

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::contain::{self, NetIsolation, Tree, Want};
use crate::error::{GuardError, Result};
use crate::fsutil::Home;
use crate::grant::{Caps, SignedGrant, WatchedList};

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
    /// The issuer's revocation list (with the home's watermark), re-checked every poll.
    pub revocations: &'a WatchedList,
    /// The containment asked for (`--contain`).
    pub contain: Want,
    /// The guard's home: hidden from the command, with swerve's (both hold a node key).
    pub home: &'a Home,
    /// Run without the seccomp filter where none can be installed (`--allow-no-seccomp`).
    pub allow_no_seccomp: bool,
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

/// The directories holding a node signing key the command must never read: the guard's home
/// and swerve's (`$SWERVE_HOME`, default `~/.swerve`), those that exist, canonical (a mount
/// goes over the real directory, not a symlink to it).
fn key_homes(home: &Home) -> Vec<std::path::PathBuf> {
    let swerve = std::env::var_os("SWERVE_HOME")
        .filter(|h| !h.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| std::path::PathBuf::from(h).join(".swerve"))
        });
    let mut v: Vec<std::path::PathBuf> = Vec::new();
    for d in std::iter::once(home.dir.clone()).chain(swerve) {
        if let Ok(c) = d.canonicalize() {
            if c.is_dir() && !v.contains(&c) {
                v.push(c);
            }
        }
    }
    v
}

/// Runs the command under the lease and returns monster-guard's exit status.
pub fn run(req: &LeaseRequest<'_>, now_unix: u64) -> Result<u8> {
    // The lease never outlives the grant.
    let grant_left = Duration::from_secs(req.grant.grant.expires.saturating_sub(now_unix));
    let lease = req.lease.min(grant_left);
    let spec = contain::Spec {
        cmd: req.cmd,
        env: vec![
            ("MONSTER_GUARD_GRANT".into(), req.grant.grant.name.clone()),
            ("MONSTER_GUARD_CAPS".into(), req.caps.to_string()),
            (
                "MONSTER_GUARD_LEASE_SECS".into(),
                format!("{}", lease.as_secs_f64()),
            ),
        ],
        isolate_net: !req.caps.has("net"),
        isolate_fs: !req.caps.has("fs"),
        allowed_caps: crate::linux_caps::allowed_mask(req.caps),
        want: req.contain,
        hide: key_homes(req.home),
        allow_no_seccomp: req.allow_no_seccomp,
    };
    install_signal_handlers();
    let started = Instant::now();
    let child = contain::start(&spec)?;
    let reaper = child.reaper;
    tracing::info!(pid = reaper.as_raw(), lease_s = lease.as_secs_f64(), caps = %req.caps, tree = %child.tree, "command started");

    let stop = loop {
        match waitpid(reaper, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {}
            Ok(WaitStatus::Exited(_, code)) => {
                sweep();
                return Ok(code.clamp(0, 255) as u8);
            }
            Ok(WaitStatus::Signaled(_, sig, _)) => {
                sweep();
                return Ok((128 + sig as i32).clamp(0, 255) as u8);
            }
            Ok(_) => {}
            Err(e) => return Err(GuardError::Lease(format!("wait for the command: {e}"))),
        }
        if GOT_SIGNAL.load(Ordering::SeqCst) != 0 {
            break Stop::Interrupted;
        }
        if started.elapsed() >= lease {
            break Stop::Expired;
        }
        match req.revocations.current() {
            Ok(list) if list.revokes(req.grant) => break Stop::Revoked,
            Ok(_) => {}
            Err(e) => {
                // Fail closed: a revocation list that cannot be trusted ends the lease.
                eprintln!("monster-guard: {e}");
                break Stop::Revoked;
            }
        }
        std::thread::sleep(POLL);
    };
    let how = terminate(reaper, child.tree, req.grace);
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
    let net = match child.net {
        NetIsolation::SocketsDenied => "; IP sockets were denied",
        _ => "",
    };
    eprintln!(
        "monster-guard: {what} after {:.2}s; stopped the command and every process it started ({how}; contained by {}{net}); exit {code}",
        started.elapsed().as_secs_f64(),
        child.tree,
    );
    Ok(code)
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

/// Whether the reaper has exited (and is reaped now).
fn gone(reaper: Pid) -> bool {
    !matches!(
        waitpid(reaper, Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::StillAlive)
    )
}

fn wait_gone(reaper: Pid, limit: Duration) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if gone(reaper) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    gone(reaper)
}

/// SIGTERM to the tree (the reaper relays it); after `grace`, SIGKILL to all of it. Returns
/// what it took.
fn terminate(reaper: Pid, tree: Tree, grace: Duration) -> &'static str {
    let _ = signal::kill(reaper, Signal::SIGTERM);
    let how = if wait_gone(reaper, grace) {
        "SIGTERM"
    } else {
        match tree {
            // pid 1 killed: the kernel kills the rest of the namespace and waits for them.
            Tree::PidNamespace { .. } => {
                let _ = signal::kill(reaper, Signal::SIGKILL);
            }
            // The reaper kills its descendants, then exits; if it cannot, it is killed.
            Tree::Subreaper { .. } => {
                let _ = signal::kill(reaper, Signal::SIGUSR2);
                if !wait_gone(reaper, Duration::from_secs(5)) {
                    let _ = signal::kill(reaper, Signal::SIGKILL);
                }
            }
        }
        let _ = waitpid(reaper, None);
        "SIGKILL after grace"
    };
    sweep();
    how
}

/// Kills whatever was orphaned to monster-guard (a subreaper) because the reaper died first.
fn sweep() {
    contain::kill_descendants(std::process::id() as i32, Duration::from_secs(5));
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
