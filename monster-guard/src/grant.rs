//! Signed capability grants, their attenuated children, and the signed revocation list.
//!
//! Encoding (see `specs/qspec.md`, "Grant encoding"): a grant file is the canonical JSON of
//! [`SignedGrant`] followed by one newline. Canonical means serde_json's compact output of
//! these structs, fields in declaration order, `null` for absent options. The signature is
//! ed25519 over `GRANT_DOMAIN || canonical(payload)`. A reader re-encodes what it parsed and
//! refuses a file whose bytes differ, so *any* changed byte is refused: either the JSON no
//! longer parses, or it is not canonical, or the signature no longer verifies.

use std::collections::BTreeSet;
use std::path::Path;

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::error::{GuardError, Result};
use crate::fsutil;
use crate::identity::{hex, unhex};
use crate::qspec::ProbeSummary;

/// Signature domain of grant payloads.
pub const GRANT_DOMAIN: &[u8] = b"monster-guard grant v1\0";
/// Signature domain of the revocation list.
pub const REVOCATION_DOMAIN: &[u8] = b"monster-guard revocations v1\0";

/// The capabilities a grant can carry, with what each allows under `monster-guard run`.
pub const CAPS: &[(&str, &str)] = &[
    ("net", "network access; without it the command runs in a new, empty network namespace"),
    ("fs", "a writable filesystem; without it the command runs in a private mount namespace whose root mount is read-only"),
];

/// A validated, sorted, duplicate-free set of capability names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caps(pub BTreeSet<String>);

impl Caps {
    /// Parses `net,fs` (empty or `none` = no capabilities). Unknown names are refused so a
    /// typo cannot silently grant or drop something.
    pub fn parse(s: &str) -> Result<Caps> {
        let s = s.trim();
        let mut set = BTreeSet::new();
        if s.is_empty() || s == "none" {
            return Ok(Caps(set));
        }
        for c in s.split(',').map(str::trim) {
            if !CAPS.iter().any(|(k, _)| *k == c) {
                let known: Vec<_> = CAPS.iter().map(|(k, _)| *k).collect();
                return Err(GuardError::Invalid(format!(
                    "unknown capability {c:?} (known: {})",
                    known.join(", ")
                )));
            }
            set.insert(c.to_string());
        }
        Ok(Caps(set))
    }

    /// Whether the capability is present.
    pub fn has(&self, cap: &str) -> bool {
        self.0.contains(cap)
    }

    /// The names, sorted.
    pub fn to_vec(&self) -> Vec<String> {
        self.0.iter().cloned().collect()
    }

    /// Capabilities in `self` that `other` lacks.
    pub fn missing_from(&self, other: &Caps) -> Vec<String> {
        self.0.difference(&other.0).cloned().collect()
    }
}

impl std::fmt::Display for Caps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.to_vec().join(","))
    }
}

/// What the node signs: who may do what, until when, for which model, on what evidence.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantPayload {
    /// Format version, 1.
    pub v: u32,
    /// The grant's name (what `run --name` and `revoke` use).
    pub name: String,
    /// Capability names, sorted, no duplicates.
    pub caps: Vec<String>,
    /// Unix seconds when it was signed.
    pub issued: u64,
    /// Unix seconds after which it is invalid.
    pub expires: u64,
    /// Hex ed25519 public key of the signing node.
    pub issuer: String,
    /// Absolute path of the admitted model file.
    pub model_path: String,
    /// BLAKE3 (hex) of the whole model file at admission; `run` re-hashes and compares.
    pub model_hash: String,
    /// BLAKE3 (hex) of the qspec file that admitted the model.
    pub qspec_hash: String,
    /// The probe results that earned the grant (empty in attenuated children).
    pub probes: Vec<ProbeSummary>,
    /// For an attenuated child: the id of the parent grant.
    pub parent: Option<String>,
}

impl GrantPayload {
    /// Canonical bytes: compact JSON, fields in declaration order.
    pub fn canonical(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("grant payload serializes")
    }

