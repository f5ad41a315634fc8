//! Streaming decode: text out as tokens come in, never half a character.

use super::Tokenizer;

/// Turns a stream of token ids into text, holding back the bytes of a UTF-8 character until
/// the token that completes it arrives (one emoji is often split over two or more tokens).
#[derive(Debug, Default)]
pub struct StreamDecoder {
    /// Bytes received but not yet emitted: at most an incomplete character.
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder with nothing pending.
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// Adds token `id` and returns the text that is now complete, if any. Invalid UTF-8 (not
    /// merely incomplete) is emitted as U+FFFD so that it cannot stall the stream. Unknown ids
    /// add nothing.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Option<String> {
        self.pending.extend_from_slice(tokenizer.token_bytes(id)?);
        let mut text = String::new();
        let mut start = 0;
        loop {
            match std::str::from_utf8(&self.pending[start..]) {
                Ok(s) => {
                    text.push_str(s);
                    start = self.pending.len();
                    break;
                }
                Err(e) => {
                    let valid = start + e.valid_up_to();
                    // The prefix up to `valid` was just checked, so this cannot fail.
                    text.push_str(std::str::from_utf8(&self.pending[start..valid]).unwrap_or(""));
                    match e.error_len() {
                        // Incomplete character at the end: wait for more bytes.
                        None => {
                            start = valid;
                            break;
                        }
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            start = valid + bad;
                        }
                    }
                }
            }
        }
        self.pending.drain(..start);
        (!text.is_empty()).then_some(text)
    }

    /// Ends the stream: returns whatever is still pending, lossily (an incomplete character
    /// becomes U+FFFD), and resets the decoder.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    /// True if bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
