//! Mount flags that must hold for a whole tree: read-only, nosuid and nodev on a mount and on
//! every mount under it. The home of `/proc/self/mountinfo` parsing; swerve (slivers) and
//! monster-guard (the reaper's read-only view) both use it.
//!
//! Recursive flags use `mount_setattr(AT_RECURSIVE)` (Linux 5.12+, one atomic call for the whole
//! tree); on older kernels (the R1 runs 4.19) each mount found under the path in
//! `/proc/self/mountinfo` is remounted `MS_REMOUNT|MS_BIND` with the flags, keeping the ones the
//! kernel locks (nosuid, nodev, noexec, atime flags it already has). A mount under the path that
//! is hidden under another mount (or gone) is not reachable by path and is skipped.

use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::mount::{mount, MsFlags};

/// A mount step that failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A system call failed.
    #[error("{step}: {errno}")]
    Step { step: String, errno: Errno },
    /// Anything else (a path with a NUL byte, an unreadable mountinfo, no such mount).
    #[error("{step}: {reason}")]
    Other { step: String, reason: String },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, MountError>;

/// Flags to set on a mount tree (never cleared: a flag already set stays).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Attrs {
    /// Read-only.
    pub rdonly: bool,
    /// setuid/setgid bits and file capabilities are ignored on exec.
    pub nosuid: bool,
    /// Device nodes cannot be opened.
    pub nodev: bool,
}

impl Attrs {
    /// The `MOUNT_ATTR_*` bits of `mount_setattr(2)`.
    pub fn mount_attr_bits(self) -> u64 {
        // linux/mount.h: MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV.
        let mut b = 0;
        if self.rdonly {
            b |= 0x1;
        }
        if self.nosuid {
            b |= 0x2;
        }
        if self.nodev {
            b |= 0x4;
        }
        b
    }

    /// The `MS_*` flags of a remount.
    pub fn ms_flags(self) -> MsFlags {
        let mut f = MsFlags::empty();
        if self.rdonly {
            f |= MsFlags::MS_RDONLY;
        }
        if self.nosuid {
            f |= MsFlags::MS_NOSUID;
        }
        if self.nodev {
            f |= MsFlags::MS_NODEV;
        }
        f
    }

    /// `RDONLY|NOSUID`, for messages.
    pub fn names(self) -> String {
        let mut v = Vec::new();
        for (on, n) in [
            (self.rdonly, "RDONLY"),
            (self.nosuid, "NOSUID"),
            (self.nodev, "NODEV"),
        ] {
            if on {
                v.push(n);
            }
        }
        v.join("|")
    }
}

/// `struct mount_attr` of linux/mount.h (MOUNT_ATTR_SIZE_VER0).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| MountError::Other {
        step: format!("path {}", p.display()),
        reason: "contains a NUL byte".into(),
    })
}

/// Sets `attrs` on the mount at `path` and every mount under it. `fallback` forces the
/// remount-each path (as on kernels without mount_setattr) so tests can cover it.
pub fn set_recursive(path: &Path, attrs: Attrs, fallback: bool) -> Result<()> {
    if !fallback {
        let c = cpath(path)?;
        let attr = MountAttr {
            attr_set: attrs.mount_attr_bits(),
            attr_clr: 0,
            propagation: 0,
            userns_fd: 0,
        };
        // SAFETY: mount_setattr reads `size_of::<MountAttr>()` bytes from `attr`, which we own;
        // `c` is a NUL-terminated path.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::AT_RECURSIVE as libc::c_uint,
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        match Errno::result(r) {
            Ok(_) => return Ok(()),
            Err(Errno::ENOSYS) => {
                tracing::debug!("mount_setattr: ENOSYS; remounting each mount instead");
            }
            Err(errno) => {
                return Err(MountError::Step {
                    step: format!(
                        "mount_setattr({}, AT_RECURSIVE, {})",
                        path.display(),
                        attrs.names()
                    ),
                    errno,
                })
            }
        }
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| MountError::Other {
        step: "read /proc/self/mountinfo".into(),
        reason: e.to_string(),
    })?;
    let under = mounts_under(&info, path);
    if under.is_empty() {
        return Err(MountError::Other {
            step: format!("remount {} {}", path.display(), attrs.names()),
            reason: "not a mount point (missing from /proc/self/mountinfo)".into(),
        });
    }
    for m in under {
        match remount(&m, attrs.ms_flags()) {
            // Hidden under another mount, or gone: not reachable by path either.
            Err(MountError::Step {
                errno: Errno::ENOENT | Errno::EINVAL,
                ..
            }) if m != path => {}
            r => r?,
        }
    }
    Ok(())
}

