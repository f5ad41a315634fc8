//! station-wire: what travels between a station and its callers, and the client that sends it.
//!
//! Nothing here computes on a model; the compiler keeps it so (no engine dependency), which lets
//! tools that only talk to stations (moonshine's client paths, probes, benches) link no kernels.
//! - [`wire`]: the contract (routes, headers, bodies; `specs/station-wire.md`).
//! - [`seal`]: the AEAD that seals requests, residuals and answers between nodes.
//! - [`client`]: the blocking client for one station.
//! - [`mesh_file`]: the mesh file (a chain's stations, and its replica chains).
//! - [`manifest`]: one mesh node's manifest (the file `shard-knot plan` writes).
//! - [`replicas`]: the client side of a chain, with failover between replica chains.
//! - [`beacon`]: discovery over UDP (stations announce, tools listen) and the elector that forms
//!   chains from what was heard (control path only).

pub mod beacon;
pub mod client;
pub mod manifest;
pub mod mdns;
pub mod mesh_file;
pub mod replicas;
pub mod seal;
pub mod wire;
