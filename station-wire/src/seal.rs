//! Sealing a mesh's traffic: ChaCha20-Poly1305 under a shared 32-byte mesh key.
//!
//! Three things are sealed, each with its own direction tag ([`SealDir`]): the client's
//! request to the entry (`request`: the token JSON), every residual between nodes (`hop`), and
//! the exit's answer back to the client (`response`: logits or the token JSON). A sealed body
//! is `nonce (12 bytes) || ciphertext || tag (16 bytes)`. The associated data binds everything
//! the receiver acts on, so changing any of it fails the tag:
//!
//! ```text
//! "aeon-mesh seal v1\0" dir \0 request_id \0 from_layer \0 session \0 pos \0 ts_ms \0 route \0 ret \0
//! ```
//!
//! `dir` keeps a seal made for one direction from being accepted in another (a request
//! replayed as a response, a response fed to a node as a residual); `from_layer` is the layer
//! boundary the body is at (0 for a request, the sender's range end for a residual, the
//! exit's range end for a response); `ts_ms` is the sealer's clock in Unix milliseconds;
//! `route` the remaining hops; `ret` what the exit answers (`logits` or `token`). Each station
//! keeps a replay window ([`ReplayWindow`]): a timestamp outside `now ± window` or a nonce
//! already seen in the window is refused. A client opens a response only under the request id
//! it chose itself, so an old response cannot answer a new request. Contract: `specs/mesh.md`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chacha20poly1305::aead::{AeadCore, AeadInPlace, KeyInit, OsRng};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce, Tag};

/// Associated-data domain of a sealed residual.
pub const SEAL_DOMAIN: &[u8] = b"aeon-mesh seal v1\0";
/// Nonce bytes at the front of a sealed body.
pub const NONCE_LEN: usize = 12;
/// Tag bytes at the end.
pub const TAG_LEN: usize = 16;

/// Why sealing, unsealing or loading a key failed.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error("mesh key {path}: {why}")]
    Key { path: String, why: String },
    #[error("sealed body of {0} bytes is shorter than nonce + tag")]
    Short(usize),
    #[error("seal does not verify: the body or its direction, request id, layer, session, position, time, route or return kind was changed, or the key differs")]
    Tampered,
    #[error("replayed: this nonce was already accepted")]
    Replayed,
    #[error("stale: sealed at {ts_ms} ms, {skew_ms} ms from this station's clock (window {window_ms} ms)")]
    Stale {
        ts_ms: u64,
        skew_ms: u64,
        window_ms: u64,
    },
}

/// Which way a sealed body travels; part of the associated data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SealDir {
    /// Client -> entry: the `{"tokens": [...]}` body.
    Request,
    /// Node -> node: a residual.
    Hop,
    /// Exit -> client (relayed unchanged by the nodes before it): logits or the token JSON.
    Response,
    /// Node -> replica: a session's state ([`crate::wire::ROUTE_CHECKPOINT`]).
    Checkpoint,
}

impl SealDir {
    /// The tag bound in the associated data.
    pub fn tag(self) -> &'static str {
        match self {
            SealDir::Request => "request",
            SealDir::Hop => "hop",
            SealDir::Response => "response",
            SealDir::Checkpoint => "checkpoint",
        }
    }
}

/// What the exit answers (`X-Return`), as bound by seals.
pub fn ret_tag(want_token: bool) -> &'static str {
    if want_token {
        "token"
    } else {
        "logits"
    }
}

/// The context a seal binds (besides the bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SealContext<'a> {
    pub dir: SealDir,
    pub request_id: &'a str,
    /// Layer boundary of the residual (the sender's range end).
    pub from_layer: u32,
    pub session: &'a str,
    pub pos: usize,
    pub ts_ms: u64,
    /// Remaining hops, as the `X-Route` header carries them (empty when none).
    pub route: &'a str,
    /// What the exit answers: `logits` or `token` ([`ret_tag`]).
    pub ret: &'a str,
}

impl SealContext<'_> {
    fn aad(&self) -> Vec<u8> {
        let mut a = SEAL_DOMAIN.to_vec();
        for part in [
            self.dir.tag(),
            self.request_id,
            &self.from_layer.to_string(),
            self.session,
            &self.pos.to_string(),
            &self.ts_ms.to_string(),
            self.route,
            self.ret,
        ] {
            a.extend_from_slice(part.as_bytes());
            a.push(0);
        }
        a
    }
}

