//! Grants as monster-guard stores them. The format, its parser and its verifier live in
//! `aeon-grant` (one home, shared with the station's `--require-grant`); this module adds the
//! files: loading and saving grants, and the node's revocation list with its watermark in the
//! home (`revocation-seq/ISSUER`, the highest list sequence seen: an older copy of
//! `revoked.json` or a deleted one is refused once a newer one was seen).

use std::path::Path;

use ed25519_dalek::{SigningKey, VerifyingKey};

pub use aeon_grant::{
    attenuate, check_name, human_secs, short, Caps, GrantPayload, ProbeSummary, Revocation,
    RevocationList, SignedGrant, WatchedList, Watermark, CAPS,
};

use crate::error::Result;
use crate::fsutil::{self, Home};

/// Reads and parses a grant file, refusing anything but the canonical encoding.
pub fn load(path: &Path) -> Result<SignedGrant> {
    let bytes = fsutil::read(path)?;
    Ok(SignedGrant::from_bytes(
        &bytes,
        &path.display().to_string(),
    )?)
}

/// Writes the grant atomically with mode 0600.
pub fn save(g: &SignedGrant, path: &Path) -> Result<()> {
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !dir.exists() {
            fsutil::private_dir(dir)?;
        }
    }
    fsutil::write_atomic(path, &g.to_bytes(), 0o600)
}

/// The watermark of `issuer`'s revocation lists in this home.
pub fn watermark(home: &Home, issuer: &VerifyingKey) -> Watermark {
    Watermark::in_dir(&home.dir, issuer)
}

/// Loads the revocation list at `path` (signed by `issuer`), checked against and raising the
/// home's watermark: a missing list is empty only if none was ever seen.
pub fn load_revocations(home: &Home, path: &Path, issuer: &VerifyingKey) -> Result<RevocationList> {
    let w = watermark(home, issuer);
    Ok(aeon_grant::load_list(path, issuer, Some(&w))?)
}

/// Signs `list` with the next sequence number and writes it atomically (0600) to the home's
/// `revoked.json`, then raises the watermark.
pub fn save_revocations(home: &Home, list: &RevocationList, key: &SigningKey) -> Result<u64> {
    let w = watermark(home, &key.verifying_key());
    let seen = w.seen()?.unwrap_or(0);
    let mut next = list.clone();
    next.seq = list.seq.max(seen) + 1;
    fsutil::write_atomic(&home.revoked_path(), &next.to_signed_bytes(key), 0o600)?;
    w.raise(next.seq)?;
    Ok(next.seq)
}
