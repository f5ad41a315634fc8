//! The sliver's mounts: read-only /proc paths and masked paths. Flags for a whole tree
//! (`mount_setattr` or the remount-each fallback) and mountinfo parsing live in the
//! `mount-tree` crate, which monster-guard uses too.

use std::path::Path;

use nix::mount::{mount, MsFlags};

pub use mount_tree::Attrs;

use crate::error::{Result, SwerveError};

/// Sets `attrs` on the mount at `path` and every mount under it (`mount_tree::set_recursive`).
pub fn set_recursive(path: &Path, attrs: Attrs, fallback: bool) -> Result<()> {
    Ok(mount_tree::set_recursive(path, attrs, fallback)?)
}

/// `MS_REMOUNT|MS_BIND|flags` on the mount at `path`, keeping the flags it already has.
pub fn remount(path: &Path, flags: MsFlags) -> Result<()> {
    Ok(mount_tree::remount(path, flags)?)
}

/// Makes `path` read-only: binds it onto itself, then sets RDONLY on that bind and every mount
/// under it. An absent path is skipped (returns false).
pub fn read_only(path: &Path, fallback: bool) -> Result<bool> {
    if std::fs::symlink_metadata(path).is_err() {
        return Ok(false);
    }
    mount_tree::bind_read_only(path, fallback)?;
    Ok(true)
}

/// Hides `path`: a directory gets an empty read-only tmpfs, anything else a read-only bind of
/// `null` (the host's /dev/null: reads nothing, writes fail). An absent path is skipped
/// (returns false).
pub fn mask(path: &Path, null: &Path) -> Result<bool> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(false);
    };
    if meta.is_dir() {
        let fl = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("tmpfs"), path, Some("tmpfs"), fl, Some("mode=0555")).map_err(|errno| {
            SwerveError::Step {
                step: format!("mount(tmpfs, {}, MS_RDONLY)", path.display()),
                errno,
            }
        })?;
    } else {
        mount(
            Some(null),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|errno| SwerveError::Step {
            step: format!("mount({}, {}, MS_BIND)", null.display(), path.display()),
            errno,
        })?;
        remount(path, MsFlags::MS_RDONLY)?;
    }
    Ok(true)
}