    /// The grant id: BLAKE3 (hex) of the canonical payload.
    pub fn id(&self) -> String {
        blake3::hash(&self.canonical()).to_hex().to_string()
    }

    /// The capabilities as a set.
    pub fn caps(&self) -> Caps {
        Caps(self.caps.iter().cloned().collect())
    }
}

/// A signed grant, with its parent chain for attenuated grants.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedGrant {
    /// The signed statement.
    pub grant: GrantPayload,
    /// Hex ed25519 signature over `GRANT_DOMAIN || canonical(grant)`.
    pub sig: String,
    /// The grant this one was attenuated from (itself signed, recursively).
    pub parent: Option<Box<SignedGrant>>,
}

impl SignedGrant {
    /// Signs a payload with the node key.
    pub fn sign(grant: GrantPayload, key: &SigningKey, parent: Option<SignedGrant>) -> SignedGrant {
        let mut msg = GRANT_DOMAIN.to_vec();
        msg.extend_from_slice(&grant.canonical());
        let sig = hex(&key.sign(&msg).to_bytes());
        SignedGrant {
            grant,
            sig,
            parent: parent.map(Box::new),
        }
    }

    /// The file encoding: canonical JSON plus a newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = serde_json::to_vec(self).expect("grant serializes");
        v.push(b'\n');
        v
    }

    /// Parses a grant file's bytes, refusing anything but the canonical encoding.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<SignedGrant> {
        let g: SignedGrant = serde_json::from_slice(bytes).map_err(|e| {
            GuardError::GrantRefused(format!("{origin}: not a grant (corrupted?): {e}"))
        })?;
        if g.to_bytes() != bytes {
            return Err(GuardError::GrantRefused(format!(
                "{origin}: not in canonical form: the file was modified after signing"
            )));
        }
        Ok(g)
    }

    /// Reads and parses a grant file.
    pub fn load(path: &Path) -> Result<SignedGrant> {
        let bytes = fsutil::read(path)?;
        SignedGrant::from_bytes(&bytes, &path.display().to_string())
    }

    /// Writes the grant atomically with mode 0600.
    pub fn save(&self, path: &Path) -> Result<()> {
        if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !dir.exists() {
                fsutil::private_dir(dir)?;
            }
        }
        fsutil::write_atomic(path, &self.to_bytes(), 0o600)
    }

    /// The links from the root grant down to this one.
    pub fn chain(&self) -> Vec<&SignedGrant> {
        let mut v = vec![self];
        let mut cur = self;
        while let Some(p) = cur.parent.as_deref() {
            v.push(p);
            cur = p;
        }
        v.reverse();
        v
    }

    fn check_signature(&self, issuer: &VerifyingKey) -> Result<()> {
        let name = &self.grant.name;
        if self.grant.issuer != hex(issuer.as_bytes()) {
            return Err(GuardError::GrantRefused(format!(
                "grant {name:?} was issued by key {}, not by the trusted issuer {}",
                short(&self.grant.issuer),
                short(&hex(issuer.as_bytes()))
            )));
        }
        let sig = unhex(&self.sig)
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
            .map(|b| Signature::from_bytes(&b))
            .ok_or_else(|| {
                GuardError::GrantRefused(format!("grant {name:?}: malformed signature"))
            })?;
        let mut msg = GRANT_DOMAIN.to_vec();
        msg.extend_from_slice(&self.grant.canonical());
        issuer.verify_strict(&msg, &sig).map_err(|_| {
            GuardError::GrantRefused(format!(
                "grant {name:?}: signature does not verify (modified or forged)"
            ))
        })
    }

    /// Offline verification with the issuer's public key only: every link's signature, that
    /// each child narrows its parent (same name and model, caps subset, expiry not later),
    /// expiry against `now`, and the revocation list (any revoked link revokes the grant).
    pub fn verify(&self, issuer: &VerifyingKey, now: u64, revoked: &RevocationList) -> Result<()> {
        let chain = self.chain();
        for (i, link) in chain.iter().enumerate() {
            link.check_signature(issuer)?;
            let g = &link.grant;
            if g.v != 1 {
                return Err(GuardError::GrantRefused(format!(
                    "grant {:?}: unknown version {}",
                    g.name, g.v
                )));
            }
            if i == 0 && g.parent.is_some() {
                return Err(GuardError::GrantRefused(format!(
                    "grant {:?} names a parent but carries none",
                    g.name
                )));
            }
            if i > 0 {
                check_narrows(&chain[i - 1].grant, g)?;
            }
            if now >= g.expires {
                return Err(GuardError::GrantRefused(format!(
                    "grant {:?} expired {} ago (at unix time {})",
                    g.name,
                    human_secs(now - g.expires),
                    g.expires
                )));
            }
            let id = g.id();
            if let Some(r) = revoked.entries.iter().find(|r| r.id == id) {
                return Err(GuardError::GrantRefused(format!(
                    "grant {:?} ({}) was revoked at unix time {}",
                    g.name,
                    short(&id),
                    r.at
                )));
            }
        }
        Ok(())
    }
}

