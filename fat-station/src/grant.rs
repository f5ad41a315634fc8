//! Offline verification of monster-guard grant tokens at the mesh entry (no link to
//! monster-guard; the format is `specs/qspec.md`, "Grant encoding").
//!
//! A grant file is the canonical compact JSON `{"grant": PAYLOAD, "sig": HEX, "parent":
//! GRANT|null}` plus a newline. The signature is ed25519 (strict) over
//! `"monster-guard grant v1\0" || PAYLOAD` where PAYLOAD is the payload's exact bytes in the
//! file (canonical, so no re-encoding is needed: any changed byte breaks the signature).
//! Attenuated grants carry their signed parent; every link is checked: issuer, signature,
//! expiry, and that the child narrows its parent (same name, model and qspec, caps a subset,
//! expiry not later, the child's `parent` = BLAKE3 of the enclosed parent's payload).
//!
//! Clients send the grant file's bytes hex-encoded in `X-Grant`.
//!
//! Revocation ([`GrantVerifier::with_revocations`]): monster-guard's signed revocation list
//! (`revoked.json`, `specs/qspec.md` "Revocation list"): `{"list": {"v": 1, "issuer": HEX,
//! "entries": [{"id", "name", "at"}]}, "sig": HEX}`, ed25519 over `"monster-guard revocations
//! v1\0" || compact JSON of list`. A grant is refused when any link of its chain (itself or an
//! ancestor it was attenuated from) is listed. The file is re-read whenever its mtime, size or
//! inode changes (checked on every verification, so `monster-guard revoke` reaches a running
//! station at its next request); a missing file is an empty list (as in monster-guard), and a
//! list that does not verify refuses every grant until it does (fail closed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use ed25519_dalek::{Signature, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Signature domain of grant payloads (monster-guard's `GRANT_DOMAIN`).
pub const GRANT_DOMAIN: &[u8] = b"monster-guard grant v1\0";
/// Signature domain of revocation lists (monster-guard's `REVOCATION_DOMAIN`).
pub const REVOCATION_DOMAIN: &[u8] = b"monster-guard revocations v1\0";
/// Largest revocation list read (a hostile file cannot make the station allocate more).
const MAX_REVOCATIONS_BYTES: u64 = 16 << 20;

/// Why a grant was refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("issuer key: {0}")]
    BadIssuer(String),
    #[error("not a grant: {0}")]
    Malformed(String),
    #[error("grant {name:?}: {why}")]
    Refused { name: String, why: String },
    /// The grant, or a grant it was attenuated from, is on the revocation list.
    #[error("grant {name:?}: {why}")]
    Revoked { name: String, why: String },
    /// The revocation list cannot be read or does not verify: every grant is refused.
    #[error("revocation list {path}: {why}; refusing every grant until it verifies")]
    Revocations { path: String, why: String },
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    grant: &'a RawValue,
    sig: String,
    #[serde(borrow)]
    parent: Option<Box<Envelope<'a>>>,
}

/// The fields of a payload the mesh checks (the rest is carried, unread, in the signature).
#[derive(Deserialize)]
struct Payload {
    v: u32,
    name: String,
    caps: Vec<String>,
    expires: u64,
    issuer: String,
    model_hash: String,
    qspec_hash: String,
    parent: Option<String>,
}

/// What a verified grant says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub name: String,
    pub caps: Vec<String>,
    pub expires: u64,
}

/// Verifies grants signed by one issuer.
#[derive(Clone, Debug)]
pub struct GrantVerifier {
    issuer: VerifyingKey,
    issuer_hex: String,
    /// The issuer's revocation list, when one is watched.
    revocations: Option<Arc<Revocations>>,
}