/// Makes the tree at `path` read-only where it stands: binds `path` onto itself (so it is a
/// mount of its own even when it was only a directory of a larger one), then sets RDONLY on
/// that bind and every mount under it ([`set_recursive`]).
pub fn bind_read_only(path: &Path, fallback: bool) -> Result<()> {
    mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|errno| MountError::Step {
        step: format!("mount({0}, {0}, MS_BIND|MS_REC)", path.display()),
        errno,
    })?;
    let rdonly = Attrs {
        rdonly: true,
        ..Attrs::default()
    };
    set_recursive(path, rdonly, fallback)
}

/// `MS_REMOUNT|MS_BIND|flags` on the mount at `path`, keeping the flags it already has.
pub fn remount(path: &Path, flags: MsFlags) -> Result<()> {
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags | current_flags(path);
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(|errno| MountError::Step {
        step: format!("mount({}, MS_REMOUNT|MS_BIND|{flags:?})", path.display()),
        errno,
    })
}

/// The per-mount flags `path` has now (a remount that left them out would clear them, and the
/// kernel refuses to clear the locked ones in a user namespace).
fn current_flags(path: &Path) -> MsFlags {
    let Ok(c) = cpath(path) else {
        return MsFlags::empty();
    };
    // SAFETY: statvfs is plain integers: all zeroes is a valid value.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs fills the struct we own; c is a valid NUL-terminated path.
    if unsafe { libc::statvfs(c.as_ptr(), &mut sv) } != 0 {
        return MsFlags::empty();
    }
    // musl's libc crate lacks ST_RELATIME; the kernel's value (statvfs.h) is the same on both.
    const ST_RELATIME: libc::c_ulong = 0x1000;
    let mut f = MsFlags::empty();
    for (st, ms) in [
        (libc::ST_RDONLY, MsFlags::MS_RDONLY),
        (libc::ST_NOSUID, MsFlags::MS_NOSUID),
        (libc::ST_NODEV, MsFlags::MS_NODEV),
        (libc::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (libc::ST_NOATIME, MsFlags::MS_NOATIME),
        (libc::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if sv.f_flag & st != 0 {
            f |= ms;
        }
    }
    f
}

/// Mount points in `mountinfo` (the text of /proc/self/mountinfo) equal to `path` or under it,
/// in mount order (parents before the mounts on top of them).
pub fn mounts_under(mountinfo: &str, path: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for line in mountinfo.lines() {
        // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS ...
        let Some(mp) = line.split(' ').nth(4) else {
            continue;
        };
        let mp = PathBuf::from(OsString::from_vec(unescape(mp)));
        if mp.starts_with(path) && !v.contains(&mp) {
            v.push(mp);
        }
    }
    v
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134` backslash).
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lists_the_tree_under_a_path() {
        let info = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
50 27 0:40 / /srv/root rw - ext4 /dev/vda rw
51 50 0:41 / /srv/root/dev rw - tmpfs tmpfs rw
52 51 0:42 / /srv/root/dev/shm rw - tmpfs tmpfs rw
53 27 0:43 / /srv/rootfs rw - tmpfs tmpfs rw
54 50 0:44 / /srv/root/my\\040dir rw - tmpfs tmpfs rw
55 50 0:45 / /srv/root/dev rw - tmpfs tmpfs rw
";
        let got = mounts_under(info, Path::new("/srv/root"));
        assert_eq!(
            got,
            [
                "/srv/root",
                "/srv/root/dev",
                "/srv/root/dev/shm",
                "/srv/root/my dir"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            mounts_under(info, Path::new("/srv/nothing")),
            Vec::<PathBuf>::new()
        );
        assert_eq!(unescape("a\\134b\\011"), b"a\\b\t");
        assert_eq!(unescape("trailing\\04"), b"trailing\\04");
    }

    #[test]
    fn attrs_map_to_both_interfaces() {
        let a = Attrs {
            rdonly: true,
            nosuid: true,
            nodev: false,
        };
        assert_eq!(a.mount_attr_bits(), 0x3);
        assert_eq!(a.ms_flags(), MsFlags::MS_RDONLY | MsFlags::MS_NOSUID);
        assert_eq!(a.names(), "RDONLY|NOSUID");
    }
}
