//! The node identity: one ed25519 key pair that signs grants and the revocation list.

use ed25519_dalek::{SigningKey, VerifyingKey};

use crate::error::{GuardError, Result};
use crate::fsutil::{self, Home};

/// Creates the node key (`node.key`, 0600) and public key (`node.pub`) under `home`.
///
/// Refuses to replace an existing key unless `force`: every grant signed by the old key
/// stops verifying once it is replaced.
pub fn init(home: &Home, force: bool) -> Result<VerifyingKey> {
    let key_path = home.key_path();
    if key_path.exists() && !force {
        return Err(GuardError::KeyExists(key_path));
    }
    fsutil::private_dir(&home.dir)?;
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    fsutil::write_atomic(
        &key_path,
        format!("{}\n", hex(key.as_bytes())).as_bytes(),
        0o600,
    )?;
    let public = key.verifying_key();
    fsutil::write_atomic(
        &home.pub_path(),
        format!("{}\n", hex(public.as_bytes())).as_bytes(),
        0o644,
    )?;
    tracing::info!(path = %key_path.display(), "node key created");
    Ok(public)
}

/// Loads the node's secret key, refusing a key file that other users could read.
pub fn load_signing(home: &Home) -> Result<SigningKey> {
    let path = home.key_path();
    if !path.exists() {
        return Err(GuardError::NoKey(path));
    }
    fsutil::check_private(&path)?;
    let text = fsutil::read(&path)?;
    let bytes = parse_hex32(&text).map_err(|reason| GuardError::BadKey {
        path: path.clone(),
        reason,
    })?;
    Ok(SigningKey::from_bytes(&bytes))
}

/// Loads a public key file (64 hex digits, as `pubkey export` writes it).
pub fn load_public(path: &std::path::Path) -> Result<VerifyingKey> {
    if !path.exists() {
        return Err(GuardError::NoKey(path.to_path_buf()));
    }
    let text = fsutil::read(path)?;
    parse_public(&text).map_err(|reason| GuardError::BadKey {
        path: path.to_path_buf(),
        reason,
    })
}

/// Parses a hex public key.
pub fn parse_public(text: &[u8]) -> std::result::Result<VerifyingKey, String> {
    let s = std::str::from_utf8(text).map_err(|_| "not UTF-8".to_string())?;
    aeon_grant::encoding::parse_public(s)
}

fn parse_hex32(text: &[u8]) -> std::result::Result<[u8; 32], String> {
    let s = std::str::from_utf8(text)
        .map_err(|_| "not UTF-8".to_string())?
        .trim();
    aeon_grant::encoding::unhex_array(s)
        .ok_or_else(|| "expected 64 lowercase hex digits (32 bytes)".to_string())
}

pub use aeon_grant::encoding::{hex, unhex};

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn init_refuses_overwrite_and_keys_round_trip() {
        let d = tempfile::tempdir().unwrap();
        let home = Home {
            dir: d.path().join("h"),
        };
        let public = init(&home, false).unwrap();
        assert!(matches!(init(&home, false), Err(GuardError::KeyExists(_))));
        let mode = std::fs::metadata(home.key_path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        let dmode = std::fs::metadata(&home.dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(dmode, 0o700);
        assert_eq!(load_signing(&home).unwrap().verifying_key(), public);
        assert_eq!(load_public(&home.pub_path()).unwrap(), public);
        let again = init(&home, true).unwrap();
        assert_ne!(again, public);
    }

    #[test]
    fn hex_round_trip_and_rejects() {
        assert_eq!(
            unhex(&hex(&[0, 1, 254, 255])).unwrap(),
            vec![0, 1, 254, 255]
        );
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
        assert!(unhex("AB").is_none());
    }
}
