//! The BLAKE3 manifest of a rootfs: every path with its type, mode, owner, size, file hash and
//! symlink target, one canonical line per path, sorted. Its digest is what a certificate signs.
//!
//! Line format (fields separated by one space, paths and targets escaped so they hold no space):
//!
//! ```text
//! PATH KIND MODE UID GID DETAIL
//! /bin/busybox f 0755 0 0 2193376:5c1e...   regular file: size:blake3
//! /bin/sh l 0777 0 0 ->busybox              symlink: ->target
//! /dev/null c 0666 0 0 1:3                  char/block device: major:minor
//! /etc d 0755 0 0 -                         directory, fifo, socket: -
//! ```
//!
//! PATH is relative to the rootfs and starts with `/` (the rootfs itself is `/`). Bytes `<= 0x20`,
//! `>= 0x7f` and `%` are written `%XX`, so lines sort exactly as their paths and never contain
//! a space inside a field. Directories on another filesystem than the rootfs (a stray mount) are
//! recorded but not descended into.

use std::fs::{self, File, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{Result, SwerveError};

/// Show a progress bar when the files to hash add up to more than this many bytes.
const PROGRESS_BYTES: u64 = 64 << 20;

/// A rootfs manifest: canonical lines, sorted by path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    /// One canonical line per path, sorted.
    pub lines: Vec<String>,
    /// Sum of regular file sizes in bytes.
    pub total_bytes: u64,
}

/// One path found while walking, before hashing.
struct Found {
    rel: String,
    abs: PathBuf,
    meta: Metadata,
}

impl Manifest {
    /// Walks and hashes `root`. Shows a progress bar on stderr (when it is a terminal) if the
    /// files add up to more than 64 MiB.
    pub fn build(root: &Path) -> Result<Manifest> {
        let started = Instant::now();
        let root_meta = fs::symlink_metadata(root).map_err(|e| SwerveError::io("stat", root, e))?;
        if !root_meta.is_dir() {
            return Err(SwerveError::io(
                "rootfs",
                root,
                std::io::Error::new(std::io::ErrorKind::NotADirectory, "not a directory"),
            ));
        }
        let mut found = Vec::new();
        walk(root, "", root_meta.dev(), &mut found, root_meta)?;
        found.sort_by(|a, b| a.rel.cmp(&b.rel));
        let total_bytes: u64 = found
            .iter()
            .filter(|f| f.meta.is_file())
            .map(|f| f.meta.len())
            .sum();

        let bar = if total_bytes > PROGRESS_BYTES {
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(total_bytes),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "hashing rootfs {bar:30} {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            ) {
                bar.set_style(style);
            }
            Some(bar)
        } else {
            None
        };

        let mut lines = Vec::with_capacity(found.len());
        let mut buf = vec![0u8; 1 << 16];
        for f in &found {
            lines.push(line_for(f, &mut buf, bar.as_ref())?);
        }
        if let Some(bar) = bar {
            bar.finish_and_clear();
        }
        tracing::info!(
            entries = lines.len(),
            bytes = total_bytes,
            ms = started.elapsed().as_millis() as u64,
            "hashed rootfs {}",
            root.display()
        );
        Ok(Manifest { lines, total_bytes })
    }

    /// The BLAKE3 digest of the manifest: lines joined with `\n`, each line terminated.
    pub fn digest(&self) -> blake3::Hash {
        digest_lines(&self.lines)
    }

    /// The first path at which `self` (the rootfs now) differs from `certified`, with a short
    /// description of the change; `None` when they are identical.
    pub fn first_difference(&self, certified: &[String]) -> Option<(String, String)> {
        let (mut i, mut j) = (0, 0);
        let now = &self.lines;
        while i < now.len() || j < certified.len() {
            match (now.get(i), certified.get(j)) {
                (Some(a), Some(b)) if a == b => {
                    i += 1;
                    j += 1;
                }
                (Some(a), Some(b)) => {
                    let (pa, pb) = (path_of(a), path_of(b));
                    return Some(match pa.cmp(pb) {
                        std::cmp::Ordering::Equal => (unescape_display(pa), describe_change(a, b)),
                        std::cmp::Ordering::Less => {
                            (unescape_display(pa), "added, not in the certificate".into())
                        }
                        std::cmp::Ordering::Greater => {
                            (unescape_display(pb), "missing from the rootfs".into())
                        }
                    });
                }
                (Some(a), None) => {
                    return Some((
                        unescape_display(path_of(a)),
                        "added, not in the certificate".into(),
                    ))
                }
                (None, Some(b)) => {
                    return Some((
                        unescape_display(path_of(b)),
                        "missing from the rootfs".into(),
                    ))
                }
                (None, None) => unreachable!("loop condition"),
            }
        }
        None
    }
}

