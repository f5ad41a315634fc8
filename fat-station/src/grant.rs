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
//! Clients send the grant file's bytes hex-encoded in `X-Grant`. Revocation lists are not
//! consulted (offline); keep grants short-lived.

use ed25519_dalek::{Signature, VerifyingKey};
use serde::Deserialize;
use serde_json::value::RawValue;

/// Signature domain of grant payloads (monster-guard's `GRANT_DOMAIN`).
pub const GRANT_DOMAIN: &[u8] = b"monster-guard grant v1\0";

/// Why a grant was refused.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    #[error("issuer key: {0}")]
    BadIssuer(String),
    #[error("not a grant: {0}")]
    Malformed(String),
    #[error("grant {name:?}: {why}")]
    Refused { name: String, why: String },
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
        })
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
            prev = Some((p, id));
        }
        let (p, _) = prev.ok_or_else(|| GrantError::Malformed("empty chain".into()))?;
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
}