/// Checks that `child` is a proper attenuation of `parent`.
fn check_narrows(parent: &GrantPayload, child: &GrantPayload) -> Result<()> {
    let bad = |why: String| {
        Err(GuardError::GrantRefused(format!(
            "grant {:?}: {why}",
            child.name
        )))
    };
    if child.parent.as_deref() != Some(parent.id().as_str()) {
        return bad("its parent link does not match the enclosed parent grant".into());
    }
    if child.name != parent.name {
        return bad(format!("renamed from its parent {:?}", parent.name));
    }
    let wider = child.caps().missing_from(&parent.caps());
    if !wider.is_empty() {
        return bad(format!(
            "widens its parent's capabilities with {}",
            wider.join(",")
        ));
    }
    if child.expires > parent.expires {
        return bad("expires after its parent".into());
    }
    if (&child.model_path, &child.model_hash, &child.qspec_hash)
        != (&parent.model_path, &parent.model_hash, &parent.qspec_hash)
    {
        return bad("names a different model or qspec than its parent".into());
    }
    Ok(())
}

/// Derives a narrower child of `parent`, signed by the node key: `caps` must be a subset of
/// the parent's (default: the same), and `now + ttl` must not be later than the parent's expiry
/// (default: the parent's expiry). The parent must itself verify now.
pub fn attenuate(
    parent: &SignedGrant,
    caps: Option<&Caps>,
    ttl: Option<u64>,
    key: &SigningKey,
    now: u64,
    revoked: &RevocationList,
) -> Result<SignedGrant> {
    parent.verify(&key.verifying_key(), now, revoked)?;
    let p = &parent.grant;
    let caps = caps.cloned().unwrap_or_else(|| p.caps());
    let wider = caps.missing_from(&p.caps());
    if !wider.is_empty() {
        return Err(GuardError::Invalid(format!(
            "attenuation can only narrow: {} not in the parent grant's caps ({})",
            wider.join(","),
            p.caps()
        )));
    }
    let expires = match ttl {
        None => p.expires,
        Some(t) => {
            let e = now.saturating_add(t);
            if e > p.expires {
                return Err(GuardError::Invalid(format!(
                    "attenuation can only narrow: --ttl {t}s would expire {} after the parent grant",
                    human_secs(e - p.expires)
                )));
            }
            e
        }
    };
    let child = GrantPayload {
        v: 1,
        name: p.name.clone(),
        caps: caps.to_vec(),
        issued: now,
        expires,
        issuer: p.issuer.clone(),
        model_path: p.model_path.clone(),
        model_hash: p.model_hash.clone(),
        qspec_hash: p.qspec_hash.clone(),
        probes: Vec::new(),
        parent: Some(p.id()),
    };
    Ok(SignedGrant::sign(child, key, Some(parent.clone())))
}

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

