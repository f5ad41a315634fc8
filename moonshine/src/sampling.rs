//! The sampler: one home in the engine (`aeon_engine::sampling`), shared with the chain's exit
//! station so that the gateway and the exit pick the same ids.

pub use aeon_engine::sampling::*;
