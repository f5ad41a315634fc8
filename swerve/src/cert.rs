//! Admission certificates ("braid certs"): a rootfs manifest signed with the node's ed25519 key.
//!
//! Key: `$MONSTER_GUARD_HOME/node.key` when that variable is set and the file exists (shared with
//! monster-guard, never created by swerve), else `$SWERVE_HOME/node.key` (default
//! `~/.swerve/node.key`), created on first use with mode 0600. The file holds the 32-byte ed25519
//! secret seed, either raw (32 bytes) or as 64 hex digits (whitespace around them is ignored).
//!
//! Certificates live in `$SWERVE_HOME/certs/NAME.json` and are written atomically.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::error::{Result, SwerveError};
use crate::manifest::{digest_lines, Manifest};

/// Domain separation tag of the signed payload.
const CERT_TAG: &str = "swerve-cert-v1";

/// `$SWERVE_HOME`, default `~/.swerve`.
pub fn swerve_home() -> PathBuf {
    if let Some(h) = std::env::var_os("SWERVE_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".swerve")
}

/// Checks `base:NAME` (or a bare `NAME`) and returns NAME.
pub fn parse_base(s: &str) -> Result<String> {
    let name = s.strip_prefix("base:").unwrap_or(s);
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(name.to_string())
    } else {
        Err(SwerveError::BadBaseName(s.to_string()))
    }
}

/// The node's signing key and where it came from.
pub struct NodeKey {
    key: SigningKey,
    /// The file the key was read from.
    pub path: PathBuf,
}

impl NodeKey {
    /// Loads the node key (monster-guard's if present, else swerve's own, created if missing).
    pub fn load_or_create(swerve_home: &Path) -> Result<NodeKey> {
        if let Some(mg) = std::env::var_os("MONSTER_GUARD_HOME").filter(|h| !h.is_empty()) {
            let p = PathBuf::from(mg).join("node.key");
            if p.exists() {
                return NodeKey::load(&p);
            }
        }
        let p = swerve_home.join("node.key");
        if p.exists() {
            return NodeKey::load(&p);
        }
        let key = SigningKey::generate(&mut rand::rngs::OsRng);
        create_private_dir(swerve_home)?;
        write_atomic(
            &p,
            format!("{}\n", hex::encode(key.as_bytes())).as_bytes(),
            0o600,
        )?;
        tracing::info!("created node key {}", p.display());
        Ok(NodeKey { key, path: p })
    }

    /// Reads a key file (raw 32 bytes or 64 hex digits).
    pub fn load(path: &Path) -> Result<NodeKey> {
        let bytes = fs::read(path).map_err(|e| SwerveError::io("read", path, e))?;
        let seed: [u8; 32] = if bytes.len() == 32 {
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| bad_key(path, "length"))?
        } else {
            let text = std::str::from_utf8(&bytes).map_err(|_| bad_key(path, "not hex"))?;
            let v = hex::decode(text.trim())
                .ok()
                .ok_or_else(|| bad_key(path, "expected 64 hex digits"))?;
            v.as_slice()
                .try_into()
                .map_err(|_| bad_key(path, "expected 32 bytes (64 hex digits)"))?
        };
        if let Ok(m) = fs::metadata(path) {
            if m.permissions().mode() & 0o077 != 0 {
                tracing::warn!(
                    "node key {} is readable by others (mode {:o})",
                    path.display(),
                    m.permissions().mode() & 0o777
                );
            }
        }
        Ok(NodeKey {
            key: SigningKey::from_bytes(&seed),
            path: path.to_path_buf(),
        })
    }

    /// A key from a fixed seed (tests).
    pub fn from_seed(seed: [u8; 32]) -> NodeKey {
        NodeKey {
            key: SigningKey::from_bytes(&seed),
            path: PathBuf::new(),
        }
    }

    /// The public key, hex.
    pub fn public_hex(&self) -> String {
        hex::encode(self.key.verifying_key().as_bytes())
    }
}

