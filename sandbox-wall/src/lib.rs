//! The wall every leased command (monster-guard) and every sliver (swerve) runs behind: one
//! seccomp policy ([`seccomp`]) and one way to drop capabilities ([`caps`]).
//!
//! Both launchers set up their namespaces and mounts first, then, in the process that will exec
//! the command, drop capabilities and install the filter last, right before exec. Data flows
//! one way: monster-guard and swerve depend on this crate; it depends on neither.

pub mod caps;
pub mod seccomp;

pub use seccomp::{Filter, Policy, WallError};