/// The node's revocation list, signed so an offline verifier can trust a copy of it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RevocationList {
    /// Format version, 1.
    pub v: u32,
    /// Hex public key of the signing node.
    pub issuer: String,
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
    /// Loads and verifies a revocation list; a missing file is an empty list. A list that
    /// does not verify is an error (fail closed), never treated as empty.
    pub fn load(path: &Path, issuer: &VerifyingKey) -> Result<RevocationList> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(RevocationList::default())
            }
            Err(e) => return Err(GuardError::io("read", path, e)),
        };
        let s: SignedRevocations =
            serde_json::from_slice(&bytes).map_err(|e| GuardError::Json {
                path: path.to_path_buf(),
                source: e,
            })?;
        let bad = |why: &str| {
            Err(GuardError::GrantRefused(format!(
                "revocation list {}: {why}",
                path.display()
            )))
        };
        if s.list.issuer != hex(issuer.as_bytes()) {
            return bad("signed by another key");
        }
        let Some(sig) = unhex(&s.sig).and_then(|b| <[u8; 64]>::try_from(b).ok()) else {
            return bad("malformed signature");
        };
        let mut msg = REVOCATION_DOMAIN.to_vec();
        msg.extend_from_slice(&serde_json::to_vec(&s.list).expect("list serializes"));
        if issuer
            .verify_strict(&msg, &Signature::from_bytes(&sig))
            .is_err()
        {
            return bad("signature does not verify");
        }
        Ok(s.list)
    }

    /// Signs and writes the list atomically (0600).
    pub fn save(&self, path: &Path, key: &SigningKey) -> Result<()> {
        let mut list = self.clone();
        list.v = 1;
        list.issuer = hex(key.verifying_key().as_bytes());
        let mut msg = REVOCATION_DOMAIN.to_vec();
        msg.extend_from_slice(&serde_json::to_vec(&list).expect("list serializes"));
        let sig = hex(&key.sign(&msg).to_bytes());
        let mut bytes =
            serde_json::to_vec_pretty(&SignedRevocations { list, sig }).expect("serializes");
        bytes.push(b'\n');
        fsutil::write_atomic(path, &bytes, 0o600)
    }

    /// Whether any link of the grant's chain is revoked.
    pub fn revokes(&self, g: &SignedGrant) -> bool {
        g.chain().iter().any(|l| {
            let id = l.grant.id();
            self.entries.iter().any(|r| r.id == id)
        })
    }
}

/// First 12 hex digits, for messages.
pub fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

