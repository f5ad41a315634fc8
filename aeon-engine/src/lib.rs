//! The inference engine: kernels, transformer forward pass, KV cache, tokenizer.
//!
//! No I/O beyond the mmap: `forward(tokens or residual, layer range, session)`.
//! Three plain structs carry it: [`Config`] (validated hyper-parameters), [`Weights`]
//! (typed views into the mmap) and [`Session`] (KV cache + scratch).

mod config;
mod deltanet;
pub mod kernels;
pub mod mla;
mod model;
pub mod moe;
pub mod ops;
pub mod sampling;
mod session;
mod shortconv;
mod ssm;
mod state_transfer;
mod team;
pub mod tokenizer;
mod weights;

pub use config::{Activation, Arch, Config, MoeRules, QueryScale, Recipe, RopeScale, Yarn};
pub use deltanet::DeltaState;
pub use model::Model;
pub use session::{
    KvDtype, KvRows, LayerCache, RecurrentState, Scratch, Session, SCRATCH_KEEP_BYTES,
};
pub use shortconv::{Checkpoints, ConvState};
pub use ssm::{softplus, SsmConfig, SsmKind, SsmState, SsmWeights};
pub use state_transfer::{state_record_position, StateError, STATE_MAGIC};
pub use weights::{
    AttnWeights, DeltaNetWeights, Ffn, Holdings, LayerWeights, Mixer, ShortConvWeights, Weights,
};

use knot_format::LayerRange;

/// Why the engine refused a request or a model.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("invalid model config: {0}")]
    BadConfig(String),
    #[error("tensor {0:?} is missing from the model file")]
    MissingTensor(String),
    #[error("tensor {name:?}: {why}")]
    BadTensor { name: String, why: String },
    #[error("this station does not hold {what} (it holds layers {held})")]
    NotHeld { what: String, held: LayerRange },
    #[error("layer range {requested} is outside the model (holds {held})")]
    BadRange {
        requested: LayerRange,
        held: LayerRange,
    },
    #[error("residual of {len} floats is not a whole number of rows of hidden size {hidden}")]
    BadResidual { len: usize, hidden: usize },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    BadToken { id: u32, vocab: usize },
    #[error("session holds {have} positions; adding {adding} exceeds its limit of {max}")]
    ContextFull {
        have: usize,
        adding: usize,
        max: usize,
    },
    #[error("{rows} logit rows asked of a residual of {seq} rows")]
    BadRows { rows: usize, seq: usize },
    #[error("session out of step: {0}")]
    SessionMismatch(String),
}
