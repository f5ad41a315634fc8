//! The HTTP station: one model (or a layer range of it) served over the routes of
//! `specs/station-wire.md`.
//!
//! - [`server`]: the [`Station`] state (model, sessions, limits, mesh identity) and the helpers
//!   every handler uses (compute permits, sessions, refusals, encodings).
//! - [`response_budget`]: the bound on response bytes held for clients that do not read.
//! - [`metrics`]: the station's `/metrics`.
//!
//! The connection frame (accept loop, limits, bounded bodies), the idle heap trim and the
//! Prometheus writer are the `http-frame` crate, which `moonshine serve` runs on too.
//! - [`routes`]: the route table (`/health`, `/embed`, `/forward`, `/lm-head`, `/tokenize`,
//!   `/detokenize`, `/vocab`, `/metrics`, and `/chain` from [`crate::mesh::relay`]) and [`serve`].

pub mod metrics;
pub mod response_budget;
pub mod routes;
pub mod server;
pub mod weight_memory;

pub use routes::{bind, serve};
pub use server::{Limits, Station};
