//! The mesh: stations that each hold a layer range and pass one token's residual along a
//! chain (contract: `specs/mesh.md`).
//!
//! - [`node`]: a station's place in a mesh ([`MeshNode`]); [`relay`]: `POST /chain`, which
//!   runs this node's layers and forwards the residual to the next hop.
//! - [`ship`]: checkpoint shipping, a node's session states pushed to its replicas
//!   (`--checkpoint-to`) and taken by them (`POST /checkpoint`).
//! - [`grant`]: admission at the entry (monster-guard grants, verified by `aeon-grant`).
//!
//! What tools share with the station lives in `station-wire`, so they link no engine: the node
//! [`manifest`], the [`mesh_file`], the [`seal`] between nodes, the client side of a chain with failover
//! ([`replicas`]) and discovery over UDP with the elector that forms chains
//! (`station_wire::beacon`).

pub mod grant;
pub mod node;
pub mod relay;
pub mod ship;

pub use node::MeshNode;
pub use station_wire::{manifest, mesh_file, replicas, seal};
