//! KNOT: the model container. See `specs/knot-format.md`.
//!
//! Knows bytes, not maths: layouts, names, hashes, shards. Never depends on the engine.
//!
//! ```no_run
//! let knot = knot_format::Knot::open("model.knot")?;
//! let q = knot.tensor("blk.0.attn_q.weight").expect("tensor present");
//! println!("{} {:?} {} bytes", q.entry.dtype, q.entry.shape, q.bytes.len());
//! # Ok::<(), knot_format::KnotError>(())
//! ```

#[cfg(feature = "cli")]
pub mod cli;
pub mod container;
pub mod dtype;
pub mod error;
pub mod gguf;
pub mod header;
pub mod import;
pub mod model_cache;
pub mod writer;

pub use container::{layer_of, Knot, TensorView};
pub use dtype::DType;
pub use error::KnotError;
pub use header::{
    ArchConfig, DeltaNetShape, ExpertGroups, Header, Holdings, LayerRange, MlaConfig, MoeConfig,
    Multipliers, RecurrentLayers, Role, RopeScaling, RopeStyle, SectionRef, ShardRecord, SsmShape,
    TensorEntry, TokenizerData, RUNNABLE_ARCHS,
};
pub use import::{import_gguf, ImportSummary};
pub use writer::KnotWriter;

#[cfg(test)]
mod tests;
