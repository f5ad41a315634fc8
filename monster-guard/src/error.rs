//! The crate's typed error.

use std::path::PathBuf;

/// Everything that can go wrong in monster-guard's library.
///
/// Variants carry the path or name they concern. [`GuardError::exit_code`] maps each to the
/// documented exit status of the CLI.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// A file could not be read, written, renamed or created.
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A JSON file did not parse.
    #[error("{path}: invalid JSON")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// The node identity is missing.
    #[error("no node key at {0}: run `monster-guard init` first")]
    NoKey(PathBuf),
    /// `init` without `--force` over an existing identity.
    #[error("node key already exists at {0}; refusing to overwrite it (use --force)")]
    KeyExists(PathBuf),
    /// A secret file readable by group or others.
    #[error("{path} has mode {mode:04o}: it must not be readable by other users (chmod 600)")]
    InsecureMode { path: PathBuf, mode: u32 },
    /// A key file whose content is not a key.
    #[error("{path}: {reason}")]
    BadKey { path: PathBuf, reason: String },
    /// Bad user input (names, capabilities, durations, spec fields).
    #[error("{0}")]
    Invalid(String),
    /// The qspec itself is unusable (not a quality verdict).
    #[error("qspec {path}: {reason}")]
    Spec { path: PathBuf, reason: String },
    /// The model file cannot be judged (e.g. it is not a KNOT).
    #[error("model {path}: {reason}")]
    Model { path: PathBuf, reason: String },
    /// The probe could not be run or misbehaved (not a quality verdict).
    #[error("probe {probe}: {reason}")]
    Probe { probe: String, reason: String },
    /// The quality spec ran and failed: the model is refused. The message names the probes.
    #[error("quality spec failed: {0}")]
    QualityFailed(String),
    /// A grant was refused: bad signature, expired, revoked, caps not covered, model changed.
    #[error("grant refused: {0}")]
    GrantRefused(String),
    /// Spawning or supervising the leased command failed.
    #[error("lease: {0}")]
    Lease(String),
}

impl GuardError {
    /// Builds an [`GuardError::Io`].
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        GuardError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// The message with its sources, `outer: inner: ...` (for embedding in another message).
    pub fn full(&self) -> String {
        let mut s = self.to_string();
        let mut cur: Option<&dyn std::error::Error> = std::error::Error::source(self);
        while let Some(e) = cur {
            s.push_str(&format!(": {e}"));
            cur = e.source();
        }
        s
    }

    /// The CLI exit status for this error: 3 for a refusal (quality or grant), 2 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            GuardError::QualityFailed(_) | GuardError::GrantRefused(_) => crate::EXIT_REFUSED,
            _ => crate::EXIT_ERROR,
        }
    }
}

impl From<aeon_grant::GrantError> for GuardError {
    /// Bad arguments stay errors (exit 2); everything the format refuses is a refusal (exit 3).
    fn from(e: aeon_grant::GrantError) -> Self {
        use aeon_grant::GrantError as G;
        match e {
            G::Invalid(m) => GuardError::Invalid(m),
            G::BadIssuer(m) => GuardError::Invalid(format!("issuer key: {m}")),
            other => GuardError::GrantRefused(other.to_string()),
        }
    }
}

/// Result alias for the crate.
pub type Result<T, E = GuardError> = std::result::Result<T, E>;
