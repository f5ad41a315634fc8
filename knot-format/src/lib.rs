//! KNOT: the model container. See `specs/knot-format.md`.
//!
//! Knows bytes, not maths: layouts, names, hashes, shards. Never depends on the engine.

pub mod dtype;
pub mod header;

pub use dtype::DType;
pub use header::{ArchConfig, Header, LayerRange, Role, RopeStyle, ShardRecord, TensorEntry, TokenizerData};