/// `90` -> `1m30s`.
pub fn human_secs(s: u64) -> String {
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// Checks a grant name: 1-64 of `[A-Za-z0-9._-]`, not starting with `.` (it names a file).
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(GuardError::Invalid(format!(
            "bad grant name {name:?}: use 1-64 of A-Z a-z 0-9 . _ - (not starting with '.')"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root(key: &SigningKey, caps: &str, now: u64) -> SignedGrant {
        let p = GrantPayload {
            v: 1,
            name: "qwen".into(),
            caps: Caps::parse(caps).unwrap().to_vec(),
            issued: now,
            expires: now + 600,
            issuer: hex(key.verifying_key().as_bytes()),
            model_path: "/m/qwen.knot".into(),
            model_hash: "ab".repeat(32),
            qspec_hash: "cd".repeat(32),
            probes: vec![],
            parent: None,
        };
        SignedGrant::sign(p, key, None)
    }

    fn key() -> SigningKey {
        SigningKey::generate(&mut rand::rngs::OsRng)
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let k = key();
        let g = root(&k, "net,fs", 1000);
        let bytes = g.to_bytes();
        let parsed = SignedGrant::from_bytes(&bytes, "t").unwrap();
        parsed
            .verify(&k.verifying_key(), 1001, &RevocationList::default())
            .unwrap();
        for i in 0..bytes.len() {
            for bit in [0x01u8, 0x20] {
                let mut b = bytes.clone();
                b[i] ^= bit;
                let ok = SignedGrant::from_bytes(&b, "t")
                    .and_then(|g| g.verify(&k.verifying_key(), 1001, &RevocationList::default()));
                assert!(ok.is_err(), "flip of bit {bit:#x} at byte {i} was accepted");
            }
        }
    }

    #[test]
    fn expiry_other_key_and_revocation_refused() {
        let k = key();
        let g = root(&k, "net", 1000);
        let none = RevocationList::default();
        assert!(g
            .verify(&k.verifying_key(), 1600, &none)
            .unwrap_err()
            .to_string()
            .contains("expired"));
        assert!(g
            .verify(&key().verifying_key(), 1001, &none)
            .unwrap_err()
            .to_string()
            .contains("issued by key"));
        let rl = RevocationList {
            v: 1,
            issuer: String::new(),
            entries: vec![Revocation {
                id: g.grant.id(),
                name: "qwen".into(),
                at: 1002,
            }],
        };
        assert!(g
            .verify(&k.verifying_key(), 1003, &rl)
            .unwrap_err()
            .to_string()
            .contains("revoked"));
    }

    #[test]
    fn attenuation_narrows_and_never_widens() {
        let k = key();
        let none = RevocationList::default();
        let g = root(&k, "net", 1000);
        let child = attenuate(
            &g,
            Some(&Caps::parse("").unwrap()),
            Some(60),
            &k,
            1010,
            &none,
        )
        .unwrap();
        child.verify(&k.verifying_key(), 1020, &none).unwrap();
        assert_eq!(child.grant.expires, 1070);
        assert_eq!(child.chain().len(), 2);
        // Wider caps or a later expiry are refused.
        assert!(attenuate(
            &g,
            Some(&Caps::parse("net,fs").unwrap()),
            None,
            &k,
            1010,
            &none
        )
        .is_err());
        assert!(attenuate(&g, None, Some(10_000), &k, 1010, &none).is_err());
        // A hand-forged widening child (re-signed by the node key even) fails the chain check.
        let mut wide = child.clone();
        wide.grant.caps = vec!["fs".into(), "net".into()];
        let forged = SignedGrant::sign(wide.grant, &k, Some(g.clone()));
        assert!(forged
            .verify(&k.verifying_key(), 1020, &none)
            .unwrap_err()
            .to_string()
            .contains("widens"));
        // Revoking the parent revokes the child.
        let rl = RevocationList {
            v: 1,
            issuer: String::new(),
            entries: vec![Revocation {
                id: g.grant.id(),
                name: "qwen".into(),
                at: 1030,
            }],
        };
        assert!(child.verify(&k.verifying_key(), 1031, &rl).is_err());
        assert!(rl.revokes(&child));
    }

    #[test]
    fn revocation_list_is_signed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("revoked.json");
        let k = key();
        let mut rl = RevocationList::default();
        rl.entries.push(Revocation {
            id: "ab".into(),
            name: "x".into(),
            at: 5,
        });
        rl.save(&p, &k).unwrap();
        assert_eq!(
            RevocationList::load(&p, &k.verifying_key())
                .unwrap()
                .entries
                .len(),
            1
        );
        assert!(RevocationList::load(&p, &key().verifying_key()).is_err());
        let text = std::fs::read_to_string(&p)
            .unwrap()
            .replace("\"x\"", "\"y\"");
        std::fs::write(&p, text).unwrap();
        assert!(RevocationList::load(&p, &k.verifying_key()).is_err());
    }

    #[test]
    fn caps_and_names_validated() {
        assert_eq!(Caps::parse("fs, net,net").unwrap().to_string(), "fs,net");
        assert!(Caps::parse("nett").is_err());
        assert!(check_name("../x").is_err());
        check_name("qwen-0.5b_ok").unwrap();
    }
}