fn bad_key(path: &Path, reason: &str) -> SwerveError {
    SwerveError::BadKey {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// A signed admission certificate for one base.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Certificate {
    /// Format version (1).
    pub version: u32,
    /// The base name (without `base:`).
    pub base: String,
    /// The rootfs directory at admission (absolute); `cline` uses it when `--rootfs` is omitted.
    pub rootfs: PathBuf,
    /// Seconds since the epoch at admission.
    pub created_unix: u64,
    /// Number of manifest lines.
    pub entries: u64,
    /// Sum of regular file sizes.
    pub total_bytes: u64,
    /// BLAKE3 of the manifest lines, hex.
    pub manifest_blake3: String,
    /// The signer's ed25519 public key, hex.
    pub public_key: String,
    /// ed25519 signature over [`Certificate::payload`], hex.
    pub signature: String,
    /// The manifest itself, so that a mismatch can name the first differing path.
    pub manifest: Vec<String>,
}

impl Certificate {
    /// Signs `manifest` of `rootfs` as base `base`.
    pub fn sign(base: &str, rootfs: &Path, manifest: &Manifest, key: &NodeKey) -> Certificate {
        let created_unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let mut c = Certificate {
            version: 1,
            base: base.to_string(),
            rootfs: rootfs.to_path_buf(),
            created_unix,
            entries: manifest.lines.len() as u64,
            total_bytes: manifest.total_bytes,
            manifest_blake3: manifest.digest().to_hex().to_string(),
            public_key: key.public_hex(),
            signature: String::new(),
            manifest: manifest.lines.clone(),
        };
        c.signature = hex::encode(key.key.sign(c.payload().as_bytes()).to_bytes());
        c
    }

    /// The exact bytes that are signed.
    pub fn payload(&self) -> String {
        format!(
            "{CERT_TAG}\nbase:{}\nrootfs:{}\nmanifest-blake3:{}\nentries:{}\ntotal-bytes:{}\ncreated:{}\n",
            self.base,
            self.rootfs.display(),
            self.manifest_blake3,
            self.entries,
            self.total_bytes,
            self.created_unix
        )
    }

    /// Checks that the certificate was signed by `node` and that its stored manifest is the one
    /// that was signed. Does not look at the rootfs.
    pub fn verify_signature(&self, node: &NodeKey) -> Result<()> {
        let fail = |reason: String| SwerveError::SignatureInvalid {
            base: self.base.clone(),
            reason,
        };
        if self.version != 1 {
            return Err(fail(format!("unknown version {}", self.version)));
        }
        if self.public_key != node.public_hex() {
            // The usual cause is a node key that moved (MONSTER_GUARD_HOME set or changed
            // since the admission), not tampering: say how to get back to a working base.
            return Err(fail(format!(
                "signed by key {}, not this node's key {} ({}); admitted under another node key \
                 (MONSTER_GUARD_HOME or SWERVE_HOME changed?): admit it again with \
                 `swerve admit base:{} --rootfs DIR`",
                short(&self.public_key),
                short(&node.public_hex()),
                node.path.display(),
                self.base
            )));
        }
        let sig_bytes: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| fail("signature is not 64 hex bytes".into()))?;
        let vk: VerifyingKey = node.key.verifying_key();
        vk.verify(
            self.payload().as_bytes(),
            &Signature::from_bytes(&sig_bytes),
        )
        .map_err(|_| fail("bad signature".into()))?;
        let stored = digest_lines(&self.manifest).to_hex().to_string();
        if stored != self.manifest_blake3 || self.manifest.len() as u64 != self.entries {
            return Err(fail("the stored manifest is not the signed one".into()));
        }
        Ok(())
    }

    /// Verifies the signature, then re-hashes `rootfs` and compares it with the certificate,
    /// naming the first differing path.
    pub fn verify_rootfs(&self, node: &NodeKey, rootfs: &Path) -> Result<Manifest> {
        self.verify_signature(node)?;
        let now = Manifest::build(rootfs)?;
        if now.digest().to_hex().as_str() == self.manifest_blake3 {
            return Ok(now);
        }
        let (path, change) = now
            .first_difference(&self.manifest)
            .unwrap_or_else(|| ("/".into(), "digest differs".into()));
        Err(SwerveError::RootfsMismatch {
            base: self.base.clone(),
            rootfs: rootfs.to_path_buf(),
            path,
            change,
        })
    }
}

/// The certificate store under `$SWERVE_HOME/certs`.
pub struct CertStore {
    dir: PathBuf,
}

impl CertStore {
    /// The store under `home`.
    pub fn new(home: &Path) -> CertStore {
        CertStore {
            dir: home.join("certs"),
        }
    }

    /// Path of base NAME's certificate.
    pub fn path(&self, base: &str) -> PathBuf {
        self.dir.join(format!("{base}.json"))
    }

    /// Writes (replaces) a certificate atomically.
    pub fn save(&self, cert: &Certificate) -> Result<PathBuf> {
        create_private_dir(&self.dir)?;
        let p = self.path(&cert.base);
        let json = serde_json::to_vec_pretty(cert).map_err(|e| SwerveError::BadCertificate {
            path: p.clone(),
            reason: e.to_string(),
        })?;
        write_atomic(&p, &json, 0o644)?;
        Ok(p)
    }

