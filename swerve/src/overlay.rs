//! `--rw` without touching the certified base (issue 32.6): the sliver's root becomes an
//! overlayfs whose lower layer is the certified rootfs (a read-only bind) and whose upper layer is
//! a fresh tmpfs that exists only in the sliver's mount namespace (or, with `--upper DIR`, a
//! directory the caller keeps, which must be on a nosuid,nodev mount). A read-only sliver of the
//! same base keeps reading the certified bytes and a setuid file made inside never exists on the
//! host, or only where setuid does nothing.
//!
//! Where the kernel has no overlayfs, `--rw` writes the base in place, says so, and holds the
//! base's lock exclusively: every sliver holds it shared, so neither starts while the other runs.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use nix::mount::{mount, MsFlags};
use nix::unistd::chdir;

use crate::error::{Result, SwerveError};
use crate::mounts;

/// Whether the kernel has overlayfs (`/proc/filesystems` lists it). `SWERVE_NO_OVERLAY=1`
/// (environment, for tests) answers no, as a kernel without it would.
pub fn available() -> bool {
    if std::env::var_os("SWERVE_NO_OVERLAY").is_some_and(|v| v == "1") {
        return false;
    }
    std::fs::read_to_string("/proc/filesystems").is_ok_and(|s| {
        s.lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    })
}

/// An flock held on a directory for as long as this value lives (the kernel drops it when swerve
/// exits, however it exits).
#[derive(Debug)]
pub struct DirLock {
    _lock: Flock<File>,
}

/// Locks `dir` without waiting: shared, or exclusive; `what` names it in the error when another
/// sliver holds a conflicting lock.
pub fn lock_dir(dir: &Path, exclusive: bool, what: &str, reason: &str) -> Result<DirLock> {
    // O_CLOEXEC (std's default): the command never inherits it (PID 1 closes every fd anyway).
    let f = File::open(dir).map_err(|e| SwerveError::io("open", dir, e))?;
    let arg = if exclusive {
        FlockArg::LockExclusiveNonblock
    } else {
        FlockArg::LockSharedNonblock
    };
    match Flock::lock(f, arg) {
        Ok(lock) => Ok(DirLock { _lock: lock }),
        Err((_, Errno::EWOULDBLOCK)) => Err(SwerveError::InUse {
            what: what.to_string(),
            reason: reason.to_string(),
        }),
        Err((f, errno)) => Err(SwerveError::Step {
            step: format!("flock({}) (fd {})", dir.display(), f.as_raw_fd()),
            errno,
        }),
    }
}

/// Checks a `--upper DIR` (for clap, so a bad one is a usage error): an existing directory on a
/// nosuid,nodev mount, returned canonical. What the sliver leaves there (a setuid-root copy of a
/// shell, a device node made with `--cap CAP_MKNOD`) must do nothing on the host.
pub fn parse_upper(s: &str) -> std::result::Result<PathBuf, String> {
    let dir = std::fs::canonicalize(s).map_err(|e| format!("{s}: {e}"))?;
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let st = nix::sys::statvfs::statvfs(&dir).map_err(|e| format!("statvfs({s}): {e}"))?;
    let flags = st.flags();
    use nix::sys::statvfs::FsFlags;
    if !flags.contains(FsFlags::ST_NOSUID) || !flags.contains(FsFlags::ST_NODEV) {
        return Err(format!(
            "{} is not on a nosuid,nodev mount, so a setuid file or device node the sliver leaves \
             there would work on the host; mount one there first, e.g. \
             `mount -t tmpfs -o nosuid,nodev tmpfs {0}` or \
             `mount --bind {0} {0} && mount -o remount,bind,nosuid,nodev {0}`",
            dir.display()
        ));
    }
    Ok(dir)
}

/// The kept upper directory must be apart from the rootfs: inside it, the sliver's writes would
/// change the certified tree; around it, the upper would hold its own lower layer.
pub fn check_upper_apart(upper: &Path, rootfs: &Path) -> Result<()> {
    if upper.starts_with(rootfs) || rootfs.starts_with(upper) {
        return Err(SwerveError::BadArg {
            what: "--upper",
            value: upper.display().to_string(),
            reason: format!(
                "must lie outside the rootfs {} (and not contain it)",
                rootfs.display()
            ),
        });
    }
    Ok(())
}

fn step(what: impl Into<String>) -> impl FnOnce(Errno) -> SwerveError {
    let step = what.into();
    move |errno| SwerveError::Step { step, errno }
}

/// Creates directory `p`, or accepts one that is there: a real directory, never a symlink (a
/// kept `upper` pointing elsewhere would make that the layer the sliver writes).
fn mkdir(p: &Path) -> Result<()> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e)
            if e.kind() == std::io::ErrorKind::AlreadyExists
                && std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()) =>
        {
            Ok(())
        }
        Err(e) => Err(SwerveError::io("mkdir", p, e)),
    }
}

