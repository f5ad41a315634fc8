//! aeon-grant: the grant format and its one verifier.
//!
//! A grant is what monster-guard mints when a model passes its quality spec: an ed25519-signed
//! statement of who may run which model with which capabilities until when, optionally
//! narrowed by attenuated children, and undone by the issuer's signed revocation list
//! (`specs/qspec.md`, "Grant encoding" and "Revocation list").
//!
//! Why a crate of its own: two programs check grants, `monster-guard` (run, verify, list) and
//! `fat-station` at the mesh entry (`--require-grant`). Data flows format -> engine -> station
//! -> tools, so the format cannot live in fat-station (monster-guard, a control-plane tool,
//! must not pull in the engine) nor in monster-guard (a tool, above the station). Like
//! `knot-format`, it sits at the bottom: serde, ed25519 and BLAKE3, nothing else. Before it
//! existed the two programs carried two parsers of one format that disagreed (the station
//! accepted an uppercase-hex signature and a file without its trailing newline, which
//! `monster-guard verify` refused); now both call [`SignedGrant::from_bytes`] and
//! [`SignedGrant::verify`], and the format has exactly one accepted encoding.
//!
//! Modules: [`grant`] (payload, signed envelope, canonical form, chain verification,
//! attenuation), [`revocation`] (the signed, sequenced revocation list, the highest-sequence
//! watermark that refuses an older or deleted list, and a watched list that re-reads on change),
//! [`verifier`] (verification against one trusted issuer, as the station uses it), [`caps`]
//! (the capability names a grant can carry), [`encoding`] (the one hex form), [`probe`] (what a
//! quality probe reports, the figures a grant's [`ProbeSummary`] is judged from).

pub mod caps;
pub mod encoding;
pub mod error;
pub mod grant;
pub mod probe;
pub mod revocation;
pub mod verifier;

pub use caps::{Caps, CAPS};
pub use error::GrantError;
pub use grant::{
    attenuate, check_name, human_secs, model_file_hash, short, GrantPayload, ProbeSummary,
    SignedGrant, GRANT_DOMAIN,
};
pub use probe::{ProbeReport, TopEntry};
pub use revocation::{
    load_list, Revocation, RevocationList, WatchedList, Watermark, REVOCATION_DOMAIN,
};
pub use verifier::{GrantVerifier, Verified};

/// Unix seconds now.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