/// The digest of canonical manifest lines (see [`Manifest::digest`]).
pub fn digest_lines(lines: &[String]) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    for l in lines {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    h.finalize()
}

/// The (escaped) path field of a canonical line.
fn path_of(line: &str) -> &str {
    line.split(' ').next().unwrap_or(line)
}

/// Says which fields differ between two lines for the same path.
fn describe_change(now: &str, was: &str) -> String {
    const NAMES: [&str; 6] = ["path", "type", "mode", "uid", "gid", "content"];
    let a: Vec<&str> = now.split(' ').collect();
    let b: Vec<&str> = was.split(' ').collect();
    let changed: Vec<String> = NAMES
        .iter()
        .enumerate()
        .filter(|(k, _)| a.get(*k) != b.get(*k))
        .map(|(k, name)| {
            format!(
                "{name} {} -> {}",
                b.get(k).unwrap_or(&"?"),
                a.get(k).unwrap_or(&"?")
            )
        })
        .collect();
    format!("changed: {}", changed.join(", "))
}

fn walk(abs: &Path, rel: &str, root_dev: u64, out: &mut Vec<Found>, meta: Metadata) -> Result<()> {
    let is_dir = meta.is_dir();
    let other_fs = meta.dev() != root_dev;
    out.push(Found {
        rel: if rel.is_empty() {
            "/".to_string()
        } else {
            rel.to_string()
        },
        abs: abs.to_path_buf(),
        meta,
    });
    if !is_dir {
        return Ok(());
    }
    if other_fs {
        tracing::warn!(
            "{}: another filesystem is mounted here; not descending",
            abs.display()
        );
        return Ok(());
    }
    let rd = fs::read_dir(abs).map_err(|e| SwerveError::io("read directory", abs, e))?;
    for ent in rd {
        let ent = ent.map_err(|e| SwerveError::io("read directory", abs, e))?;
        let name = ent.file_name();
        let child = ent.path();
        let child_rel = format!("{rel}/{}", escape(name.as_bytes()));
        let m = fs::symlink_metadata(&child).map_err(|e| SwerveError::io("stat", &child, e))?;
        walk(&child, &child_rel, root_dev, out, m)?;
    }
    Ok(())
}

fn line_for(f: &Found, buf: &mut [u8], bar: Option<&indicatif::ProgressBar>) -> Result<String> {
    let m = &f.meta;
    let ft = m.file_type();
    use std::os::unix::fs::FileTypeExt;
    let (kind, detail) = if ft.is_file() {
        let mut file = File::options()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&f.abs)
            .map_err(|e| SwerveError::io("open", &f.abs, e))?;
        let mut h = blake3::Hasher::new();
        let mut n: u64 = 0;
        loop {
            let k = file
                .read(buf)
                .map_err(|e| SwerveError::io("hash", &f.abs, e))?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            n += k as u64;
            if let Some(bar) = bar {
                bar.inc(k as u64);
            }
        }
        ('f', format!("{n}:{}", h.finalize().to_hex()))
    } else if ft.is_symlink() {
        let t = fs::read_link(&f.abs).map_err(|e| SwerveError::io("readlink", &f.abs, e))?;
        ('l', format!("->{}", escape(t.as_os_str().as_bytes())))
    } else if ft.is_dir() {
        ('d', "-".to_string())
    } else if ft.is_char_device() || ft.is_block_device() {
        let rdev = m.rdev();
        let kind = if ft.is_char_device() { 'c' } else { 'b' };
        (kind, format!("{}:{}", libc::major(rdev), libc::minor(rdev)))
    } else if ft.is_fifo() {
        ('p', "-".to_string())
    } else {
        ('s', "-".to_string())
    };
    Ok(format!(
        "{} {kind} {:04o} {} {} {detail}",
        f.rel,
        m.mode() & 0o7777,
        m.uid(),
        m.gid()
    ))
}

