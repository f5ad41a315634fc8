//! The one typed error of the swerve library.

use std::path::PathBuf;

/// Everything that can go wrong in swerve's library code.
#[derive(Debug, thiserror::Error)]
pub enum SwerveError {
    /// A file or directory could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What swerve was doing ("read", "create", "hash", ...).
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A base name is not of the form `base:NAME` with a safe NAME.
    #[error("bad base name {0:?}: expected base:NAME with NAME made of [A-Za-z0-9._-] (1-64 chars, not starting with '.')")]
    BadBaseName(String),
    /// No certificate exists for the base.
    #[error(
        "base:{base} has no certificate (admit it first: swerve admit base:{base} --rootfs DIR)"
    )]
    NoCertificate {
        /// The base name.
        base: String,
    },
    /// A certificate file is malformed.
    #[error("certificate {path}: {reason}")]
    BadCertificate {
        /// The certificate path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The certificate's signature does not verify, or was made by another key.
    #[error("certificate for base:{base} does not verify: {reason}")]
    SignatureInvalid {
        /// The base name.
        base: String,
        /// Why it failed.
        reason: String,
    },
    /// The rootfs no longer matches its certificate.
    #[error("rootfs {rootfs} does not match the certificate of base:{base}: first difference at {path} ({change})")]
    RootfsMismatch {
        /// The base name.
        base: String,
        /// The rootfs directory.
        rootfs: PathBuf,
        /// The first differing path, relative to the rootfs (starting with '/').
        path: String,
        /// What changed there.
        change: String,
    },
    /// The node key file is malformed.
    #[error("node key {path}: {reason}")]
    BadKey {
        /// The key path.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A command-line value could not be parsed.
    #[error("bad {what} {value:?}: {reason}")]
    BadArg {
        /// Which option.
        what: &'static str,
        /// The offending value.
        value: String,
        /// Why.
        reason: String,
    },
    /// A setup step of the sliver failed; names the step and errno.
    #[error("{step}: {errno}")]
    Step {
        /// The step, e.g. `pivot_root(/srv/rootfs)`.
        step: String,
        /// The errno.
        errno: nix::errno::Errno,
    },
    /// A setup step failed for a reason other than an errno.
    #[error("{step}: {reason}")]
    StepOther {
        /// The step.
        step: String,
        /// Why.
        reason: String,
    },
    /// A base (or a kept `--upper` directory) is held by another sliver in a way this one
    /// cannot share.
    #[error("{what} is in use: {reason}")]
    InUse {
        /// What is held, e.g. `base:scratch`.
        what: String,
        /// Why this sliver cannot start now.
        reason: String,
    },
    /// The process lacks the privileges to create namespaces.
    #[error("cannot create namespaces ({step}: {errno}); swerve needs root, or unprivileged user namespaces; refusing to run the command unconfined")]
    NoPrivileges {
        /// The step that failed.
        step: String,
        /// The errno.
        errno: nix::errno::Errno,
    },
}

impl From<mount_tree::MountError> for SwerveError {
    fn from(e: mount_tree::MountError) -> Self {
        match e {
            mount_tree::MountError::Step { step, errno } => SwerveError::Step { step, errno },
            mount_tree::MountError::Other { step, reason } => {
                SwerveError::StepOther { step, reason }
            }
        }
    }
}

impl SwerveError {
    /// Shorthand for an I/O error at a path.
    pub fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        SwerveError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}

/// Result alias for the swerve library.
pub type Result<T, E = SwerveError> = std::result::Result<T, E>;
