//! The HTTP station: one model (or a layer range of it) served over the routes of
//! `specs/station-wire.md`.
//!
//! - [`conn`]: connections (bound on count, header/idle timeouts, bounded bodies).
//! - [`server`]: the [`Station`] state (model, sessions, limits, mesh identity) and the helpers
//!   every handler uses (compute permits, sessions, refusals, encodings).
//! - [`heap`]: handing freed heap back to the kernel when the station goes idle.
//! - [`response_budget`]: the bound on response bytes held for clients that do not read.
//! - [`metrics`]: Prometheus text (histograms, the writer) and the station's `/metrics`.
//! - [`routes`]: the route table (`/health`, `/embed`, `/forward`, `/lm-head`, `/tokenize`,
//!   `/detokenize`, `/vocab`, `/metrics`, and `/chain` from [`crate::mesh::relay`]) and [`serve`].

pub mod conn;
pub mod heap;
pub mod metrics;
pub mod response_budget;
pub mod routes;
pub mod server;
pub mod weight_memory;

pub use conn::{serve_connections, serve_connections_with, ConnLimits};
pub use routes::{bind, serve};
pub use server::{Limits, Station};
