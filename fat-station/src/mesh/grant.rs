//! Offline verification of monster-guard grants at the mesh entry (`--require-grant`).
//!
//! The grant format, its parser (one canonical encoding) and its verifier live in the
//! `aeon-grant` crate, which `monster-guard verify` uses too: the station accepts exactly the
//! grants monster-guard accepts. Clients send the grant file's bytes hex-encoded (lowercase)
//! in `X-Grant`. With `--revocations`, the issuer's signed revocation list is re-read whenever
//! it changes, and the highest list sequence seen is kept in the station's `--state-dir`: an
//! older list put back, or the list deleted after one was seen, refuses every grant (503
//! `revocations_unverified`) until a list at least as new is back.

pub use aeon_grant::encoding::hex;
pub use aeon_grant::{now_s, GrantError, GrantVerifier, Verified, GRANT_DOMAIN, REVOCATION_DOMAIN};
