//! Private, atomic file writes and the state directory layout.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{GuardError, Result};

/// Where monster-guard keeps its state: `$MONSTER_GUARD_HOME`, else `~/.monster-guard`.
///
/// Layout: `node.key` (ed25519 secret, hex, 0600), `node.pub` (public key, hex),
/// `grants/NAME.json` (0600), `revoked.json` (signed revocation list, 0600), `probes/` (the
/// probes a qspec may name, put there by the administrator). Directories 0700.
#[derive(Clone, Debug)]
pub struct Home {
    /// The state directory.
    pub dir: PathBuf,
}

impl Home {
    /// Resolves the state directory from the environment (does not create it).
    pub fn from_env() -> Result<Home> {
        if let Some(d) = std::env::var_os("MONSTER_GUARD_HOME").filter(|d| !d.is_empty()) {
            return Ok(Home {
                dir: PathBuf::from(d),
            });
        }
        let home = std::env::var_os("HOME")
            .filter(|h| !h.is_empty())
            .ok_or_else(|| {
                GuardError::Invalid("neither MONSTER_GUARD_HOME nor HOME is set".into())
            })?;
        Ok(Home {
            dir: PathBuf::from(home).join(".monster-guard"),
        })
    }

    /// The node's secret key file.
    pub fn key_path(&self) -> PathBuf {
        self.dir.join("node.key")
    }
    /// The node's public key file.
    pub fn pub_path(&self) -> PathBuf {
        self.dir.join("node.pub")
    }
    /// The grants directory.
    pub fn grants_dir(&self) -> PathBuf {
        self.dir.join("grants")
    }
    /// The stored grant of `name`.
    pub fn grant_path(&self, name: &str) -> PathBuf {
        self.grants_dir().join(format!("{name}.json"))
    }
    /// The probes allowlist: programs the administrator put here may judge models by name.
    pub fn probes_dir(&self) -> PathBuf {
        self.dir.join("probes")
    }
    /// The signed revocation list.
    pub fn revoked_path(&self) -> PathBuf {
        self.dir.join("revoked.json")
    }
}

/// Creates `dir` (and parents) and forces its mode to 0700.
pub fn private_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| GuardError::io("create directory", dir, e))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
        .map_err(|e| GuardError::io("chmod 700", dir, e))
}

/// Writes `bytes` to `path` atomically with `mode`: a fresh temporary file in the same
/// directory (created with `mode`, never wider), fsync, rename over `path`, fsync the directory.
/// A reader sees the old file or the new one, never a torn one.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{base}.tmp.{}.{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| GuardError::io("create", &tmp, e))?;
        // The umask may have narrowed the mode; set it exactly.
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| GuardError::io("chmod", &tmp, e))?;
        f.write_all(bytes)
            .map_err(|e| GuardError::io("write", &tmp, e))?;
        f.sync_all().map_err(|e| GuardError::io("fsync", &tmp, e))?;
        fs::rename(&tmp, path).map_err(|e| GuardError::io("rename into", path, e))?;
        if let Ok(d) = File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads a file, naming it in the error.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    fs::read(path).map_err(|e| GuardError::io("read", path, e))
}

/// Refuses a secret file that group or others can read or write.
pub fn check_private(path: &Path) -> Result<()> {
    let meta = fs::metadata(path).map_err(|e| GuardError::io("stat", path, e))?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(GuardError::InsecureMode {
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// BLAKE3 of a whole file, streamed (lowercase hex): the grant's model binding, defined once
/// in [`aeon_grant::model_file_hash`] so the station compares the same thing.
pub fn hash_file(path: &Path) -> Result<String> {
    aeon_grant::model_file_hash(path).map_err(|e| GuardError::io("hash", path, e))
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_is_private_and_replaces() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        check_private(&p).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            check_private(&p),
            Err(GuardError::InsecureMode { .. })
        ));
        // No temporary files left behind.
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
