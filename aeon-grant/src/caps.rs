//! The capability names a grant can carry. What each allows the leased command to keep is
//! enforced by `monster-guard run` and written down in `specs/caps.md`.

use std::collections::BTreeSet;

use crate::error::GrantError;

/// The capabilities a grant can carry, with what each allows under `monster-guard run`.
pub const CAPS: &[(&str, &str)] = &[
    ("net", "network access; without it the command runs in a new, empty network namespace (or with IP sockets denied)"),
    ("fs", "a writable filesystem; without it the command runs in a private mount namespace whose root mount is read-only"),
];

/// A validated, sorted, duplicate-free set of capability names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Caps(pub BTreeSet<String>);

impl Caps {
    /// Parses `net,fs` (empty or `none` = no capabilities). Unknown names are refused so a
    /// typo cannot silently grant or drop something.
    pub fn parse(s: &str) -> Result<Caps, GrantError> {
        let s = s.trim();
        let mut set = BTreeSet::new();
        if s.is_empty() || s == "none" {
            return Ok(Caps(set));
        }
        for c in s.split(',').map(str::trim) {
            if !CAPS.iter().any(|(k, _)| *k == c) {
                let known: Vec<_> = CAPS.iter().map(|(k, _)| *k).collect();
                return Err(GrantError::Invalid(format!(
                    "unknown capability {c:?} (known: {})",
                    known.join(", ")
                )));
            }
            set.insert(c.to_string());
        }
        Ok(Caps(set))
    }

    /// Whether the capability is present.
    pub fn has(&self, cap: &str) -> bool {
        self.0.contains(cap)
    }

    /// The names, sorted.
    pub fn to_vec(&self) -> Vec<String> {
        self.0.iter().cloned().collect()
    }

    /// Capabilities in `self` that `other` lacks.
    pub fn missing_from(&self, other: &Caps) -> Vec<String> {
        self.0.difference(&other.0).cloned().collect()
    }
}

impl std::fmt::Display for Caps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return f.write_str("none");
        }
        f.write_str(&self.to_vec().join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_validated() {
        assert_eq!(Caps::parse("fs, net,net").unwrap().to_string(), "fs,net");
        assert_eq!(Caps::parse("none").unwrap().to_string(), "none");
        assert!(Caps::parse("nett").is_err());
    }
}
