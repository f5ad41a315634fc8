//! The sliver launcher: runs a command in fresh namespaces + pivot_root, only for an admitted
//! (certified) base.
//!
//! - [`manifest`]: the BLAKE3 manifest of a rootfs.
//! - [`cert`]: node key, signed admission certificates and their store.
//! - [`plan`]: the validated request and its fixed-order list of setup operations.
//! - [`sliver`]: executes a plan (clone, PID 1 init, pivot_root, drop privileges, exec).
//! - [`mounts`]: recursive mount flags, read-only and masked paths (mountinfo).
//! - [`overlay`]: `--rw` through a copy-on-write layer; the per-base lock.
//! - [`cgroup`], [`netdev`]: cgroup limits and network setup.
//! - [`cli`]: the `swerve` command line (its commands, and what each one runs).

pub mod cert;
pub mod cgroup;
pub mod cli;
pub mod error;
pub mod manifest;
pub mod mounts;
pub mod netdev;
pub mod overlay;
pub mod plan;
pub mod sliver;

pub use error::{Result, SwerveError};
