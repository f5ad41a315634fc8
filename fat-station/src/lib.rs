//! fat-station: the inference engine and the HTTP station that serves it.
//!
//! Rooms, bottom up (`specs/architecture.md`):
//! - [`engine`]: kernels, weights, the forward pass, KV sessions, the tokenizer.
//! - [`wire`]: the contract between a station and its callers (routes, headers, bodies).
//! - [`station`]: the hyper server over the engine (connections, state, route table).
//! - [`mesh`]: manifests, discovery, the `/chain` relay, sealing, admission, replica chains.
//! - [`client`]: the blocking client that moonshine, paris-probe and the tools call.
//! - [`cli`]: the `fat-station` binary's flags and start-up.

pub mod cli;
pub mod client;
pub mod engine;
pub mod mesh;
pub mod station;
pub mod wire;
