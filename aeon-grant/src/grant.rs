//! Signed capability grants and their attenuated children.
//!
//! Encoding (`specs/qspec.md`, "Grant encoding"): a grant file is the canonical JSON of
//! [`SignedGrant`] followed by one newline. Canonical means serde_json's compact output of
//! these structs, fields in declaration order, `null` for absent options, hex in lowercase.
//! The signature is ed25519 over `GRANT_DOMAIN || canonical(payload)`. A reader re-encodes
//! what it parsed and refuses bytes that differ, and reads hex only in lowercase, so *any*
//! changed byte is refused: the JSON no longer parses, or is not canonical, or the signature
//! no longer verifies.

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::caps::Caps;
use crate::encoding::{hex, unhex_array};
use crate::error::GrantError;
use crate::revocation::RevocationList;

/// Signature domain of grant payloads.
pub const GRANT_DOMAIN: &[u8] = b"monster-guard grant v1\0";

/// The outcome of one quality probe, as recorded in the grant that it earned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeSummary {
    /// The probe's name.
    pub name: String,
    /// Whether every check of the probe held.
    pub pass: bool,
    /// Expected token id and text.
    pub expected: u32,
    pub expected_text: Option<String>,
    /// Rank of the expected id (0 = argmax).
    pub expected_rank: u32,
    /// The model's argmax and its text.
    pub argmax: u32,
    pub argmax_text: Option<String>,
    /// Logits of the argmax and of the expected id.
    pub logit: f64,
    pub expected_logit: f64,
    /// Expected logit minus the best other logit.
    pub margin: f64,
    /// Mean NLL of the perplexity passage, when asked.
    pub nll: Option<f64>,
    /// Why it failed (empty when it passed).
    pub failures: Vec<String>,
}

impl ProbeSummary {
    /// One line for people: `PASS paris: " Paris" (12095) is the argmax (logit 14.557), margin +4.162`.
    pub fn line(&self) -> String {
        let exp = fmt_tok(self.expected, &self.expected_text);
        let verdict = if self.pass { "PASS" } else { "FAIL" };
        let mut s = if self.argmax == self.expected {
            format!(
                "{verdict} {}: {exp} is the argmax (logit {:.3}), margin {:+.3}",
                self.name, self.expected_logit, self.margin
            )
        } else {
            format!(
                "{verdict} {}: expected {exp} (logit {:.3}, rank {}) but argmax {} (logit {:.3}); margin {:+.3}",
                self.name,
                self.expected_logit,
                self.expected_rank,
                fmt_tok(self.argmax, &self.argmax_text),
                self.logit,
                self.margin
            )
        };
        if let Some(n) = self.nll {
            s.push_str(&format!(", nll {n:.3}"));
        }
        if !self.failures.is_empty() {
            s.push_str(&format!(" [{}]", self.failures.join("; ")));
        }
        s
    }
}