/// Escapes bytes `<= 0x20`, `>= 0x7f` and `%` as `%XX`.
pub fn escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for &b in bytes {
        if b <= 0x20 || b >= 0x7f || b == b'%' {
            s.push_str(&format!("%{b:02X}"));
        } else {
            s.push(b as char);
        }
    }
    s
}

/// Undoes [`escape`] for display (lossy for bytes that are not UTF-8).
fn unescape_display(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Some(v) = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, PermissionsExt};

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path();
        fs::create_dir_all(p.join("bin")).unwrap();
        fs::create_dir_all(p.join("etc")).unwrap();
        fs::write(p.join("bin/busybox"), b"pretend busybox").unwrap();
        symlink("busybox", p.join("bin/sh")).unwrap();
        fs::write(p.join("etc/os-release"), b"ID=test\n").unwrap();
        fs::write(p.join("etc/with space"), b"x").unwrap();
        d
    }

    #[test]
    fn manifest_is_deterministic_and_sorted() {
        let d = tree();
        let a = Manifest::build(d.path()).unwrap();
        let b = Manifest::build(d.path()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.digest(), b.digest());
        let mut sorted = a.lines.clone();
        sorted.sort();
        assert_eq!(a.lines, sorted);
        assert_eq!(a.lines[0].split(' ').next(), Some("/"));
        assert!(a
            .lines
            .iter()
            .any(|l| l.starts_with("/bin/sh l 0777 ") && l.ends_with("->busybox")));
        assert!(a
            .lines
            .iter()
            .any(|l| l.starts_with("/etc/with%20space f ")));
        assert_eq!(a.lines.len(), 7);
        assert_eq!(a.total_bytes, 15 + 8 + 1);
    }

    #[test]
    fn content_change_names_the_path() {
        let d = tree();
        let before = Manifest::build(d.path()).unwrap();
        fs::write(d.path().join("etc/os-release"), b"ID=evil\n").unwrap();
        let after = Manifest::build(d.path()).unwrap();
        assert_ne!(before.digest(), after.digest());
        let (path, change) = after.first_difference(&before.lines).unwrap();
        assert_eq!(path, "/etc/os-release");
        assert!(change.contains("content"), "{change}");
    }

    #[test]
    fn mode_symlink_added_and_removed_are_detected() {
        let d = tree();
        let base = Manifest::build(d.path()).unwrap();

        fs::set_permissions(
            d.path().join("bin/busybox"),
            fs::Permissions::from_mode(0o4755),
        )
        .unwrap();
        let m = Manifest::build(d.path()).unwrap();
        let (p, c) = m.first_difference(&base.lines).unwrap();
        assert_eq!(p, "/bin/busybox");
        assert!(c.contains("mode 0644 -> 4755"), "{c}");
        fs::set_permissions(
            d.path().join("bin/busybox"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        assert_eq!(
            Manifest::build(d.path())
                .unwrap()
                .first_difference(&base.lines),
            None
        );

        fs::remove_file(d.path().join("bin/sh")).unwrap();
        symlink("/evil", d.path().join("bin/sh")).unwrap();
        let (p, _) = Manifest::build(d.path())
            .unwrap()
            .first_difference(&base.lines)
            .unwrap();
        assert_eq!(p, "/bin/sh");
        fs::remove_file(d.path().join("bin/sh")).unwrap();
        let (p, c) = Manifest::build(d.path())
            .unwrap()
            .first_difference(&base.lines)
            .unwrap();
        assert_eq!(
            (p.as_str(), c.as_str()),
            ("/bin/sh", "missing from the rootfs")
        );
        symlink("busybox", d.path().join("bin/sh")).unwrap();

        fs::write(d.path().join("bin/aaa"), b"new").unwrap();
        let (p, c) = Manifest::build(d.path())
            .unwrap()
            .first_difference(&base.lines)
            .unwrap();
        assert_eq!(
            (p.as_str(), c.as_str()),
            ("/bin/aaa", "added, not in the certificate")
        );
    }

    #[test]
    fn escape_round_trips_for_display() {
        assert_eq!(escape(b"a b%c\n"), "a%20b%25c%0A");
        assert_eq!(unescape_display("a%20b%25c%0A"), "a b%c\n");
    }
}
