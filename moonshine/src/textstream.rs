//! Text out as tokens come in: never half a UTF-8 character, never part of a stop string.
//!
//! The client has no tokenizer of its own (the station holds it), so text comes from
//! detokenizing ids over HTTP. Tokens are decoded in a small window that starts after the
//! last emitted character: while the window decodes to text ending in U+FFFD (the lossy mark
//! of an incomplete character, since a character is at most 4 bytes = at most 4 tokens), it
//! is held back. Text that could be the start of a stop string is held back too, until it
//! either completes the stop (generation ends, the stop is not emitted) or cannot.

/// Most tokens held back waiting for a character to complete (a UTF-8 character has at most
/// four bytes and every token has at least one).
const MAX_PENDING_TOKENS: usize = 4;

/// What one pushed token produced.
#[derive(Debug, Default, PartialEq)]
pub struct Piece {
    /// Text now safe to show (may be empty).
    pub text: String,
    /// A stop string was completed: generation should end (`text` ends just before it).
    pub stopped: bool,
}

/// Streaming detokenizer with stop strings.
#[derive(Debug, Default)]
pub struct TextStream {
    /// Ids whose text is not yet emitted because it ends in an incomplete character.
    pending: Vec<u32>,
    /// Decoded text held back because it may begin a stop string.
    held: String,
    stops: Vec<String>,
}

impl TextStream {
    /// A stream that ends at any of `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> TextStream {
        TextStream {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Default::default()
        }
    }

    /// Adds `id`; `detok` turns ids into (lossy) text.
    pub fn push<E>(
        &mut self,
        id: u32,
        detok: &mut impl FnMut(&[u32]) -> Result<String, E>,
    ) -> Result<Piece, E> {
        self.pending.push(id);
        let text = detok(&self.pending)?;
        if text.ends_with(char::REPLACEMENT_CHARACTER) && self.pending.len() < MAX_PENDING_TOKENS {
            return Ok(Piece::default());
        }
        self.pending.clear();
        self.held.push_str(&text);
        Ok(self.release(false))
    }

    /// Ends the stream: whatever is still held (an incomplete character lossily).
    pub fn finish<E>(
        &mut self,
        detok: &mut impl FnMut(&[u32]) -> Result<String, E>,
    ) -> Result<Piece, E> {
        if !self.pending.is_empty() {
            let text = detok(&self.pending)?;
            self.pending.clear();
            self.held.push_str(&text);
        }
        Ok(self.release(true))
    }

    /// Emits what cannot be part of a stop string; all of it when `last`.
    fn release(&mut self, last: bool) -> Piece {
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Piece {
                text,
                stopped: true,
            };
        }
        let keep = if last { 0 } else { self.stop_prefix_len() };
        let cut = self.held.len() - keep;
        let text = self.held[..cut].to_string();
        self.held.drain(..cut);
        Piece {
            text,
            stopped: false,
        }
    }

    /// Length in bytes of the longest suffix of `held` that is a proper prefix of a stop.
    fn stop_prefix_len(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            for (i, _) in h.char_indices() {
                let tail = &h[i..];
                if tail.len() <= best {
                    break;
                }
                if s.starts_with(tail) {
                    best = tail.len();
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    /// A fake byte-level vocabulary: id -> bytes; decoding is lossy like the station's.
    fn vocab() -> Vec<Vec<u8>> {
        vec![
            b"Hello".to_vec(),
            b" wor".to_vec(),
            b"ld".to_vec(),
            "é".as_bytes()[..1].to_vec(),   // 3: first byte of é
            "é".as_bytes()[1..].to_vec(),   // 4: second byte of é
            b" caf".to_vec(),               // 5
            b"\n\nUser".to_vec(),           // 6
            b":".to_vec(),                  // 7
            "😀".as_bytes()[..2].to_vec(),  // 8
            "😀".as_bytes()[2..3].to_vec(), // 9
            "😀".as_bytes()[3..].to_vec(),  // 10
        ]
    }

    fn run(ids: &[u32], stops: &[&str]) -> (Vec<String>, bool) {
        let v = vocab();
        let mut detok = |ids: &[u32]| -> Result<String, Infallible> {
            Ok(String::from_utf8_lossy(
                &ids.iter()
                    .flat_map(|&i| v[i as usize].clone())
                    .collect::<Vec<u8>>(),
            )
            .into_owned())
        };
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for &id in ids {
            let p = s.push(id, &mut detok).unwrap();
            out.push(p.text);
            if p.stopped {
                return (out, true);
            }
        }
        let p = s.finish(&mut detok).unwrap();
        out.push(p.text);
        (out, p.stopped)
    }

    #[test]
    fn split_characters_are_held_until_complete() {
        let (out, _) = run(&[5, 3, 4, 8, 9, 10], &[]);
        assert_eq!(out, [" caf", "", "é", "", "", "😀", ""]);
        assert!(out.iter().all(|t| !t.contains('\u{FFFD}')));
    }

    #[test]
    fn an_unfinished_character_at_the_end_is_flushed_lossily() {
        let (out, _) = run(&[0, 3], &[]);
        assert_eq!(out.concat(), "Hello\u{FFFD}");
    }

    #[test]
    fn stop_string_across_tokens_ends_and_is_not_emitted() {
        let (out, stopped) = run(&[0, 1, 2, 6, 7, 0], &["User:"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Hello world\n\n");
        // "\n\nUser" was held back as a possible stop prefix before ":" arrived.
        assert_eq!(out[3], "\n\n");
    }

    #[test]
    fn a_false_stop_prefix_is_released() {
        let (out, stopped) = run(&[6, 0], &["User:"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "\n\nUserHello");
    }
}
