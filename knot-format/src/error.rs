//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong reading, writing, verifying or importing a KNOT.
///
/// Variants carry the path, offset or tensor name that locates the problem. Variants with a
/// `source` leave it out of their message (print the chain, e.g. anyhow's `{:#}`).
#[derive(Debug, thiserror::Error)]
pub enum KnotError {
    /// An I/O operation on `path` failed; `what` names the step.
    #[error("{what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the KNOT magic.
    #[error("{path}: not a KNOT file (magic {found:?}, expected \"KNOT\")")]
    BadMagic { path: PathBuf, found: String },
    /// The file is a GGUF model: it runs here once imported (`knot import`).
    #[error("{path} is a GGUF file, not a KNOT: convert it first with `knot import {path} -o MODEL.knot`")]
    IsGguf { path: PathBuf },
    /// The file is a KNOT of a version this reader does not know.
    #[error("{path}: unsupported KNOT version {version} (this reader knows version 1)")]
    UnsupportedVersion { path: PathBuf, version: u32 },
    /// The file is shorter or longer than its preamble says.
    #[error(
        "{path}: file is {actual} bytes but its preamble says {expected} (truncated or corrupt)"
    )]
    LengthMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    /// The preamble or header is structurally invalid.
    #[error("{path}: corrupt header: {reason}")]
    CorruptHeader { path: PathBuf, reason: String },
    /// The header bytes do not hash to the preamble's header hash.
    #[error("{path}: header hash mismatch (header is corrupt)")]
    HeaderHashMismatch { path: PathBuf },
    /// The header is not valid JSON of [`crate::Header`].
    #[error("{path}: header JSON invalid")]
    HeaderJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// One tensor's table entry is invalid.
    #[error("{path}: tensor {tensor:?}: {reason}")]
    BadTensorEntry {
        path: PathBuf,
        tensor: String,
        reason: String,
    },
    /// A tensor's bytes do not hash to the value in the header.
    #[error("{path}: tensor {tensor:?} is corrupt: blake3 {actual} != expected {expected}")]
    TensorHashMismatch {
        path: PathBuf,
        tensor: String,
        expected: String,
        actual: String,
    },
    /// A section's bytes (e.g. the tokenizer) do not hash to the value in the header.
    #[error("{path}: {section} section is corrupt (blake3 mismatch)")]
    SectionHashMismatch {
        path: PathBuf,
        section: &'static str,
    },
    /// The tokenizer section is not valid JSON of [`crate::TokenizerData`].
    #[error("{path}: tokenizer section JSON invalid")]
    TokenizerJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// [`crate::KnotWriter::add_tensor`] was given an invalid tensor.
    #[error("tensor {tensor:?}: {reason}")]
    InvalidTensor { tensor: String, reason: String },
    /// [`crate::KnotWriter::write`] was given a header readers would refuse (counts out of
    /// range, a shard range outside the model, ...); nothing was written.
    #[error("{path}: refusing to write an invalid header: {reason}")]
    InvalidHeader { path: PathBuf, reason: String },
    /// The GGUF file is malformed at `offset`.
    #[error("{path}: malformed GGUF at byte {offset}: {reason}")]
    Gguf {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    /// A metadata key the importer needs is missing or has the wrong type.
    #[error("{path}: GGUF metadata {key:?}: {reason}")]
    GgufMetadata {
        path: PathBuf,
        key: String,
        reason: String,
    },
    /// The GGUF architecture is one KNOT does not know how to describe.
    #[error("{path}: unsupported architecture {arch:?} (known: {known})")]
    UnsupportedArch {
        path: PathBuf,
        arch: String,
        known: String,
    },
    /// A GGUF tensor has a type KNOT does not store.
    #[error(
        "{path}: tensor {tensor:?} has GGML type {ggml_type}, which KNOT does not support ({})",
        crate::dtype::DType::unsupported_ggml_label(*.ggml_type)
    )]
    UnsupportedDType {
        path: PathBuf,
        tensor: String,
        ggml_type: u32,
    },
}

impl KnotError {
    /// True when the error means the file's content is corrupt or hostile (as opposed to an
    /// I/O failure or unsupported-but-valid input). `knot verify` exits 1 on these.
    pub fn is_integrity(&self) -> bool {
        !matches!(
            self,
            KnotError::Io { .. }
                | KnotError::IsGguf { .. }
                | KnotError::InvalidTensor { .. }
                | KnotError::InvalidHeader { .. }
                | KnotError::UnsupportedArch { .. }
                | KnotError::UnsupportedDType { .. }
                | KnotError::UnsupportedVersion { .. }
        )
    }

    /// The tensor this error names, if any.
    pub fn tensor(&self) -> Option<&str> {
        match self {
            KnotError::BadTensorEntry { tensor, .. }
            | KnotError::TensorHashMismatch { tensor, .. }
            | KnotError::InvalidTensor { tensor, .. }
            | KnotError::UnsupportedDType { tensor, .. } => Some(tensor),
            _ => None,
        }
    }

    pub(crate) fn io(what: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        KnotError::Io {
            what,
            path: path.into(),
            source,
        }
    }
}
