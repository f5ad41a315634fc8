//! fat-station: the inference engine and the HTTP station that serves it.
//!
//! Layers, bottom up: [`engine`] (kernels, forward pass, KV cache, tokenizer) ->
//! [`server`] (hyper station) -> [`wire`] (the contract) and [`client`] (what tools call).

pub mod client;
pub mod conn;
pub mod engine;
pub mod server;
pub mod wire;

// The mesh (specs/mesh.md).
pub mod beacon;
pub mod grant;
pub mod manifest;
pub mod relay;
pub mod replicas;
pub mod seal;
