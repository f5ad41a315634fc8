//! Byte sizes as users type them (`--node-ram 2.4G`, `--mem 512M`, `AEON_NODE_RAM=1GB`): the one
//! parser every tool of the workspace uses, so a size means the same bytes everywhere.
//!
//! The rule is GNU coreutils' (`dd`, `truncate`, `sort -S`), which `free -h`, `ls -h`, docker
//! `--memory`, systemd's `MemoryMax=` and the kernel's `mem=` agree with: a bare letter is
//! binary, a letter followed by `B` decimal, and `iB` spells binary outright.
//!
//! | unit | bytes |
//! |---|---|
//! | `B` | 1 |
//! | `K` / `M` / `G` / `T` (and `KiB` / `MiB` / `GiB` / `TiB`, `Ki` ...) | 2^10 / 2^20 / 2^30 / 2^40 |
//! | `KB` / `MB` / `GB` / `TB` | 10^3 / 10^6 / 10^9 / 10^12 |
//!
//! So `2.4G` = 2.4 GiB = 2_576_980_378 bytes (what `free -h` calls 2.4G, and what the R1 Mesh
//! Scaling Plan's "2.4 GB per node" is: see `specs/mesh.md`), `2.4GB` = 2_400_000_000.
//! A size is a number (digits, optionally a fraction: `2`, `2.4`, `.5`) and a unit, with an
//! optional space between them; units are case-insensitive. A number without a unit is refused
//! (`2.4` is not 2 bytes): the error suggests the unit its magnitude makes likely (`did you
//! mean 2.4G?`); plain bytes are written `4096B`. Fractions are rounded to the nearest byte.
//! Signs, exponents and sizes over `u64::MAX` are refused.

use std::fmt;

/// Why a size did not parse. `Display` is one line meant for a user: it quotes the input and
/// says what was expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SizeError {
    /// A number without a unit; `hint` is the input with the unit its magnitude suggests.
    NoUnit { input: String, hint: String },
    /// Not a number followed by a known unit.
    Invalid { input: String },
    /// More than `u64::MAX` bytes.
    TooLarge { input: String },
    /// Zero where a positive size is required ([`parse_size_nonzero`]).
    Zero { input: String },
}

impl fmt::Display for SizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SizeError::NoUnit { input, hint } => write!(
                f,
                "size {input:?} has no unit: did you mean {hint}? (B; K, M, G, T and KiB ... are powers of 1024, KB, MB, GB, TB powers of 1000)"
            ),
            SizeError::Invalid { input } => write!(
                f,
                "{input:?} is not a size: expected a number and a unit, e.g. 2.4G, 512M, 1GiB or 4096B"
            ),
            SizeError::TooLarge { input } => write!(f, "size {input:?} is too large"),
            SizeError::Zero { input } => write!(f, "size {input:?} must be more than 0 bytes"),
        }
    }
}

impl std::error::Error for SizeError {}

/// Bytes per unit; `None` for an unknown unit. `unit` is lower-case.
fn multiplier(unit: &str) -> Option<u64> {
    Some(match unit {
        "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return None,
    })
}

/// Parses a size by the rule of this module, e.g. `2.4GB` -> 2_400_000_000, `1G` -> 2^30.
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    let invalid = || SizeError::Invalid { input: s.into() };
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim_start());
    let (int, frac) = num.split_once('.').unwrap_or((num, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') || num.ends_with('.') {
        return Err(invalid());
    }
    if unit.is_empty() {
        return Err(SizeError::NoUnit {
            input: s.into(),
            hint: format!("{t}{}", guess_unit(int, frac)),
        });
    }
    let mult = multiplier(&unit.to_ascii_lowercase()).ok_or_else(invalid)?;
    // Exact arithmetic: int * mult + round(frac * mult / 10^len(frac)).
    let too_large = || SizeError::TooLarge { input: s.into() };
    let whole: u128 = if int.is_empty() {
        0
    } else {
        int.parse::<u128>().map_err(|_| too_large())?
    };
    let mut bytes = whole.checked_mul(mult as u128).ok_or_else(too_large)?;
    if !frac.is_empty() {
        // Digits past 20 cannot change a u64 result after rounding (and keep the product in u128).
        let f = &frac[..frac.len().min(20)];
        let scale = 10u128.pow(f.len() as u32);
        let num: u128 = f.parse().map_err(|_| invalid())?;
        let part = (num * mult as u128 + scale / 2) / scale;
        bytes = bytes.checked_add(part).ok_or_else(too_large)?;
    }
    u64::try_from(bytes).map_err(|_| too_large())
}

