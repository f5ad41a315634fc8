//! GPT-2's reversible byte <-> unicode mapping.
//!
//! Byte-level BPE vocabularies store every token as a string of printable characters: each byte
//! of the token's UTF-8 text is replaced by one character. The 188 printable bytes (`!`..=`~`,
//! `¡`..=`¬`, `®`..=`ÿ`) stand for themselves; the other 68 (control characters, space, DEL,
//! NBSP, soft hyphen) are given the code points 256, 257, ... in byte order. So a space is `Ġ`
//! (U+0120) and a newline `Ċ` (U+010A). Every mapped character is below U+0144.

/// One past the largest code point the mapping produces (256 + 68).
const MAPPED_LIMIT: usize = 324;

/// Marks a code point that no byte maps to.
const NO_BYTE: u16 = u16::MAX;

/// True for the bytes GPT-2 keeps as their own code point.
const fn is_printable(b: u8) -> bool {
    matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// The table `byte -> char` and its inverse.
pub(crate) struct ByteLevel {
    /// `to_char[b]`: the character that stands for byte `b`.
    to_char: [char; 256],
    /// `to_byte[c]`: the byte that character `c` stands for, or `NO_BYTE`. (MAPPED_LIMIT,)
    to_byte: [u16; MAPPED_LIMIT],
}

impl ByteLevel {
    /// Builds both tables.
    pub(crate) fn new() -> ByteLevel {
        let mut to_char = ['\0'; 256];
        let mut to_byte = [NO_BYTE; MAPPED_LIMIT];
        let mut next = 256u32;
        for b in 0..=255u8 {
            let cp = if is_printable(b) {
                u32::from(b)
            } else {
                next += 1;
                next - 1
            };
            // Every value here is below U+0144, so always a valid scalar value.
            let c = char::from_u32(cp).unwrap_or('\u{FFFD}');
            to_char[usize::from(b)] = c;
            to_byte[cp as usize] = u16::from(b);
        }
        ByteLevel { to_char, to_byte }
    }

    /// The character that stands for byte `b`.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn char_of(&self, b: u8) -> char {
        self.to_char[usize::from(b)]
    }

    /// The byte that character `c` stands for, if it is one of the mapped characters.
    pub(crate) fn byte_of(&self, c: char) -> Option<u8> {
        let i = c as usize;
        if i < MAPPED_LIMIT && self.to_byte[i] != NO_BYTE {
            Some(self.to_byte[i] as u8)
        } else {
            None
        }
    }

    /// Decodes a vocabulary string into the bytes it stands for, appending them to `out`.
    /// Returns false (and leaves `out` as it was) if some character is not a mapped one.
    pub(crate) fn decode_into(&self, token: &str, out: &mut Vec<u8>) -> bool {
        let start = out.len();
        for c in token.chars() {
            match self.byte_of(c) {
                Some(b) => out.push(b),
                None => {
                    out.truncate(start);
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_is_a_bijection_with_gpt2_landmarks() {
        let bl = ByteLevel::new();
        assert_eq!(bl.char_of(b' '), 'Ġ');
        assert_eq!(bl.char_of(b'\n'), 'Ċ');
        assert_eq!(bl.char_of(b'\t'), 'ĉ');
        assert_eq!(bl.char_of(b'A'), 'A');
        assert_eq!(bl.char_of(0x00), 'Ā');
        assert_eq!(bl.char_of(0xAD), 'Ń');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = bl.char_of(b);
            assert!(seen.insert(c), "byte {b} maps to a duplicate {c:?}");
            assert_eq!(bl.byte_of(c), Some(b));
        }
        assert_eq!(bl.byte_of(' '), None);
        assert_eq!(bl.byte_of('€'), None);
    }

    #[test]
    fn decode_into_rejects_unmapped_and_keeps_buffer() {
        let bl = ByteLevel::new();
        let mut out = vec![1u8];
        assert!(bl.decode_into("ĠParis", &mut out));
        assert_eq!(out, b"\x01 Paris");
        assert!(!bl.decode_into("a b", &mut out));
        assert_eq!(out, b"\x01 Paris");
    }
}
