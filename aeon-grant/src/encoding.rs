//! The one hex form of the format: lowercase, even length. Reading refuses anything else
//! (uppercase included), so a value has exactly one encoding and re-encoding what was read
//! gives back the same bytes.

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

/// Decodes lowercase hex; `None` on odd length, uppercase or any other character.
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    hex::decode(s).ok()
}

/// Decodes exactly `N` bytes of lowercase hex.
pub fn unhex_array<const N: usize>(s: &str) -> Option<[u8; N]> {
    unhex(s).and_then(|v| v.try_into().ok())
}

/// Parses an ed25519 public key written as 64 lowercase hex digits (surrounding whitespace,
/// e.g. the newline of `node.pub`, is ignored).
pub fn parse_public(text: &str) -> Result<ed25519_dalek::VerifyingKey, String> {
    let b: [u8; 32] = unhex_array(text.trim())
        .ok_or_else(|| "expected 64 lowercase hex digits (32 bytes)".to_string())?;
    ed25519_dalek::VerifyingKey::from_bytes(&b)
        .map_err(|e| format!("not an ed25519 public key: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_encoding() {
        assert_eq!(hex(&[0, 1, 254, 255]), "0001feff");
        assert_eq!(unhex("0001feff").unwrap(), vec![0, 1, 254, 255]);
        assert!(unhex("abc").is_none());
        assert!(unhex("zz").is_none());
        assert!(unhex("AB").is_none());
        assert!(unhex_array::<2>("abcd").is_some());
        assert!(unhex_array::<2>("abcdef").is_none());
    }
}
