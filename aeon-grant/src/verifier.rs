//! Verification against one trusted issuer, as the mesh entry does it (`fat-station
//! --require-grant`): the same parser and chain check as `monster-guard verify`
//! ([`SignedGrant::from_bytes`], [`SignedGrant::verify`]), plus an optional watched
//! revocation list with its watermark, and the model binding: a grant admits the one model
//! it was minted for ([`GrantVerifier::for_model`]), not whatever the checker happens to serve.

use std::path::Path;
use std::sync::Arc;

use ed25519_dalek::VerifyingKey;

use crate::encoding::{parse_public, unhex, unhex_array};
use crate::error::GrantError;
use crate::grant::{short, SignedGrant};
use crate::revocation::{RevocationList, WatchedList, Watermark};

/// What a verified grant says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    pub name: String,
    pub caps: Vec<String>,
    pub expires: u64,
    /// The model it was minted for: BLAKE3 (hex) of the whole model file.
    pub model_hash: String,
}

/// Verifies grants signed by one issuer.
#[derive(Clone, Debug)]
pub struct GrantVerifier {
    issuer: VerifyingKey,
    /// The issuer's revocation list, when one is watched.
    revocations: Option<Arc<WatchedList>>,
    /// The model grants must be minted for ([`crate::model_file_hash`] of it), when bound.
    model: Option<String>,
}

impl GrantVerifier {
    /// For grants signed by `issuer`.
    pub fn new(issuer: VerifyingKey) -> GrantVerifier {
        GrantVerifier {
            issuer,
            revocations: None,
            model: None,
        }
    }

    /// From the issuer's public key: 64 lowercase hex characters, or a file holding them
    /// (monster-guard's `node.pub`, or `monster-guard pubkey export > issuer.pub`).
    pub fn from_arg(arg: &str) -> Result<GrantVerifier, GrantError> {
        if let Ok(k) = parse_public(arg) {
            return Ok(GrantVerifier::new(k));
        }
        let text = std::fs::read_to_string(arg).map_err(|e| {
            GrantError::BadIssuer(format!(
                "{arg}: not 64 lowercase hex characters and not a readable file ({e})"
            ))
        })?;
        let k = parse_public(&text).map_err(|e| GrantError::BadIssuer(format!("{arg}: {e}")))?;
        Ok(GrantVerifier::new(k))
    }

    /// The trusted issuer.
    pub fn issuer(&self) -> &VerifyingKey {
        &self.issuer
    }

    /// Also refuses grants on the issuer's signed revocation list at `path`, re-read whenever
    /// the file changes, and keeps the highest sequence seen under `state_dir` (an older list or
    /// a deleted one is refused after a newer one was seen). Fails when the list does not verify
    /// now.
    pub fn with_revocations(
        mut self,
        path: &Path,
        state_dir: &Path,
    ) -> Result<GrantVerifier, GrantError> {
        let w = Watermark::in_dir(state_dir, &self.issuer);
        self.revocations = Some(Arc::new(WatchedList::open(path, self.issuer, Some(w))?));
        Ok(self)
    }

    /// Also refuses grants minted for any other model than the one whose [`crate::model_file_hash`]
    /// is `model_hash` (what `monster-guard delegate` writes into `model_hash` for that file).
    /// Without it a grant for a tiny model would open a station serving a large one.
    pub fn for_model(mut self, model_hash: &str) -> Result<GrantVerifier, GrantError> {
        let h = model_hash.trim();
        if unhex_array::<32>(h).is_none() {
            return Err(GrantError::Invalid(format!(
                "model hash {h:?} is not 64 lowercase hex characters (a BLAKE3)"
            )));
        }
        self.model = Some(h.to_string());
        Ok(self)
    }

    /// The model hash grants are bound to, when bound.
    pub fn model(&self) -> Option<&str> {
        self.model.as_deref()
    }

    /// Whether a revocation list is watched.
    pub fn checks_revocations(&self) -> bool {
        self.revocations.is_some()
    }

    /// Verifies a grant file's bytes at Unix time `now`.
    pub fn verify(&self, file: &[u8], now: u64) -> Result<Verified, GrantError> {
        let g = SignedGrant::from_bytes(file, "grant")?;
        let list = match &self.revocations {
            Some(w) => w.current()?,
            None => Arc::new(RevocationList::default()),
        };
        g.verify(&self.issuer, now, &list)?;
        // Every link names the same model (the chain check above), so the leaf's is the chain's.
        if let Some(m) = &self.model {
            if &g.grant.model_hash != m {
                return Err(GrantError::Refused {
                    name: g.grant.name.clone(),
                    why: format!(
                        "minted for another model (blake3 {}, {}), not the one served here \
                         (blake3 {})",
                        short(&g.grant.model_hash),
                        g.grant.model_path,
                        short(m)
                    ),
                });
            }
        }
        Ok(Verified {
            name: g.grant.name.clone(),
            caps: g.grant.caps.clone(),
            expires: g.grant.expires,
            model_hash: g.grant.model_hash.clone(),
        })
    }