/// [`parse_size`], refusing zero (budgets, limits).
pub fn parse_size_nonzero(s: &str) -> Result<u64, SizeError> {
    match parse_size(s)? {
        0 => Err(SizeError::Zero { input: s.into() }),
        v => Ok(v),
    }
}

/// The unit a unit-less number most likely lacks: small numbers are RAM sizes in GB (`2.4`),
/// middling ones MB (`512`), large ones bytes (`1048576`).
fn guess_unit(int: &str, frac: &str) -> &'static str {
    let whole: u128 = int.parse().unwrap_or(0);
    match whole {
        0..=63 => "G",
        _ if !frac.is_empty() || whole < 100_000 => "M",
        _ => "B",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_letters_are_binary() {
        assert_eq!(parse_size("2.4G"), Ok(2_576_980_378));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("1.5T"), Ok(3 << 39));
        assert_eq!(parse_size(".5K"), Ok(512));
        assert_eq!(parse_size("2 g"), Ok(2 << 30));
    }

    #[test]
    fn ib_units_are_binary() {
        assert_eq!(parse_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert_eq!(parse_size("2.4GiB"), parse_size("2.4G"));
    }

    #[test]
    fn b_units_are_decimal() {
        assert_eq!(parse_size("2.4GB"), Ok(2_400_000_000));
        assert_eq!(parse_size("2.4 gb"), Ok(2_400_000_000));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("4kB"), Ok(4_000));
        assert_eq!(parse_size("7TB"), Ok(7_000_000_000_000));
    }

    #[test]
    fn bytes_need_their_unit() {
        assert_eq!(parse_size("4096B"), Ok(4096));
        assert_eq!(parse_size("0b"), Ok(0));
        assert_eq!(parse_size("1.6B"), Ok(2), "rounded to the nearest byte");
    }

    #[test]
    fn a_bare_number_is_refused_with_a_hint() {
        let e = parse_size("2.4").unwrap_err();
        assert_eq!(
            e,
            SizeError::NoUnit {
                input: "2.4".into(),
                hint: "2.4G".into()
            }
        );
        assert!(e.to_string().contains("did you mean 2.4G?"), "{e}");
        assert!(parse_size("512")
            .unwrap_err()
            .to_string()
            .contains("did you mean 512M?"));
        assert!(parse_size("1048576")
            .unwrap_err()
            .to_string()
            .contains("did you mean 1048576B?"));
    }

    #[test]
    fn garbage_is_refused() {
        for s in [
            "", "lots", "G", "-1G", "+1G", "1e9", "1.2.3G", "1.G", "2.4X", "2.4 G B", "1Gii",
            "1bb", "1iB",
        ] {
            assert!(
                matches!(parse_size(s), Err(SizeError::Invalid { .. })),
                "{s:?}: {:?}",
                parse_size(s)
            );
        }
        assert!(parse_size("lots")
            .unwrap_err()
            .to_string()
            .contains("e.g. 2.4G"));
    }

    #[test]
    fn overflow_and_zero_are_refused() {
        assert_eq!(parse_size("18446744073709551615B"), Ok(u64::MAX));
        assert!(matches!(
            parse_size("18446744073709551616B"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_size("99999999T"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_size("999999999999999999999999999999999999999999G"),
            Err(SizeError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_size_nonzero("0G"),
            Err(SizeError::Zero { .. })
        ));
        assert_eq!(parse_size_nonzero("1KB"), Ok(1000));
    }
}
