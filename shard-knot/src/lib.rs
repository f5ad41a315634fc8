//! Splits a KNOT into per-node shards (and, in `plan`, plans node layer ranges by node RAM).
//!
//! A shard is an ordinary, verifiable KNOT that holds one contiguous range of transformer
//! blocks at their ORIGINAL indices, plus what its role in the pipeline needs:
//!
//! | role  | range        | holds                                                        |
//! |-------|--------------|--------------------------------------------------------------|
//! | entry | `0..a`       | `token_embd.weight` + blocks `0..a`                          |
//! | mid   | `a..b`       | blocks `a..b`                                                |
//! | exit  | `b..L`       | blocks `b..L` + `output_norm.weight` + `output.weight` (or `token_embd.weight` when the head is tied) |
//! | full  | `0..L`       | everything                                                   |
//!
//! Every shard carries the architecture and the tokenizer (so any node can tokenize) and a
//! [`knot_format::ShardRecord`] naming the parent model's hash. Tensor bytes are copied
//! bit-for-bit from the parent's mmap. Contract: `specs/shards.md`.
//!
//! The RAM planner (`shard-knot plan`) lives in [`plan`]; the binary's command line in [`cli`].

pub mod cli;
pub mod inspect;
pub mod plan;
pub mod split;

pub use inspect::{summarize, Breakdown, ShardSummary};
pub use split::{
    even_ranges, parse_ranges, role_for, select_tensors, shard_file_name, split, split_bytes,
    ShardOutput,
};

use std::path::PathBuf;

use knot_format::{KnotError, LayerRange, Role};

/// Why a split or an inspection failed.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// The parent (or a shard) could not be opened or read.
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: Box<KnotError>,
    },
    /// A shard could not be written.
    #[error("writing shard {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: Box<KnotError>,
    },
    /// The output directory could not be created.
    #[error("creating output directory {path}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The input is already a shard; shards are cut from whole models only.
    #[error("{path} is already a shard ({role:?} layers {layers}); split the whole model instead")]
    AlreadyShard {
        path: PathBuf,
        role: Role,
        layers: LayerRange,
    },
    /// A `--ranges` item could not be parsed.
    #[error("bad range {item:?}: {reason}")]
    BadRange { item: String, reason: String },
    /// The ranges overlap, are out of order, or leave the model.
    #[error("ranges {ranges}: {reason}")]
    BadRanges { ranges: String, reason: String },
    /// `--nodes` cannot split the model evenly (0 nodes, or more nodes than layers).
    #[error("cannot split {layers} layers over {nodes} nodes: {reason}")]
    BadNodes {
        nodes: u32,
        layers: u32,
        reason: &'static str,
    },
    /// The parent lacks a tensor this shard's role needs.
    #[error(
        "{path}: a {role:?} shard of layers {layers} needs {what}, which the model does not hold"
    )]
    Incomplete {
        path: PathBuf,
        role: Role,
        layers: LayerRange,
        what: String,
    },
}
