//! fat-station: the HTTP station that serves the engine, and the mesh it joins.
//!
//! Rooms, bottom up (`specs/architecture.md`):
//! - [`engine`]: the `aeon-engine` crate (kernels, weights, the forward pass, KV sessions,
//!   the tokenizer), re-exported so station code names it in one place.
//! - [`wire`], [`client`]: the `station-wire` crate (the contract between a station and its
//!   callers, and the blocking client moonshine, paris-probe and the tools call), re-exported.
//! - [`station`]: the hyper server over the engine (connections, state, route table).
//! - [`mesh`]: manifests, discovery, the `/chain` relay, sealing, admission, replica chains.
//! - [`cli`]: the `fat-station` binary's flags and start-up.

pub mod cli;
pub use aeon_engine as engine;
pub use station_wire::{client, wire};
pub mod mesh;
pub mod station;