/// monster-guard's `RevocationList`: fields in its declaration order (the signature covers
/// their compact JSON).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RevocationList {
    v: u32,
    issuer: String,
    entries: Vec<Revocation>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Revocation {
    id: String,
    name: String,
    at: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignedRevocations {
    list: RevocationList,
    sig: String,
}

/// What identifies one version of a file: mtime, size, inode (an atomic rename changes the
/// inode even within one mtime tick). `None`: the file is absent.
type Stamp = Option<(Option<SystemTime>, u64, u64)>;

/// A revocation list file, re-read when it changes.
#[derive(Debug)]
struct Revocations {
    path: PathBuf,
    state: Mutex<RevState>,
}

#[derive(Debug)]
struct RevState {
    /// The file version last read.
    stamp: Stamp,
    /// Revoked grant id -> Unix time of revocation, or why the list is not trusted.
    list: Result<HashMap<String, u64>, String>,
}

fn stamp(path: &Path) -> Result<Stamp, String> {
    match std::fs::metadata(path) {
        Ok(m) => {
            #[cfg(unix)]
            let ino = std::os::unix::fs::MetadataExt::ino(&m);
            #[cfg(not(unix))]
            let ino = 0;
            Ok(Some((m.modified().ok(), m.len(), ino)))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads and verifies a revocation list; a missing file is an empty list.
fn load_revocations(
    path: &Path,
    issuer: &VerifyingKey,
    issuer_hex: &str,
) -> Result<HashMap<String, u64>, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    match std::fs::File::open(path) {
        Ok(f) => f
            .take(MAX_REVOCATIONS_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(e.to_string()),
    };
    if bytes.len() as u64 > MAX_REVOCATIONS_BYTES {
        return Err(format!("larger than {MAX_REVOCATIONS_BYTES} bytes"));
    }
    let s: SignedRevocations =
        serde_json::from_slice(&bytes).map_err(|e| format!("not a revocation list: {e}"))?;
    if s.list.v != 1 {
        return Err(format!("unknown version {}", s.list.v));
    }
    if s.list.issuer.to_ascii_lowercase() != issuer_hex {
        return Err(format!(
            "signed by {}, not the trusted issuer {}",
            short(&s.list.issuer),
            short(issuer_hex)
        ));
    }
    let sig: [u8; 64] = unhex(&s.sig)
        .and_then(|b| b.try_into().ok())
        .ok_or("malformed signature")?;
    let mut msg = REVOCATION_DOMAIN.to_vec();
    msg.extend_from_slice(&serde_json::to_vec(&s.list).map_err(|e| e.to_string())?);
    issuer
        .verify_strict(&msg, &Signature::from_bytes(&sig))
        .map_err(|_| "signature does not verify (modified or forged)".to_string())?;
    Ok(s.list.entries.into_iter().map(|r| (r.id, r.at)).collect())
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Lowercase hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl GrantVerifier {
    /// From the issuer's public key: 64 hex characters, or a file holding them
    /// (monster-guard's `node.pub`, or `monster-guard pubkey export > issuer.pub`).
    pub fn from_arg(arg: &str) -> Result<GrantVerifier, GrantError> {
        let text = if arg.len() == 64 && unhex(arg).is_some() {
            arg.to_string()
        } else {
            std::fs::read_to_string(arg).map_err(|e| {
                GrantError::BadIssuer(format!(
                    "{arg}: not 64 hex characters and not a readable file ({e})"
                ))
            })?
        };
        let t = text.trim();
        let bytes: [u8; 32] = unhex(t).and_then(|b| b.try_into().ok()).ok_or_else(|| {
            GrantError::BadIssuer(format!("{arg}: expected a 64-hex ed25519 public key"))
        })?;
        let issuer = VerifyingKey::from_bytes(&bytes)
            .map_err(|e| GrantError::BadIssuer(format!("{arg}: {e}")))?;
        Ok(GrantVerifier {
            issuer,
            issuer_hex: t.to_ascii_lowercase(),
            revocations: None,
        })
    }

    /// Also refuses grants on the issuer's signed revocation list at `path` (monster-guard's
    /// `revoked.json`), re-read whenever the file changes. Fails when the file exists and
    /// does not verify; a missing file is an empty list until it appears.
    pub fn with_revocations(mut self, path: &Path) -> Result<GrantVerifier, GrantError> {
        let bad = |why: String| GrantError::Revocations {
            path: path.display().to_string(),
            why,
        };
        let stamp = stamp(path).map_err(bad)?;
        let list = load_revocations(path, &self.issuer, &self.issuer_hex).map_err(bad)?;
        self.revocations = Some(Arc::new(Revocations {
            path: path.to_path_buf(),
            state: Mutex::new(RevState {
                stamp,
                list: Ok(list),
            }),
        }));
        Ok(self)
    }

    /// Whether a revocation list is watched.
    pub fn checks_revocations(&self) -> bool {
        self.revocations.is_some()
    }

    /// Refuses the chain `ids` (root first) when any link is revoked; re-reads the list first
    /// if the file changed.
    fn check_revoked(&self, name: &str, ids: &[String]) -> Result<(), GrantError> {
        let Some(r) = &self.revocations else {
            return Ok(());
        };
        let path = r.path.display().to_string();
        let mut st = r.state.lock().unwrap_or_else(|p| p.into_inner());
        // Stat before reading: a write racing the read changes the stamp again, so the next
        // request reads once more.
        match stamp(&r.path) {
            Ok(now) if now == st.stamp => {}
            Ok(now) => {
                st.list = load_revocations(&r.path, &self.issuer, &self.issuer_hex);
                st.stamp = now;
                match &st.list {
                    Ok(l) => tracing::info!("revocation list {path}: {} entries", l.len()),
                    Err(e) => tracing::warn!("revocation list {path}: {e}"),
                }
            }
            Err(e) => {
                st.list = Err(e);
                st.stamp = None;
            }
        }
        let list = st.list.as_ref().map_err(|why| GrantError::Revocations {
            path: path.clone(),
            why: why.clone(),
        })?;
        let last = ids.len().saturating_sub(1);
        for (i, id) in ids.iter().enumerate() {
            if let Some(at) = list.get(id) {
                let why = if i == last {
                    format!("revoked at unix time {at} (grant id {})", short(id))
                } else {
                    format!(
                        "the grant it was attenuated from ({}) was revoked at unix time {at}, \
                         and its children fall with it",
                        short(id)
                    )
                };
                return Err(GrantError::Revoked {
                    name: name.to_string(),
                    why,
                });
            }
        }
        Ok(())
    }

    /// Verifies a grant file's bytes at Unix time `now`.
    pub fn verify(&self, file: &[u8], now: u64) -> Result<Verified, GrantError> {
        let text =
            std::str::from_utf8(file).map_err(|_| GrantError::Malformed("not UTF-8".into()))?;
        let env: Envelope = serde_json::from_str(text.trim_end_matches('\n'))
            .map_err(|e| GrantError::Malformed(e.to_string()))?;
        // Walk root -> leaf.
        let mut links = vec![&env];
        while let Some(p) = links.last().and_then(|l| l.parent.as_deref()) {
            links.push(p);
        }
        links.reverse();
        let mut prev: Option<(Payload, String)> = None;
        let mut ids = Vec::with_capacity(links.len());
        for link in links {
            let raw = link.grant.get();
            let p: Payload = serde_json::from_str(raw)
                .map_err(|e| GrantError::Malformed(format!("payload: {e}")))?;
            let refuse = |why: String| GrantError::Refused {
                name: p.name.clone(),
                why,
            };
            if p.v != 1 {
                return Err(refuse(format!("unknown version {}", p.v)));
            }
            if p.issuer.to_ascii_lowercase() != self.issuer_hex {
                return Err(refuse(format!(
                    "issued by {}, not the trusted issuer {}",
                    short(&p.issuer),
                    short(&self.issuer_hex)
                )));
            }
            let sig: [u8; 64] = unhex(&link.sig)
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| refuse("malformed signature".into()))?;
            let mut msg = GRANT_DOMAIN.to_vec();
            msg.extend_from_slice(raw.as_bytes());
            self.issuer
                .verify_strict(&msg, &Signature::from_bytes(&sig))
                .map_err(|_| refuse("signature does not verify (modified or forged)".into()))?;
            if now >= p.expires {
                return Err(refuse(format!("expired at unix time {}", p.expires)));
            }
            match (&prev, &p.parent) {
                (None, Some(_)) => return Err(refuse("names a parent but carries none".into())),
                (Some((_, id)), Some(named)) if named != id => {
                    return Err(refuse(
                        "its parent link does not match the enclosed parent grant".into(),
                    ))
                }
                (Some(_), None) => return Err(refuse("carries a parent it does not name".into())),
                _ => {}
            }
            if let Some((parent, _)) = &prev {
                if parent.name != p.name
                    || parent.model_hash != p.model_hash
                    || parent.qspec_hash != p.qspec_hash
                {
                    return Err(refuse(
                        "names a different grant, model or qspec than its parent".into(),
                    ));
                }
                if let Some(c) = p.caps.iter().find(|c| !parent.caps.contains(c)) {
                    return Err(refuse(format!("widens its parent's capabilities with {c}")));
                }
                if p.expires > parent.expires {
                    return Err(refuse("expires after its parent".into()));
                }
            }
            let id = blake3::hash(raw.as_bytes()).to_hex().to_string();
            ids.push(id.clone());
            prev = Some((p, id));
        }
        let (p, _) = prev.ok_or_else(|| GrantError::Malformed("empty chain".into()))?;
        self.check_revoked(&p.name, &ids)?;
        Ok(Verified {
            name: p.name,
            caps: p.caps,
            expires: p.expires,
        })
    }

    /// Verifies the hex-encoded grant of an `X-Grant` header.
    pub fn verify_header(&self, hex_value: &str, now: u64) -> Result<Verified, GrantError> {
        let bytes = unhex(hex_value.trim())
            .ok_or_else(|| GrantError::Malformed("X-Grant is not hex".into()))?;
        self.verify(&bytes, now)
    }
}

fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}

/// Unix seconds now.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};

    /// A grant in monster-guard's canonical encoding (field order as specs/qspec.md).
    fn grant(
        key: &SigningKey,
        name: &str,
        caps: &str,
        expires: u64,
        parent: Option<(&str, String)>,
    ) -> String {
        let issuer = hex(key.verifying_key().as_bytes());
        let parent_id = match &parent {
            Some((id, _)) => format!("\"{id}\""),
            None => "null".into(),
        };
        let payload = format!(
            r#"{{"v":1,"name":"{name}","caps":[{caps}],"issued":1000,"expires":{expires},"issuer":"{issuer}","model_path":"/m.knot","model_hash":"{h}","qspec_hash":"{h}","probes":[{{"name":"paris","pass":true,"expected":12095,"expected_text":" Paris"}}],"parent":{parent_id}}}"#,
            h = "ab".repeat(32)
        );
        let mut msg = GRANT_DOMAIN.to_vec();
        msg.extend_from_slice(payload.as_bytes());
        let sig = hex(&key.sign(&msg).to_bytes());
        let parent_env = parent.map(|(_, env)| env).unwrap_or_else(|| "null".into());
        format!(r#"{{"grant":{payload},"sig":"{sig}","parent":{parent_env}}}"#)
    }

    #[test]
    fn grants_verify_offline_and_tampering_is_refused() {
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let v = GrantVerifier::from_arg(&hex(key.verifying_key().as_bytes())).unwrap();
        let g = grant(&key, "qwen", r#""fs","net""#, 2000, None);
        let ok = v.verify(format!("{g}\n").as_bytes(), 1500).unwrap();
        assert_eq!((ok.name.as_str(), ok.caps.len()), ("qwen", 2));
        assert!(v.verify_header(&hex(g.as_bytes()), 1500).is_ok());
        // Expired.
        assert!(v
            .verify(g.as_bytes(), 2000)
            .unwrap_err()
            .to_string()
            .contains("expired"));
        // A changed byte inside the payload.
        let t = g.replace("\"expires\":2000", "\"expires\":2999");
        assert!(v
            .verify(t.as_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("signature does not verify"));
        // Another issuer.
        let other = SigningKey::from_bytes(&[6u8; 32]);
        let g2 = grant(&other, "qwen", r#""net""#, 2000, None);
        assert!(v
            .verify(g2.as_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("not the trusted issuer"));
        // Garbage.
        assert!(matches!(
            v.verify(b"{}", 1500),
            Err(GrantError::Malformed(_))
        ));
    }

    #[test]
    fn attenuated_children_must_narrow() {
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let v = GrantVerifier::from_arg(&hex(key.verifying_key().as_bytes())).unwrap();
        let parent = grant(&key, "qwen", r#""net""#, 2000, None);
        let raw = &parent[9..parent.find(r#","sig":""#).unwrap()];
        let pid = blake3::hash(raw.as_bytes()).to_hex().to_string();
        let pid = pid.as_str();
        let child = grant(&key, "qwen", r#""net""#, 1800, Some((pid, parent.clone())));
        assert_eq!(v.verify(child.as_bytes(), 1500).unwrap().expires, 1800);
        let wrong = grant(&key, "qwen", r#""net""#, 1800, Some(("00", parent.clone())));
        assert!(v
            .verify(wrong.as_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("does not match"));
        assert_eq!(v.verify(child.as_bytes(), 1500).unwrap().expires, 1800);
        let wider = grant(
            &key,
            "qwen",
            r#""fs","net""#,
            1800,
            Some((pid, parent.clone())),
        );
        assert!(v
            .verify(wider.as_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("widens"));
        let later = grant(&key, "qwen", r#""net""#, 2500, Some((pid, parent.clone())));
        assert!(v
            .verify(later.as_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("expires after"));
    }

    /// A revocation list signed the way monster-guard's `RevocationList::save` does.
    pub(super) fn signed_list(key: &SigningKey, entries: &[(&str, &str, u64)]) -> String {
        let list = RevocationList {
            v: 1,
            issuer: hex(key.verifying_key().as_bytes()),
            entries: entries
                .iter()
                .map(|(id, name, at)| Revocation {
                    id: id.to_string(),
                    name: name.to_string(),
                    at: *at,
                })
                .collect(),
        };
        let mut msg = REVOCATION_DOMAIN.to_vec();
        msg.extend_from_slice(&serde_json::to_vec(&list).unwrap());
        let sig = hex(&key.sign(&msg).to_bytes());
        // Pretty-printed, as monster-guard writes it: the signature covers the compact form.
        let v = serde_json::json!({ "list": list, "sig": sig });
        format!("{}\n", serde_json::to_string_pretty(&v).unwrap())
    }

    fn payload_id(g: &str) -> String {
        let raw = &g[9..g.find(r#","sig":""#).unwrap()];
        blake3::hash(raw.as_bytes()).to_hex().to_string()
    }

    /// Replaces a file the way monster-guard does (temporary file + rename).
    fn replace(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn revoked_grants_and_their_children_are_refused_after_a_reload() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("revoked.json");
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let pubhex = hex(key.verifying_key().as_bytes());
        // No file yet: an empty list.
        let v = GrantVerifier::from_arg(&pubhex)
            .unwrap()
            .with_revocations(&list)
            .unwrap();
        assert!(v.checks_revocations());
        let parent = grant(&key, "qwen", r#""net""#, 2000, None);
        let pid = payload_id(&parent);
        let child = grant(&key, "qwen", r#""net""#, 1800, Some((&pid, parent.clone())));
        let other = grant(&key, "other", r#""net""#, 2000, None);
        assert!(v.verify(parent.as_bytes(), 1500).is_ok());
        assert!(v.verify(child.as_bytes(), 1500).is_ok());

        // Revoke the parent: it and its attenuated child are refused; another grant is not.
        replace(&list, &signed_list(&key, &[(&pid, "qwen", 1400)]));
        let e = v.verify(parent.as_bytes(), 1500).unwrap_err();
        assert!(matches!(e, GrantError::Revoked { .. }), "{e}");
        assert!(e.to_string().contains("revoked at unix time 1400"), "{e}");
        let e = v.verify(child.as_bytes(), 1500).unwrap_err().to_string();
        assert!(e.contains("the grant it was attenuated from"), "{e}");
        assert!(v.verify(other.as_bytes(), 1500).is_ok());

        // A list that does not verify refuses everything (fail closed) until it does.
        let forged = signed_list(&key, &[]).replace(
            "\"entries\": []",
            "\"entries\": [{\"id\": \"00\", \"name\": \"x\", \"at\": 1}]",
        );
        replace(&list, &forged);
        let e = v.verify(other.as_bytes(), 1500).unwrap_err();
        assert!(matches!(e, GrantError::Revocations { .. }), "{e}");
        assert!(e.to_string().contains("does not verify"), "{e}");
        let foreign = SigningKey::from_bytes(&[6u8; 32]);
        replace(&list, &signed_list(&foreign, &[]));
        assert!(v
            .verify(other.as_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("not the trusted issuer"));
        replace(&list, &signed_list(&key, &[]));
        assert!(v.verify(parent.as_bytes(), 1500).is_ok());

        // At start, a list that does not verify is an error.
        replace(&list, &forged);
        assert!(GrantVerifier::from_arg(&pubhex)
            .unwrap()
            .with_revocations(&list)
            .is_err());
    }
}
