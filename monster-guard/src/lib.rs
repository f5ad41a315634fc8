//! monster-guard: quality-gated admission, signed capability grants, leases and revocation.
//!
//! A model is admitted only because it proved its quality: `delegate` runs a quality spec
//! (`specs/qspec.md`) through `paris-probe` child processes and mints an ed25519-signed grant
//! only when every probe passes. `run` starts a command under a grant: it checks the signature
//! chain, expiry, revocation and that the model file still hashes the same, starts the command
//! contained (its whole process tree in a PID namespace, else under a subreaper) with only the
//! capabilities its caps map to (`specs/caps.md`), and ends the whole tree at lease expiry,
//! revocation, the command's exit or monster-guard's own death. The grant format and its
//! verifier live in the `aeon-grant` crate, shared with the station.
//!
//! This is a control-plane tool: it never links the engine.
//!
//! Exit statuses of the CLI: 0 success (for `run`: the command's own status, 128+N when it died
//! of signal N); 2 error (bad input, missing key, probe failure); 3 refused (quality spec
//! failed, or grant invalid, expired, revoked, not covering the caps, or its model changed);
//! [`lease::EXIT_LEASE_EXPIRED`] (124) the lease ended the command;
//! [`lease::EXIT_REVOKED`] (125) revocation ended it; [`lease::EXIT_INTERRUPTED`] (130)
//! monster-guard was interrupted and stopped it.

pub mod cli;
pub mod commands;
pub mod contain;
pub mod error;
pub mod fsutil;
pub mod grant;
pub mod identity;
pub mod lease;
pub mod linux_caps;
pub mod qspec;

pub use error::{GuardError, Result};

/// Exit status for errors that are not verdicts.
pub const EXIT_ERROR: u8 = 2;
/// Exit status for a refusal: quality spec failed, or the grant does not allow the run.
pub const EXIT_REFUSED: u8 = 3;
