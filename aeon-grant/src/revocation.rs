//! The issuer's signed revocation list, its sequence watermark, and a watched copy.
//!
//! File (`specs/qspec.md`, "Revocation list"): `{"list": {"v": 1, "issuer": HEX, "seq": N,
//! "entries": [{"id", "name", "at"}]}, "sig": HEX}`, `sig` = ed25519 over
//! `REVOCATION_DOMAIN || compact JSON of list`. `seq` grows by one with every list the issuer
//! signs (a list written before sequences existed has none and counts as 0).
//!
//! Revocation must not be undoable by the party it binds. So every verifier keeps a
//! [`Watermark`]: the highest sequence it has accepted from that issuer, in its own state
//! directory (monster-guard's home, the station's `--state-dir`). A list older than the
//! watermark (an old copy put back) is refused, and so is a missing list once any list was
//! seen (deleting the list would otherwise re-validate every revoked grant). Both refusals fail
//! closed: every grant is refused until a list at least as new is back.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::encoding::{hex, unhex_array};
use crate::error::GrantError;

/// Signature domain of the revocation list.
pub const REVOCATION_DOMAIN: &[u8] = b"monster-guard revocations v1\0";
/// Largest revocation list read (a hostile file cannot make a verifier allocate more).
pub const MAX_LIST_BYTES: u64 = 16 << 20;

/// One revoked grant.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Revocation {
    /// The revoked grant's id (its children are revoked with it).
    pub id: String,
    /// Its name, for people reading the list.
    pub name: String,
    /// Unix seconds of the revocation.
    pub at: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The node's revocation list, signed so an offline verifier can trust a copy of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevocationList {
    /// Format version, 1.
    pub v: u32,
    /// Hex public key of the signing node.
    pub issuer: String,
    /// Sequence number: one more than the list it replaces. Absent (0) in lists written
    /// before sequences existed, so their signatures still verify.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub seq: u64,
    /// Revoked grants.
    pub entries: Vec<Revocation>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SignedRevocations {
    list: RevocationList,
    sig: String,
}

impl RevocationList {
    /// The entry revoking grant `id`, if any.
    pub fn find(&self, id: &str) -> Option<&Revocation> {
        self.entries.iter().find(|r| r.id == id)
    }

    /// Whether any link of the grant's chain is revoked.
    pub fn revokes(&self, g: &crate::SignedGrant) -> bool {
        g.chain().iter().any(|l| self.find(&l.grant.id()).is_some())
    }

    /// Parses and verifies a list file's bytes against the trusted issuer (no watermark).
    pub fn from_bytes(
        bytes: &[u8],
        issuer: &VerifyingKey,
        origin: &Path,
    ) -> Result<RevocationList, GrantError> {
        let bad = |why: String| GrantError::Revocations {
            path: origin.display().to_string(),
            why,
        };
        let s: SignedRevocations = serde_json::from_slice(bytes)
            .map_err(|e| bad(format!("not a revocation list: {e}")))?;
        if s.list.v != 1 {
            return Err(bad(format!("unknown version {}", s.list.v)));
        }
        let trusted = hex(issuer.as_bytes());
        if s.list.issuer != trusted {
            return Err(bad(format!(
                "signed by {}, not by the trusted issuer {}",
                crate::short(&s.list.issuer),
                crate::short(&trusted)
            )));
        }
        let sig = unhex_array::<64>(&s.sig)
            .ok_or_else(|| bad("malformed signature (128 lowercase hex digits)".into()))?;
        let mut msg = REVOCATION_DOMAIN.to_vec();
        msg.extend_from_slice(&serde_json::to_vec(&s.list).unwrap_or_default());
        issuer
            .verify_strict(&msg, &Signature::from_bytes(&sig))
            .map_err(|_| bad("signature does not verify (modified or forged)".into()))?;
        Ok(s.list)
    }

    /// The signed file bytes (pretty JSON plus a newline), with `v` and `issuer` set from the key.
    pub fn to_signed_bytes(&self, key: &SigningKey) -> Vec<u8> {
        let mut list = self.clone();
        list.v = 1;
        list.issuer = hex(key.verifying_key().as_bytes());
        let mut msg = REVOCATION_DOMAIN.to_vec();
        msg.extend_from_slice(&serde_json::to_vec(&list).unwrap_or_default());
        let sig = hex(&key.sign(&msg).to_bytes());
        let mut bytes =
            serde_json::to_vec_pretty(&SignedRevocations { list, sig }).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }
}

/// The highest revocation-list sequence a verifier has accepted from one issuer: the file
/// `DIR/revocation-seq/ISSUER_HEX` holding a decimal number. Its existence means "a list was
/// seen"; it only ever grows.
#[derive(Clone, Debug)]
pub struct Watermark {
    path: PathBuf,
}

