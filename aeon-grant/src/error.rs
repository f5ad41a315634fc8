//! Why a grant, a list or an argument was refused.

/// Everything the format's readers and verifiers refuse.
#[derive(Debug, thiserror::Error)]
pub enum GrantError {
    /// A bad argument (capability name, grant name, attenuation request).
    #[error("{0}")]
    Invalid(String),
    /// The trusted issuer's key could not be read.
    #[error("issuer key: {0}")]
    BadIssuer(String),
    /// Not a grant, or not in the one canonical encoding.
    #[error("not a grant: {0}")]
    Malformed(String),
    /// A well-formed grant that does not verify: signature, issuer, chain, expiry.
    #[error("grant {name:?}: {why}")]
    Refused { name: String, why: String },
    /// The grant, or a grant it was attenuated from, is on the revocation list.
    #[error("grant {name:?}: {why}")]
    Revoked { name: String, why: String },
    /// The revocation list cannot be trusted (unreadable, forged, older than one already
    /// seen, or deleted after one was seen): every grant is refused until a valid list is back.
    #[error("revocation list {path}: {why}; refusing every grant until it verifies")]
    Revocations { path: String, why: String },
}
