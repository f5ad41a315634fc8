//! foil-control: the collector for forward residues.
//!
//! Probes post the residue of a forward pass (argmax, logit, top-k, optionally the final
//! residual vector) under a key such as `MODEL:dense:785,6722`; anyone can look it up later.
//! Records are kept in a bounded, fsynced, append-only log ([`store`]) that is replayed on start.
//!
//! - [`record`]: the record and wire types, shared by server and clients.
//! - [`client`]: a blocking `std::net` client (`admit`, `lookup`, `health`); no tokio needed.
//! - [`store`]: the durable store (log format, recovery, eviction, compaction).
//! - [`server`]: the hyper server (feature `server`, on by default).
//! - [`cli`]: the binary's command line and start-up (feature `server`).
//!
//! A client-only dependency avoids tokio and hyper:
//! `foil-control = { path = "../foil-control", default-features = false }`.
//! The HTTP contract is in `specs/foil-control.md`.

#[cfg(feature = "server")]
pub mod cli;
pub mod client;
pub mod record;
#[cfg(feature = "server")]
pub mod server;
pub mod store;

pub use client::{AdmitOutcome, FoilClientError};
pub use record::{Disposition, ResidueRecord, TopK};