impl Watermark {
    /// The watermark of `issuer` under the state directory `dir`.
    pub fn in_dir(dir: &Path, issuer: &VerifyingKey) -> Watermark {
        Watermark {
            path: dir.join("revocation-seq").join(hex(issuer.as_bytes())),
        }
    }

    /// Where it is kept.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The highest sequence seen, `None` when no list was ever accepted.
    pub fn seen(&self) -> Result<Option<u64>, GrantError> {
        match std::fs::read_to_string(&self.path) {
            Ok(s) => s
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| GrantError::Revocations {
                    path: self.path.display().to_string(),
                    why: format!("watermark {:?} is not a number (damaged state)", s.trim()),
                }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(GrantError::Revocations {
                path: self.path.display().to_string(),
                why: format!("cannot read the watermark: {e}"),
            }),
        }
    }

    /// Records `seq` as seen, when it is higher than what is recorded (atomic replace).
    pub fn raise(&self, seq: u64) -> Result<(), GrantError> {
        if self.seen()?.is_some_and(|s| s >= seq) {
            return Ok(());
        }
        write_atomic(&self.path, format!("{seq}\n").as_bytes()).map_err(|e| {
            GrantError::Revocations {
                path: self.path.display().to_string(),
                why: format!("cannot record the watermark: {e}"),
            }
        })
    }
}

/// Writes `bytes` to `path` (0600, directory created 0700): temporary file, fsync, rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let tmp = dir.join(format!(
        ".seq.tmp.{}.{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let r = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// Reads, verifies and checks a revocation list against the watermark (when given), and
/// raises the watermark to the list's sequence:
/// - missing file: an empty list if no list was ever seen, else refused;
/// - a list older than the watermark: refused (an old copy put back);
/// - a list that does not verify: refused.
pub fn load_list(
    path: &Path,
    issuer: &VerifyingKey,
    watermark: Option<&Watermark>,
) -> Result<RevocationList, GrantError> {
    let bad = |why: String| GrantError::Revocations {
        path: path.display().to_string(),
        why,
    };
    let mut bytes = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => {
            f.take(MAX_LIST_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| bad(format!("cannot read: {e}")))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let seen = match watermark {
                Some(w) => w.seen()?,
                None => None,
            };
            return match seen {
                None => Ok(RevocationList::default()),
                Some(n) => Err(bad(format!(
                    "is missing, but a list with sequence {n} was seen (watermark {}): a \
                     deleted list would re-validate revoked grants",
                    watermark
                        .map(|w| w.path.display().to_string())
                        .unwrap_or_default()
                ))),
            };
        }
        Err(e) => return Err(bad(format!("cannot open: {e}"))),
    }
    if bytes.len() as u64 > MAX_LIST_BYTES {
        return Err(bad(format!("larger than {MAX_LIST_BYTES} bytes")));
    }
    let list = RevocationList::from_bytes(&bytes, issuer, path)?;
    if let Some(w) = watermark {
        if let Some(n) = w.seen()? {
            if list.seq < n {
                return Err(bad(format!(
                    "has sequence {}, older than the newest seen ({n}): an old copy was put back",
                    list.seq
                )));
            }
        }
        w.raise(list.seq)?;
    }
    Ok(list)
}

/// What identifies one version of a file: mtime, size, inode (an atomic rename changes the
/// inode even within one mtime tick). `None`: the file is absent.
type Stamp = Option<(Option<SystemTime>, u64, u64)>;