/// A loaded mesh key.
#[derive(Clone)]
pub struct MeshKey {
    cipher: ChaCha20Poly1305,
}

impl std::fmt::Debug for MeshKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MeshKey(..)")
    }
}

impl MeshKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(k: &[u8; 32]) -> MeshKey {
        MeshKey {
            cipher: ChaCha20Poly1305::new(Key::from_slice(k)),
        }
    }

    /// Reads a key file: exactly 32 raw bytes (`head -c 32 /dev/urandom > key`) or 64 hex
    /// characters (optionally followed by a newline).
    pub fn load(path: &Path) -> Result<MeshKey, SealError> {
        let err = |why: String| SealError::Key {
            path: path.display().to_string(),
            why,
        };
        let b = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let raw: [u8; 32] = if b.len() == 32 {
            b.as_slice()
                .try_into()
                .map_err(|_| err("not 32 bytes".into()))?
        } else {
            let t = std::str::from_utf8(&b)
                .map_err(|_| {
                    err(format!(
                        "{} bytes: expected 32 raw bytes or 64 hex characters",
                        b.len()
                    ))
                })?
                .trim();
            unhex32(t).ok_or_else(|| {
                err(format!(
                    "{} bytes: expected 32 raw bytes or 64 hex characters",
                    b.len()
                ))
            })?
        };
        Ok(MeshKey::from_bytes(&raw))
    }

    /// Seals `plain` under a fresh random nonce (one copy of the body: encrypted in place in
    /// the output buffer).
    pub fn seal(&self, plain: &[u8], ctx: &SealContext) -> Vec<u8> {
        let nonce = ChaCha20Poly1305::generate_nonce(&mut OsRng);
        let aad = ctx.aad();
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        // Fails only for bodies over 256 GiB; the truncated result is refused as short.
        match self
            .cipher
            .encrypt_in_place_detached(&nonce, &aad, &mut out[NONCE_LEN..])
        {
            Ok(tag) => out.extend_from_slice(&tag),
            Err(_) => out.truncate(NONCE_LEN),
        }
        out
    }

    /// Verifies and decrypts; returns the plaintext and the nonce (for the replay window).
    pub fn open(
        &self,
        sealed: &[u8],
        ctx: &SealContext,
    ) -> Result<(Vec<u8>, [u8; NONCE_LEN]), SealError> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(SealError::Short(sealed.len()));
        }
        let (n, rest) = sealed.split_at(NONCE_LEN);
        let (ct, tag) = rest.split_at(rest.len() - TAG_LEN);
        let aad = ctx.aad();
        let mut plain = ct.to_vec();
        self.cipher
            .decrypt_in_place_detached(Nonce::from_slice(n), &aad, &mut plain, Tag::from_slice(tag))
            .map_err(|_| SealError::Tampered)?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(n);
        Ok((plain, nonce))
    }
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A fresh random request id (`c` + 24 hex digits), for clients that seal their requests.
pub fn random_request_id() -> String {
    let n = ChaCha20Poly1305::generate_nonce(&mut OsRng);
    format!("c{}", hex::encode(n))
}

/// Nonces accepted in the last `window`, per station: a repeat, or a timestamp outside the
/// window, is refused.
pub struct ReplayWindow {
    window: Duration,
    seen: Mutex<HashMap<[u8; NONCE_LEN], u64>>,
}