    /// Loads base NAME's certificate.
    pub fn load(&self, base: &str) -> Result<Certificate> {
        let p = self.path(base);
        let bytes = match fs::read(&p) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(SwerveError::NoCertificate {
                    base: base.to_string(),
                })
            }
            Err(e) => return Err(SwerveError::io("read", &p, e)),
        };
        let cert: Certificate =
            serde_json::from_slice(&bytes).map_err(|e| SwerveError::BadCertificate {
                path: p.clone(),
                reason: e.to_string(),
            })?;
        if cert.base != base {
            return Err(SwerveError::BadCertificate {
                path: p,
                reason: format!("holds base:{}, not base:{base}", cert.base),
            });
        }
        Ok(cert)
    }

    /// All certificate base names, sorted.
    pub fn list(&self) -> Result<Vec<String>> {
        let rd = match fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(SwerveError::io("read directory", &self.dir, e)),
        };
        let mut names = Vec::new();
        for ent in rd {
            let ent = ent.map_err(|e| SwerveError::io("read directory", &self.dir, e))?;
            let name = ent.file_name().to_string_lossy().into_owned();
            if let Some(base) = name.strip_suffix(".json") {
                if parse_base(base).is_ok() {
                    names.push(base.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }
}

fn create_private_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(|e| SwerveError::io("create directory", dir, e))?;
    Ok(())
}

/// Writes `bytes` to `path` via a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(|e| SwerveError::io("create", &tmp, e))?;
    f.write_all(bytes)
        .map_err(|e| SwerveError::io("write", &tmp, e))?;
    f.sync_all().map_err(|e| SwerveError::io("sync", &tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| SwerveError::io("rename into", path, e))?;
    Ok(())
}

fn short(h: &str) -> &str {
    h.get(..16).unwrap_or(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("etc")).unwrap();
        fs::write(d.path().join("etc/hostname"), b"sliver\n").unwrap();
        fs::write(d.path().join("init"), b"#!/bin/sh\n").unwrap();
        d
    }

    #[test]
    fn signed_cert_verifies_and_round_trips() {
        let d = rootfs();
        let key = NodeKey::from_seed([7; 32]);
        let m = Manifest::build(d.path()).unwrap();
        let cert = Certificate::sign("scratch", d.path(), &m, &key);
        cert.verify_signature(&key).unwrap();
        cert.verify_rootfs(&key, d.path()).unwrap();

        let home = tempfile::tempdir().unwrap();
        let store = CertStore::new(home.path());
        store.save(&cert).unwrap();
        assert_eq!(store.load("scratch").unwrap(), cert);
        assert_eq!(store.list().unwrap(), vec!["scratch".to_string()]);
        assert!(matches!(
            store.load("other"),
            Err(SwerveError::NoCertificate { .. })
        ));
    }

    #[test]
    fn tampered_rootfs_is_refused_naming_the_path() {
        let d = rootfs();
        let key = NodeKey::from_seed([7; 32]);
        let cert = Certificate::sign(
            "scratch",
            d.path(),
            &Manifest::build(d.path()).unwrap(),
            &key,
        );
        fs::write(d.path().join("etc/hostname"), b"evil\n").unwrap();
        match cert.verify_rootfs(&key, d.path()) {
            Err(SwerveError::RootfsMismatch { path, .. }) => assert_eq!(path, "/etc/hostname"),
            other => panic!("expected mismatch, got {other:?}"),
        }
    }

    #[test]
    fn forged_or_edited_certs_fail_the_signature_check() {
        let d = rootfs();
        let key = NodeKey::from_seed([7; 32]);
        let m = Manifest::build(d.path()).unwrap();
        let cert = Certificate::sign("scratch", d.path(), &m, &key);

        // Another key's certificate is not this node's.
        let other = NodeKey::from_seed([8; 32]);
        let foreign = Certificate::sign("scratch", d.path(), &m, &other);
        assert!(matches!(
            foreign.verify_signature(&key),
            Err(SwerveError::SignatureInvalid { .. })
        ));

        // Editing a signed field breaks the signature.
        let mut c = cert.clone();
        c.base = "prod".into();
        assert!(c.verify_signature(&key).is_err());

        // Re-pointing the manifest hash at a tampered tree breaks the signature.
        fs::write(d.path().join("init"), b"#!/bin/sh\nrm -rf /\n").unwrap();
        let mut c = cert.clone();
        let tampered = Manifest::build(d.path()).unwrap();
        c.manifest = tampered.lines.clone();
        c.manifest_blake3 = tampered.digest().to_hex().to_string();
        assert!(c.verify_signature(&key).is_err());

        // Editing only the stored manifest (to hide a change) is caught too.
        let mut c = cert.clone();
        c.manifest = tampered.lines;
        assert!(c.verify_signature(&key).is_err());

        // A flipped signature bit fails.
        let mut c = cert;
        let flip = if c.signature.starts_with('0') {
            "1"
        } else {
            "0"
        };
        c.signature.replace_range(0..1, flip);
        assert!(c.verify_signature(&key).is_err());
    }

    #[test]
    fn key_file_is_created_0600_and_reloaded() {
        let home = tempfile::tempdir().unwrap();
        // (Assumes MONSTER_GUARD_HOME is not pointing at a real key in the test environment.)
        let k1 = NodeKey::load_or_create(home.path()).unwrap();
        let mode = fs::metadata(home.path().join("node.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let k2 = NodeKey::load_or_create(home.path()).unwrap();
        assert_eq!(k1.public_hex(), k2.public_hex());
        fs::write(home.path().join("bad.key"), b"zz").unwrap();
        assert!(NodeKey::load(&home.path().join("bad.key")).is_err());
    }

    #[test]
    fn base_names_are_checked() {
        assert_eq!(parse_base("base:scratch").unwrap(), "scratch");
        assert_eq!(parse_base("alarm-2024.1").unwrap(), "alarm-2024.1");
        for bad in ["base:", "base:../x", "base:a/b", "base:.hidden", "base:a b"] {
            assert!(parse_base(bad).is_err(), "{bad}");
        }
    }
}