fn stamp(path: &Path) -> Result<Stamp, String> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some((m.modified().ok(), m.len(), m.ino()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// A revocation list file, re-read (and re-checked against the watermark) whenever its mtime,
/// size or inode changes; a list that stops verifying refuses every grant until it does.
#[derive(Debug)]
pub struct WatchedList {
    path: PathBuf,
    issuer: VerifyingKey,
    watermark: Option<Watermark>,
    state: Mutex<(Stamp, Result<Arc<RevocationList>, String>)>,
}

impl WatchedList {
    /// Reads the list now; an error when it does not verify (callers refuse to start).
    pub fn open(
        path: &Path,
        issuer: VerifyingKey,
        watermark: Option<Watermark>,
    ) -> Result<WatchedList, GrantError> {
        let st = stamp(path).map_err(|why| GrantError::Revocations {
            path: path.display().to_string(),
            why,
        })?;
        let list = load_list(path, &issuer, watermark.as_ref())?;
        Ok(WatchedList {
            path: path.to_path_buf(),
            issuer,
            watermark,
            state: Mutex::new((st, Ok(Arc::new(list)))),
        })
    }

    /// The watched file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current list, re-read first if the file changed.
    pub fn current(&self) -> Result<Arc<RevocationList>, GrantError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // Stat before reading: a write racing the read changes the stamp again, so the next
        // call reads once more.
        match stamp(&self.path) {
            Ok(now) if now == st.0 => {}
            Ok(now) => {
                st.1 = load_list(&self.path, &self.issuer, self.watermark.as_ref())
                    .map(Arc::new)
                    .map_err(|e| match e {
                        GrantError::Revocations { why, .. } => why,
                        other => other.to_string(),
                    });
                st.0 = now;
                match &st.1 {
                    Ok(l) => tracing::info!(
                        "revocation list {}: sequence {}, {} entries",
                        self.path.display(),
                        l.seq,
                        l.entries.len()
                    ),
                    Err(e) => tracing::warn!("revocation list {}: {e}", self.path.display()),
                }
            }
            Err(e) => {
                st.1 = Err(e);
                st.0 = None;
            }
        }
        st.1.clone().map_err(|why| GrantError::Revocations {
            path: self.path.display().to_string(),
            why,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::generate(&mut rand::rngs::OsRng)
    }

    fn list(seq: u64, ids: &[&str]) -> RevocationList {
        RevocationList {
            v: 1,
            issuer: String::new(),
            seq,
            entries: ids
                .iter()
                .map(|id| Revocation {
                    id: id.to_string(),
                    name: "x".into(),
                    at: 5,
                })
                .collect(),
        }
    }

    #[test]
    fn list_is_signed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("revoked.json");
        let k = key();
        std::fs::write(&p, list(1, &["ab"]).to_signed_bytes(&k)).unwrap();
        assert_eq!(
            load_list(&p, &k.verifying_key(), None)
                .unwrap()
                .entries
                .len(),
            1
        );
        assert!(load_list(&p, &key().verifying_key(), None).is_err());
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("\"x\"", "\"y\"");
        std::fs::write(&p, text).unwrap();
        let e = load_list(&p, &k.verifying_key(), None).unwrap_err();
        assert!(e.to_string().contains("does not verify"), "{e}");
    }

    /// A list signed before sequences existed (no `seq` field) still verifies, as sequence 0.
    #[test]
    fn list_without_sequence_is_sequence_zero() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("revoked.json");
        let k = key();
        let bytes = list(0, &["ab"]).to_signed_bytes(&k);
        assert!(!String::from_utf8_lossy(&bytes).contains("seq"));
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(load_list(&p, &k.verifying_key(), None).unwrap().seq, 0);
    }

    /// Issue 16.9: an older list put back, or the list deleted, is refused once a newer one
    /// was seen.
    #[test]
    fn older_or_deleted_list_is_refused_after_a_newer_one() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("revoked.json");
        let k = key();
        let w = Watermark::in_dir(&d.path().join("state"), &k.verifying_key());
        // Nothing seen, nothing there: empty.
        assert!(load_list(&p, &k.verifying_key(), Some(&w))
            .unwrap()
            .entries
            .is_empty());
        let old = list(1, &[]).to_signed_bytes(&k);
        std::fs::write(&p, &old).unwrap();
        load_list(&p, &k.verifying_key(), Some(&w)).unwrap();
        std::fs::write(&p, list(2, &["ab"]).to_signed_bytes(&k)).unwrap();
        load_list(&p, &k.verifying_key(), Some(&w)).unwrap();
        assert_eq!(w.seen().unwrap(), Some(2));
        std::fs::write(&p, &old).unwrap();
        let e = load_list(&p, &k.verifying_key(), Some(&w)).unwrap_err();
        assert!(
            e.to_string().contains("older than the newest seen (2)"),
            "{e}"
        );
        std::fs::remove_file(&p).unwrap();
        let e = load_list(&p, &k.verifying_key(), Some(&w)).unwrap_err();
        assert!(e.to_string().contains("is missing"), "{e}");
        // Another issuer's watermark is its own.
        let other = key();
        let w2 = Watermark::in_dir(&d.path().join("state"), &other.verifying_key());
        assert!(load_list(&p, &other.verifying_key(), Some(&w2)).is_ok());
    }

    #[test]
    fn watched_list_rereads_on_change() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("revoked.json");
        let k = key();
        let w = Watermark::in_dir(d.path(), &k.verifying_key());
        let watched = WatchedList::open(&p, k.verifying_key(), Some(w)).unwrap();
        assert!(watched.current().unwrap().entries.is_empty());
        let tmp = d.path().join("t");
        std::fs::write(&tmp, list(1, &["ab"]).to_signed_bytes(&k)).unwrap();
        std::fs::rename(&tmp, &p).unwrap();
        assert!(watched.current().unwrap().find("ab").is_some());
        std::fs::remove_file(&p).unwrap();
        assert!(watched.current().is_err());
    }
}
