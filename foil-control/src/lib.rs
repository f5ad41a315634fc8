//! The collector server for forward residues.