fn fmt_tok(id: u32, text: &Option<String>) -> String {
    match text {
        Some(t) => format!("{t:?} ({id})"),
        None => format!("id {id}"),
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
        // Serializing plain structs of strings, integers, finite floats and vectors cannot
        // fail; an empty encoding would not verify, so no panic is needed here.
        serde_json::to_vec(self).unwrap_or_default()
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

/// Deepest attenuation chain read (a hostile file cannot make a verifier recurse further).
pub const MAX_CHAIN: usize = 32;

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
        let mut v = serde_json::to_vec(self).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// Parses a grant file's bytes, refusing anything but the one canonical encoding
    /// (compact JSON in field order, lowercase hex, one trailing newline). `origin` names the
    /// file or header in messages.
    pub fn from_bytes(bytes: &[u8], origin: &str) -> Result<SignedGrant, GrantError> {
        let g: SignedGrant = serde_json::from_slice(bytes)
            .map_err(|e| GrantError::Malformed(format!("{origin}: corrupted? {e}")))?;
        if g.chain().len() > MAX_CHAIN {
            return Err(GrantError::Malformed(format!(
                "{origin}: attenuation chain longer than {MAX_CHAIN}"
            )));
        }
        if g.to_bytes() != bytes {
            return Err(GrantError::Malformed(format!(
                "{origin}: not in canonical form (compact JSON, lowercase hex, one trailing \
                 newline): the file was modified after signing"
            )));
        }
        Ok(g)
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

    fn check_signature(&self, issuer: &VerifyingKey) -> Result<(), GrantError> {
        let refuse = |why: String| GrantError::Refused {
            name: self.grant.name.clone(),
            why,
        };
        if self.grant.issuer != hex(issuer.as_bytes()) {
            return Err(refuse(format!(
                "was issued by key {}, not by the trusted issuer {}",
                short(&self.grant.issuer),
                short(&hex(issuer.as_bytes()))
            )));
        }
        let sig = unhex_array::<64>(&self.sig)
            .map(|b| Signature::from_bytes(&b))
            .ok_or_else(|| refuse("malformed signature (128 lowercase hex digits)".into()))?;
        let mut msg = GRANT_DOMAIN.to_vec();
        msg.extend_from_slice(&self.grant.canonical());
        issuer
            .verify_strict(&msg, &sig)
            .map_err(|_| refuse("signature does not verify (modified or forged)".into()))
    }

    /// Offline verification with the issuer's public key only: every link's signature, that
    /// each child narrows its parent (same name and model, caps a subset, expiry not later),
    /// expiry against `now`, and the revocation list (any revoked link revokes the grant).
    pub fn verify(
        &self,
        issuer: &VerifyingKey,
        now: u64,
        revoked: &RevocationList,
    ) -> Result<(), GrantError> {
        let chain = self.chain();
        let last = chain.len() - 1;
        for (i, link) in chain.iter().enumerate() {
            link.check_signature(issuer)?;
            let g = &link.grant;
            let refuse = |why: String| GrantError::Refused {
                name: g.name.clone(),
                why,
            };
            if g.v != 1 {
                return Err(refuse(format!("unknown version {}", g.v)));
            }
            if i == 0 && g.parent.is_some() {
                return Err(refuse("names a parent but carries none".into()));
            }
            if i > 0 {
                check_narrows(&chain[i - 1].grant, g)?;
            }
            if now >= g.expires {
                return Err(refuse(format!(
                    "expired {} ago (at unix time {})",
                    human_secs(now - g.expires),
                    g.expires
                )));
            }
            let id = g.id();
            if let Some(r) = revoked.find(&id) {
                let why = if i == last {
                    format!("({}) was revoked at unix time {}", short(&id), r.at)
                } else {
                    format!(
                        "the grant it was attenuated from ({}) was revoked at unix time {}, \
                         and its children fall with it",
                        short(&id),
                        r.at
                    )
                };
                return Err(GrantError::Revoked {
                    name: self.grant.name.clone(),
                    why,
                });
            }
        }
        Ok(())
    }
}

/// Checks that `child` is a proper attenuation of `parent`.
fn check_narrows(parent: &GrantPayload, child: &GrantPayload) -> Result<(), GrantError> {
    let bad = |why: String| {
        Err(GrantError::Refused {
            name: child.name.clone(),
            why,
        })
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
) -> Result<SignedGrant, GrantError> {
    parent.verify(&key.verifying_key(), now, revoked)?;
    let p = &parent.grant;
    let caps = caps.cloned().unwrap_or_else(|| p.caps());
    let wider = caps.missing_from(&p.caps());
    if !wider.is_empty() {
        return Err(GrantError::Invalid(format!(
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
                return Err(GrantError::Invalid(format!(
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

/// The model binding of a grant: BLAKE3 of the whole model file, streamed, lowercase hex. What
/// `monster-guard delegate` writes into `model_hash`, what `run` re-hashes, and what a station
/// under `--require-grant` compares with the file it serves: one definition for all three.
pub fn model_file_hash(path: &std::path::Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut f, &mut h)?;
    Ok(h.finalize().to_hex().to_string())
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
pub fn check_name(name: &str) -> Result<(), GrantError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(GrantError::Invalid(format!(
            "bad grant name {name:?}: use 1-64 of A-Z a-z 0-9 . _ - (not starting with '.')"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::revocation::Revocation;

    pub(crate) fn root(key: &SigningKey, caps: &str, now: u64) -> SignedGrant {
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
            probes: vec![ProbeSummary {
                name: "paris".into(),
                pass: true,
                expected: 12095,
                expected_text: Some(" Paris".into()),
                expected_rank: 0,
                argmax: 12095,
                argmax_text: Some(" Paris".into()),
                logit: 14.59,
                expected_logit: 14.59,
                margin: 4.21,
                nll: None,
                failures: vec![],
            }],
            parent: None,
        };
        SignedGrant::sign(p, key, None)
    }

    fn key() -> SigningKey {
        SigningKey::generate(&mut rand::rngs::OsRng)
    }

    fn list_of(ids: &[&str]) -> RevocationList {
        RevocationList {
            v: 1,
            issuer: String::new(),
            seq: 1,
            entries: ids
                .iter()
                .map(|id| Revocation {
                    id: id.to_string(),
                    name: "qwen".into(),
                    at: 1002,
                })
                .collect(),
        }
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

    /// Issue 17.6: the station used to accept what `monster-guard verify` refused.
    #[test]
    fn uppercase_signature_and_missing_newline_are_refused() {
        let k = key();
        let g = root(&k, "net", 1000);
        let good = g.to_bytes();
        let text = String::from_utf8(good.clone()).unwrap();
        let upper = text.replace(&g.sig, &g.sig.to_ascii_uppercase());
        assert_ne!(upper, text);
        let e = SignedGrant::from_bytes(upper.as_bytes(), "t")
            .and_then(|g| g.verify(&k.verifying_key(), 1001, &RevocationList::default()))
            .unwrap_err();
        assert!(e.to_string().contains("malformed signature"), "{e}");
        let e = SignedGrant::from_bytes(&good[..good.len() - 1], "t").unwrap_err();
        assert!(e.to_string().contains("canonical"), "{e}");
        let e = SignedGrant::from_bytes(text.replace(':', ": ").as_bytes(), "t").unwrap_err();
        assert!(e.to_string().contains("canonical"), "{e}");
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
            .contains("not by the trusted issuer"));
        let e = g
            .verify(&k.verifying_key(), 1003, &list_of(&[&g.grant.id()]))
            .unwrap_err();
        assert!(matches!(e, GrantError::Revoked { .. }), "{e}");
        assert!(
            e.to_string().contains("was revoked at unix time 1002"),
            "{e}"
        );
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
        let again = SignedGrant::from_bytes(&child.to_bytes(), "t").unwrap();
        assert_eq!(again, child);
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
        let mut later = child.clone();
        later.grant.expires = 2000;
        let forged = SignedGrant::sign(later.grant, &k, Some(g.clone()));
        assert!(forged
            .verify(&k.verifying_key(), 1020, &none)
            .unwrap_err()
            .to_string()
            .contains("expires after"));
        // Revoking the parent revokes the child.
        let e = child
            .verify(&k.verifying_key(), 1031, &list_of(&[&g.grant.id()]))
            .unwrap_err();
        assert!(e.to_string().contains("attenuated from"), "{e}");
    }

    #[test]
    fn names_validated() {
        assert!(check_name("../x").is_err());
        check_name("qwen-0.5b_ok").unwrap();
    }
}