    /// Verifies the hex-encoded grant file of an `X-Grant` header (lowercase hex).
    pub fn verify_header(&self, hex_value: &str, now: u64) -> Result<Verified, GrantError> {
        let bytes = unhex(hex_value.trim())
            .ok_or_else(|| GrantError::Malformed("X-Grant is not lowercase hex".into()))?;
        self.verify(&bytes, now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::hex;
    use crate::grant::{attenuate, GrantPayload};
    use crate::revocation::Revocation;
    use ed25519_dalek::SigningKey;

    fn mint(key: &SigningKey, name: &str, expires: u64) -> SignedGrant {
        SignedGrant::sign(
            GrantPayload {
                v: 1,
                name: name.into(),
                caps: vec!["net".into()],
                issued: 1000,
                expires,
                issuer: hex(key.verifying_key().as_bytes()),
                model_path: "/m.knot".into(),
                model_hash: "ab".repeat(32),
                qspec_hash: "ab".repeat(32),
                probes: vec![],
                parent: None,
            },
            key,
            None,
        )
    }

    fn replace(path: &Path, bytes: &[u8]) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn grants_verify_offline_and_tampering_is_refused() {
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let v = GrantVerifier::from_arg(&hex(key.verifying_key().as_bytes())).unwrap();
        let g = mint(&key, "qwen", 2000).to_bytes();
        assert_eq!(v.verify(&g, 1500).unwrap().name, "qwen");
        assert!(v.verify_header(&hex(&g), 1500).is_ok());
        assert!(v
            .verify_header(&hex(&g).to_ascii_uppercase(), 1500)
            .is_err());
        assert!(v
            .verify(&g, 2000)
            .unwrap_err()
            .to_string()
            .contains("expired"));
        let other = SigningKey::from_bytes(&[6u8; 32]);
        assert!(v
            .verify(&mint(&other, "qwen", 2000).to_bytes(), 1500)
            .unwrap_err()
            .to_string()
            .contains("not by the trusted issuer"));
        assert!(matches!(
            v.verify(b"{}", 1500),
            Err(GrantError::Malformed(_))
        ));
        assert!(GrantVerifier::from_arg("/nonexistent/issuer.pub").is_err());
    }

    /// Issue 32.4: a verifier bound to a model refuses a grant minted for another one, an
    /// attenuated child included, and accepts the grant for its own model.
    #[test]
    fn a_bound_verifier_refuses_grants_for_another_model() {
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a.knot"), d.path().join("b.knot"));
        std::fs::write(&a, b"tiny model A").unwrap();
        std::fs::write(&b, b"the model B this station serves").unwrap();
        let hash_b = crate::model_file_hash(&b).unwrap();
        assert_eq!(
            hash_b,
            blake3::hash(b"the model B this station serves")
                .to_hex()
                .to_string()
        );
        let for_file = |path: &Path| {
            let mut g = mint(&key, "m", 2000);
            g.grant.model_path = path.display().to_string();
            g.grant.model_hash = crate::model_file_hash(path).unwrap();
            SignedGrant::sign(g.grant, &key, None)
        };
        let v = GrantVerifier::new(key.verifying_key())
            .for_model(&hash_b)
            .unwrap();
        assert_eq!(v.model(), Some(hash_b.as_str()));
        let ok = v.verify(&for_file(&b).to_bytes(), 1500).unwrap();
        assert_eq!(ok.model_hash, hash_b);
        let ga = for_file(&a);
        let e = v.verify(&ga.to_bytes(), 1500).unwrap_err();
        assert!(matches!(e, GrantError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("minted for another model"), "{e}");
        let none = RevocationList::default();
        let child = attenuate(&ga, None, Some(100), &key, 1500, &none).unwrap();
        assert!(v.verify(&child.to_bytes(), 1500).is_err());
        // Unbound, the same grant passes: the binding is what refuses it.
        assert!(GrantVerifier::new(key.verifying_key())
            .verify(&ga.to_bytes(), 1500)
            .is_ok());
        assert!(GrantVerifier::new(key.verifying_key())
            .for_model("AB")
            .is_err());
    }

    #[test]
    fn revoked_grants_and_their_children_are_refused_after_a_reload() {
        let d = tempfile::tempdir().unwrap();
        let list = d.path().join("revoked.json");
        let key = SigningKey::from_bytes(&[5u8; 32]);
        let v = GrantVerifier::new(key.verifying_key())
            .with_revocations(&list, &d.path().join("state"))
            .unwrap();
        assert!(v.checks_revocations());
        let parent = mint(&key, "qwen", 2000);
        let none = RevocationList::default();
        let child = attenuate(&parent, None, Some(100), &key, 1500, &none).unwrap();
        let other = mint(&key, "other", 2000).to_bytes();
        assert!(v.verify(&child.to_bytes(), 1500).is_ok());
        let revoked = RevocationList {
            seq: 1,
            entries: vec![Revocation {
                id: parent.grant.id(),
                name: "qwen".into(),
                at: 1400,
            }],
            ..Default::default()
        };
        replace(&list, &revoked.to_signed_bytes(&key));
        let e = v.verify(&parent.to_bytes(), 1500).unwrap_err();
        assert!(matches!(e, GrantError::Revoked { .. }), "{e}");
        assert!(e.to_string().contains("revoked at unix time 1400"), "{e}");
        let e = v.verify(&child.to_bytes(), 1500).unwrap_err().to_string();
        assert!(e.contains("the grant it was attenuated from"), "{e}");
        assert!(v.verify(&other, 1500).is_ok());
        // An older list (sequence 0, empty) put back: every grant refused, fail closed.
        replace(&list, &RevocationList::default().to_signed_bytes(&key));
        let e = v.verify(&other, 1500).unwrap_err();
        assert!(matches!(e, GrantError::Revocations { .. }), "{e}");
        // The list deleted: the same, at run time and at start.
        std::fs::remove_file(&list).unwrap();
        assert!(v.verify(&parent.to_bytes(), 1500).is_err());
        assert!(GrantVerifier::new(key.verifying_key())
            .with_revocations(&list, &d.path().join("state"))
            .is_err());
        replace(&list, &revoked.to_signed_bytes(&key));
        assert!(v.verify(&other, 1500).is_ok());
    }
}
