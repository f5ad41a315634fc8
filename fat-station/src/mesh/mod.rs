//! The mesh: stations that each hold a layer range and pass one token's residual along a
//! chain (contract: `specs/mesh.md`).
//!
//! - [`manifest`]: what one node serves and whom it forwards to (read at start).
//! - [`beacon`]: discovery over UDP and the elector that forms chains (control path only).
//! - [`node`]: a station's place in a mesh ([`MeshNode`]); [`relay`]: `POST /chain`, which
//!   runs this node's layers and forwards the residual to the next hop.
//! - [`seal`]: the AEAD that seals requests, residuals and answers between nodes.
//! - [`grant`]: admission at the entry (monster-guard grants, verified by `aeon-grant`).
//! - [`replicas`]: the client side of a chain, with failover between replica chains.

pub mod beacon;
pub mod grant;
pub mod node;
pub mod relay;

pub use node::MeshNode;
// The client side of a chain and the seal live in `station-wire`: tools use them without
// linking the station.
pub use station_wire::{manifest, replicas, seal};
