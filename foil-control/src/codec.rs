//! Small, dependency-free codecs used by the record type and the log:
//! standard base64 (RFC 4648 §4, with padding) and CRC-32 (IEEE 802.3, the
//! zlib/PNG polynomial).

/// The standard base64 alphabet (RFC 4648 §4).
const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Encodes `bytes` as padded standard base64.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        out.push(B64[(n >> 18) as usize & 63] as char);
        out.push(B64[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            B64[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            B64[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

/// Why a base64 string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    /// The length is not a multiple of 4 (padding is required).
    #[error("base64 length {0} is not a multiple of 4")]
    Length(usize),
    /// A byte outside the alphabet, or padding in the wrong place.
    #[error("invalid base64 byte {byte:#04x} at offset {offset}")]
    Byte {
        /// The offending byte.
        byte: u8,
        /// Its offset in the input.
        offset: usize,
    },
}

fn b64_value(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some(u32::from(c - b'A')),
        b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes padded standard base64. Whitespace is not accepted.
pub fn base64_decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    let s = text.as_bytes();
    #[allow(clippy::manual_is_multiple_of)] // is_multiple_of needs Rust 1.87; MSRV is 1.80
    if s.len() % 4 != 0 {
        return Err(Base64Error::Length(s.len()));
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3);
    let quads = s.len() / 4;
    for (qi, quad) in s.chunks_exact(4).enumerate() {
        let last = qi + 1 == quads;
        // Padding may only appear in the last quad, as "xx==" or "xxx=".
        let pad = match (quad[2], quad[3]) {
            (b'=', b'=') if last => 2,
            (_, b'=') if last => 1,
            _ => 0,
        };
        let mut n = 0u32;
        for (i, &c) in quad.iter().enumerate() {
            let v = if i >= 4 - pad {
                0
            } else {
                b64_value(c).ok_or(Base64Error::Byte {
                    byte: c,
                    offset: qi * 4 + i,
                })?
            };
            n = (n << 6) | v;
        }
        out.push((n >> 16) as u8);
        if pad < 2 {
            out.push((n >> 8) as u8);
        }
        if pad < 1 {
            out.push(n as u8);
        }
    }
    Ok(out)
}

/// CRC-32 lookup table for the reflected IEEE polynomial 0xEDB88320.
const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xEDB8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC-32 (IEEE, as zlib's `crc32`) of `bytes`.
pub fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in bytes {
        c = CRC_TABLE[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8);
    }
    c ^ 0xFFFF_FFFF
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        // The standard check value for CRC-32/ISO-HDLC.
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn base64_rfc4648_vectors() {
        let cases = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, enc) in cases {
            assert_eq!(base64_encode(plain.as_bytes()), enc);
            assert_eq!(base64_decode(enc).unwrap(), plain.as_bytes());
        }
    }

    #[test]
    fn base64_roundtrips_all_bytes() {
        let bytes: Vec<u8> = (0..=255u8).chain((0..=255u8).rev()).collect();
        for len in 0..bytes.len() {
            let enc = base64_encode(&bytes[..len]);
            assert_eq!(base64_decode(&enc).unwrap(), &bytes[..len]);
        }
    }

    #[test]
    fn base64_rejects_garbage() {
        assert_eq!(base64_decode("abc"), Err(Base64Error::Length(3)));
        assert!(matches!(
            base64_decode("ab!d"),
            Err(Base64Error::Byte {
                byte: b'!',
                offset: 2
            })
        ));
        // Padding in the middle is an error.
        assert!(base64_decode("Zg==Zm9v").is_err());
        assert!(base64_decode("=AAA").is_err());
    }
}