/// PID 1, in its private mount namespace: mounts an overlay over `root` whose lower layer is the
/// certified tree and whose upper layer is a fresh tmpfs, or `upper` (kept: its `upper/` and
/// `work/` are created in it if absent). The staging mounts sit on `root/tmp` (a directory every
/// rootfs has) and are covered by the overlay, then detached with the old root; the overlay keeps
/// its own references to them. Paths reach overlayfs relative to the staging directory, so no
/// rootfs path (which may hold `,` or `:`) is ever parsed as a mount option.
pub fn mount_rootfs(root: &Path, upper: Option<&Path>, user_ns: bool) -> Result<()> {
    let none = None::<&str>;
    let stage = root.join("tmp");
    if !stage.is_dir() {
        return Err(SwerveError::StepOther {
            step: format!("overlay staging {}", stage.display()),
            reason: "the rootfs has no /tmp directory (scripts/make-rootfs.sh creates it)".into(),
        });
    }
    // 1. Staging tmpfs: seen only in this namespace, gone with it. nosuid+nodev: the upper layer
    //    lives here when nothing is kept.
    let nosuid_nodev = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(
        Some("tmpfs"),
        &stage,
        Some("tmpfs"),
        nosuid_nodev,
        Some("mode=0700"),
    )
    .map_err(step(format!(
        "mount(tmpfs, {}, MS_NOSUID|MS_NODEV)",
        stage.display()
    )))?;
    // 2. Lower: the certified tree, bound read-only (submounts of the rootfs are not layered).
    let lower = stage.join("lower");
    mkdir(&lower)?;
    mount(Some(root), &lower, none, MsFlags::MS_BIND, none).map_err(step(format!(
        "mount({}, {}, MS_BIND)",
        root.display(),
        lower.display()
    )))?;
    mounts::remount(&lower, MsFlags::MS_RDONLY | nosuid_nodev)?;
    // 3. Upper and work dirs: on the staging tmpfs, or in the kept directory bound nosuid+nodev.
    let (up, work) = match upper {
        None => ("upper", "work"),
        Some(dir) => {
            let keep = stage.join("keep");
            mkdir(&keep)?;
            mount(Some(dir), &keep, none, MsFlags::MS_BIND, none).map_err(step(format!(
                "mount({}, {}, MS_BIND)",
                dir.display(),
                keep.display()
            )))?;
            mounts::remount(&keep, nosuid_nodev)?;
            ("keep/upper", "keep/work")
        }
    };
    let up_dir = stage.join(up);
    mkdir(&up_dir)?;
    mkdir(&stage.join(work))?;
    // The merged root directory takes its owner and mode from the upper one: the rootfs's own.
    let meta = std::fs::metadata(root).map_err(|e| SwerveError::io("stat", root, e))?;
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        std::os::unix::fs::chown(&up_dir, Some(meta.uid()), Some(meta.gid()))
            .map_err(|e| SwerveError::io("chown", &up_dir, e))?;
        std::fs::set_permissions(
            &up_dir,
            std::fs::Permissions::from_mode(meta.mode() & 0o7777),
        )
        .map_err(|e| SwerveError::io("chmod", &up_dir, e))?;
    }
    // 4. The overlay over the rootfs path: everything after this (flags, /proc, pivot_root) sees
    //    the merged tree there.
    chdir(&stage).map_err(step(format!("chdir({})", stage.display())))?;
    let mut opts = format!("lowerdir=lower,upperdir={up},workdir={work}");
    if user_ns {
        // Linux 5.11+: overlayfs in a user namespace keeps its metadata in user.* xattrs.
        opts.push_str(",userxattr");
    }
    mount(
        Some("overlay"),
        root,
        Some("overlay"),
        nosuid_nodev,
        Some(opts.as_str()),
    )
    .map_err(|errno| {
        let step = format!(
            "mount(overlay, {}, MS_NOSUID|MS_NODEV, {opts})",
            root.display()
        );
        if user_ns && matches!(errno, Errno::EPERM | Errno::EINVAL) {
            // Before 5.11 overlayfs cannot be mounted in a user namespace (nor knows userxattr).
            SwerveError::StepOther {
                step,
                reason: format!("{errno}; as a non-root caller --rw needs overlayfs in user namespaces (Linux 5.11+)"),
            }
        } else {
            SwerveError::Step { step, errno }
        }
    })?;
    chdir("/").map_err(step("chdir(/)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upper_must_be_apart_from_the_rootfs() {
        let r = Path::new("/srv/root");
        assert!(check_upper_apart(Path::new("/srv/root/upper"), r).is_err());
        assert!(check_upper_apart(Path::new("/srv"), r).is_err());
        assert!(check_upper_apart(Path::new("/srv/root"), r).is_err());
        assert!(check_upper_apart(Path::new("/srv/upper"), r).is_ok());
        assert!(check_upper_apart(Path::new("/srv/rootx"), r).is_ok());
    }

    #[test]
    fn upper_must_exist() {
        assert!(parse_upper("/does/not/exist").is_err());
    }
}