impl ReplayWindow {
    /// A window of `window` either side of this station's clock.
    pub fn new(window: Duration) -> Self {
        ReplayWindow {
            window,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Accepts `nonce` sealed at `ts_ms`, or refuses it.
    pub fn accept(&self, nonce: [u8; NONCE_LEN], ts_ms: u64) -> Result<(), SealError> {
        let now = now_ms();
        let w = self.window.as_millis() as u64;
        let skew = now.abs_diff(ts_ms);
        if skew > w {
            return Err(SealError::Stale {
                ts_ms,
                skew_ms: skew,
                window_ms: w,
            });
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        // Anything sealed before now - window is refused as stale, so it can be forgotten.
        seen.retain(|_, &mut t| now.saturating_sub(t) <= w);
        if seen.insert(nonce, ts_ms).is_some() {
            return Err(SealError::Replayed);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(ts: u64) -> SealContext<'static> {
        SealContext {
            dir: SealDir::Hop,
            request_id: "r1",
            from_layer: 8,
            session: "s",
            pos: 5,
            ts_ms: ts,
            route: "",
            ret: "logits",
        }
    }

    #[test]
    fn seal_round_trips_and_binds_every_context_field() {
        let k = MeshKey::from_bytes(&[7u8; 32]);
        let ts = now_ms();
        let plain = b"residual bytes".to_vec();
        let s = k.seal(&plain, &ctx(ts));
        assert_eq!(s.len(), NONCE_LEN + plain.len() + TAG_LEN);
        assert_eq!(k.open(&s, &ctx(ts)).unwrap().0, plain);
        let variants = [
            SealContext {
                request_id: "r2",
                ..ctx(ts)
            },
            SealContext {
                from_layer: 9,
                ..ctx(ts)
            },
            SealContext {
                session: "t",
                ..ctx(ts)
            },
            SealContext { pos: 6, ..ctx(ts) },
            SealContext {
                ts_ms: ts + 1,
                ..ctx(ts)
            },
            SealContext {
                route: "http://x",
                ..ctx(ts)
            },
            SealContext {
                ret: "token",
                ..ctx(ts)
            },
            SealContext {
                dir: SealDir::Request,
                ..ctx(ts)
            },
            SealContext {
                dir: SealDir::Response,
                ..ctx(ts)
            },
        ];
        for v in variants {
            assert!(
                matches!(k.open(&s, &v), Err(SealError::Tampered)),
                "{v:?} must not verify"
            );
        }
        for i in 0..s.len() {
            let mut t = s.clone();
            t[i] ^= 1;
            assert!(
                k.open(&t, &ctx(ts)).is_err(),
                "flipped byte {i} must not verify"
            );
        }
        assert!(matches!(
            MeshKey::from_bytes(&[8u8; 32]).open(&s, &ctx(ts)),
            Err(SealError::Tampered)
        ));
        assert!(matches!(
            k.open(&s[..20], &ctx(ts)),
            Err(SealError::Short(20))
        ));
    }

    #[test]
    fn a_request_seal_cannot_be_opened_as_a_response() {
        let k = MeshKey::from_bytes(&[7u8; 32]);
        let req = SealContext {
            dir: SealDir::Request,
            from_layer: 0,
            ..ctx(1)
        };
        let s = k.seal(br#"{"tokens":[1]}"#, &req);
        assert!(k.open(&s, &req).is_ok());
        let resp = SealContext {
            dir: SealDir::Response,
            ..req.clone()
        };
        assert!(matches!(k.open(&s, &resp), Err(SealError::Tampered)));
        let id = random_request_id();
        assert!(id.len() == 25 && id != random_request_id());
        assert!(crate::wire::valid_session_id(&id));
    }

    #[test]
    fn replay_window_refuses_repeats_and_stale_seals() {
        let w = ReplayWindow::new(Duration::from_secs(30));
        let now = now_ms();
        w.accept([1; 12], now).unwrap();
        assert!(matches!(w.accept([1; 12], now), Err(SealError::Replayed)));
        w.accept([2; 12], now).unwrap();
        assert!(matches!(
            w.accept([3; 12], now - 60_000),
            Err(SealError::Stale { .. })
        ));
        assert!(matches!(
            w.accept([3; 12], now + 60_000),
            Err(SealError::Stale { .. })
        ));
    }

    #[test]
    fn key_files_raw_or_hex() {
        let d = tempfile::tempdir().unwrap();
        let raw = d.path().join("raw");
        std::fs::write(&raw, [9u8; 32]).unwrap();
        let hex = d.path().join("hex");
        std::fs::write(&hex, format!("{}\n", "09".repeat(32))).unwrap();
        let a = MeshKey::load(&raw).unwrap();
        let b = MeshKey::load(&hex).unwrap();
        let s = a.seal(b"x", &ctx(1));
        assert_eq!(b.open(&s, &ctx(1)).unwrap().0, b"x");
        let bad = d.path().join("bad");
        std::fs::write(&bad, b"short").unwrap();
        assert!(MeshKey::load(&bad)
            .unwrap_err()
            .to_string()
            .contains("32 raw bytes"));
    }
}
