//! http-frame: the HTTP server frame under `fat-station` and `moonshine serve`.
//!
//! - [`conn`]: the accept loop and the limits that keep it up under slow, idle and numerous
//!   clients; bounded request bodies.
//! - [`heap`]: handing freed heap back to the kernel when a server goes idle.
//! - [`prometheus`]: the Prometheus text format (a fixed-bucket histogram and the writer).

pub mod conn;
pub mod heap;
pub mod prometheus;
