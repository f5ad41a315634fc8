//! The Linux capabilities a leased command may keep, per grant capability (`specs/caps.md`),
//! and dropping the rest in the process that will exec the command ([`sandbox_wall`]).
//!
//! A grant's caps are a ceiling: the command keeps at most the Linux capabilities its caps map
//! to, and only those the caller had. Nothing here asks for a right the caller lacks.

/// Linux capability numbers (`linux/capability.h`).
pub use sandbox_wall::caps::cap;

/// Grant capability -> the Linux capabilities the command may keep for it.
pub const MAPPING: &[(&str, &[(u32, &str)])] = &[
    (
        "net",
        &[
            (cap::NET_BIND_SERVICE, "CAP_NET_BIND_SERVICE"),
            (cap::NET_RAW, "CAP_NET_RAW"),
        ],
    ),
    (
        "fs",
        &[
            (cap::CHOWN, "CAP_CHOWN"),
            (cap::DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
            (cap::FOWNER, "CAP_FOWNER"),
            (cap::FSETID, "CAP_FSETID"),
        ],
    ),
];

/// The capability mask (bit N = capability N) a run with `caps` may keep.
pub fn allowed_mask(caps: &crate::grant::Caps) -> u64 {
    MAPPING
        .iter()
        .filter(|(g, _)| caps.has(g))
        .flat_map(|(_, l)| l.iter())
        .fold(0u64, |m, (n, _)| m | (1u64 << n))
}

/// Reduces this process's capability sets to `allowed` (the one implementation leases and
/// slivers share: [`sandbox_wall::caps::drop_to`]).
pub use sandbox_wall::caps::drop_to;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grant::Caps;

    #[test]
    fn mapping_masks() {
        assert_eq!(allowed_mask(&Caps::parse("").unwrap()), 0);
        assert_eq!(allowed_mask(&Caps::parse("net").unwrap()), 0x2400);
        assert_eq!(allowed_mask(&Caps::parse("fs").unwrap()), 0x1b);
        assert_eq!(allowed_mask(&Caps::parse("net,fs").unwrap()), 0x241b);
        // Every grant capability has a row.
        for (name, _) in crate::grant::CAPS {
            assert!(MAPPING.iter().any(|(g, _)| g == name), "{name} unmapped");
        }
    }
}
