//! SentencePiece (GGUF `tokenizer.ggml.model = "llama"`) encoding of one text fragment, as
//! llama.cpp's SPM tokenizer does it.
//!
//! Spaces become `▁` (U+2581), the vocabulary's space marker, and the fragment starts as one
//! symbol per character. Every adjacent pair whose concatenation is a vocabulary piece is a
//! candidate; the candidate with the highest piece score is merged first (ties: leftmost),
//! and the new neighbours become candidates, until no pair forms a piece. A remaining symbol
//! that is not a piece (a character the vocabulary lacks) falls back to its UTF-8 bytes as
//! `<0xNN>` tokens. Pieces are looked up by their vocabulary text, whatever their type (a
//! control piece can be formed by merging, as in llama.cpp).

use std::collections::BinaryHeap;

use super::bpe::NONE;
use super::index::{Arena, VocabIndex};

/// The space marker.
pub(crate) const SPACE: &str = "\u{2581}";

/// What SentencePiece needs besides the shared token table.
pub(crate) struct Spm {
    /// Vocabulary texts as written (with `▁`), concatenated in id order.
    raw_bytes: Vec<u8>,
    /// Token `i` is `raw_bytes[raw_offsets[i]..raw_offsets[i + 1]]`. (vocab + 1,)
    raw_offsets: Vec<u32>,
    /// Raw text -> id.
    raw_index: VocabIndex,
    /// Piece scores, index = id; the higher merges first. (vocab,)
    scores: Vec<f32>,
    /// Id of the `<0xNN>` token of each byte (or of the single-byte piece). (256,)
    byte_ids: [u32; 256],
    /// Prefix a space to a fragment at the start of the text or after a special token.
    pub(crate) add_space_prefix: bool,
}

/// One symbol: a byte range of the escaped fragment.
#[derive(Clone, Copy)]
struct Symbol {
    start: u32,
    /// Byte length; 0 once merged into its left neighbour.
    len: u32,
    prev: u32,
    next: u32,
}

/// A candidate merge; the heap pops the highest score, then the leftmost.
#[derive(Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    /// Byte length of the pair when pushed (stale once either side changed).
    len: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&o.score)
            .then(o.left.cmp(&self.left))
            .then(o.right.cmp(&self.right))
    }
}

/// Buffers reused across fragments.
#[derive(Default)]
pub(crate) struct SpmScratch {
    text: String,
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Bigram>,
}

impl Spm {
    /// Builds the raw-text index. `tokens`, `scores` are the vocabulary's (missing scores
    /// count as 0); `byte_ids[b]` is the id standing for byte `b`, or `NONE`.
    pub(crate) fn new(
        tokens: &[String],
        scores: &[f32],
        byte_ids: [u32; 256],
        add_space_prefix: bool,
    ) -> Spm {
        let total: usize = tokens.iter().map(String::len).sum();
        let mut raw_bytes = Vec::with_capacity(total);
        let mut raw_offsets = Vec::with_capacity(tokens.len() + 1);
        raw_offsets.push(0u32);
        for t in tokens {
            raw_bytes.extend_from_slice(t.as_bytes());
            // The caller checked that all token bytes fit in u32 offsets.
            raw_offsets.push(raw_bytes.len() as u32);
        }
        let raw_index = VocabIndex::new(Arena {
            bytes: &raw_bytes,
            offsets: &raw_offsets,
        });
        let mut s = scores.to_vec();
        s.resize(tokens.len(), 0.0);
        Spm {
            raw_bytes,
            raw_offsets,
            raw_index,
            scores: s,
            byte_ids,
            add_space_prefix,
        }
    }

    fn lookup(&self, key: &[u8]) -> Option<u32> {
        self.raw_index.get(
            Arena {
                bytes: &self.raw_bytes,
                offsets: &self.raw_offsets,
            },
            key,
        )
    }

    /// Encodes one fragment of plain text (no special tokens in it) and appends its ids;
    /// `prefix` adds the leading space of `add_space_prefix`.
    pub(crate) fn encode(&self, text: &str, prefix: bool, s: &mut SpmScratch, out: &mut Vec<u32>) {
        let SpmScratch {
            text: esc,
            symbols,
            heap,
        } = s;
        esc.clear();
        if prefix {
            esc.push_str(SPACE);
        }
        for (i, part) in text.split(' ').enumerate() {
            if i > 0 {
                esc.push_str(SPACE);
            }
            esc.push_str(part);
        }
        if esc.is_empty() {
            return;
        }
        let b = esc.as_bytes();
        symbols.clear();
        heap.clear();
        for (i, (at, c)) in esc.char_indices().enumerate() {
            let i = i as u32;
            symbols.push(Symbol {
                start: at as u32,
                len: c.len_utf8() as u32,
                prev: if i == 0 { NONE } else { i - 1 },
                next: i + 1,
            });
        }
        if let Some(last) = symbols.last_mut() {
            last.next = NONE;
        }
        let text_of = |symbols: &[Symbol], l: u32, r: u32| -> (usize, usize) {
            let (a, c) = (symbols[l as usize], symbols[r as usize]);
            (a.start as usize, (c.start + c.len) as usize)
        };
        let push = |symbols: &[Symbol], heap: &mut BinaryHeap<Bigram>, l: u32, r: u32| {
            if l == NONE || r == NONE {
                return;
            }
            let (from, to) = text_of(symbols, l, r);
            if let Some(id) = self.lookup(&b[from..to]) {
                heap.push(Bigram {
                    score: self.scores[id as usize],
                    left: l,
                    right: r,
                    len: (to - from) as u32,
                });
            }
        };
        for i in 1..symbols.len() as u32 {
            push(symbols, heap, i - 1, i);
        }
        while let Some(g) = heap.pop() {
            let (l, r) = (symbols[g.left as usize], symbols[g.right as usize]);
            if l.len == 0 || r.len == 0 || l.len + r.len != g.len {
                continue;
            }
            // Merge the right symbol into the left one and unlink it.
            symbols[g.left as usize].len += r.len;
            symbols[g.right as usize].len = 0;
            symbols[g.left as usize].next = r.next;
            if r.next != NONE {
                symbols[r.next as usize].prev = g.left;
            }
            push(symbols, heap, l.prev, g.left);
            push(symbols, heap, g.left, r.next);
        }
        let mut i = 0u32;
        while i != NONE {
            let sym = symbols[i as usize];
            let piece = &b[sym.start as usize..(sym.start + sym.len) as usize];
            match self.lookup(piece) {
                Some(id) => out.push(id),
                // A character the vocabulary lacks: its bytes (a byte without a token,
                // which llama.cpp would throw on, is dropped).
                None => out.extend(
                    piece
                        .iter()
                        .map(|&c| self.byte_ids[usize::from(c)])
                        .filter(|&id| id != NONE),
                ),
            }
            i = sym.next;
        }
    }
}

/// The byte a `<0xNN>` token stands for.
pub(crate) fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spm(tokens: &[(&str, f32)]) -> Spm {
        let texts: Vec<String> = tokens.iter().map(|t| t.0.to_string()).collect();
        let scores: Vec<f32> = tokens.iter().map(|t| t.1).collect();
        let mut byte_ids = [NONE; 256];
        for (i, t) in texts.iter().enumerate() {
            if let Some(b) = byte_token(t) {
                byte_ids[usize::from(b)] = i as u32;
            }
        }
        Spm::new(&texts, &scores, byte_ids, false)
    }

    fn run(s: &Spm, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        s.encode(text, false, &mut SpmScratch::default(), &mut out);
        out
    }

    #[test]
    fn highest_score_merges_first_and_spaces_become_the_marker() {
        // "abc": "bc" scores higher than "ab", so a + bc, though "ab" is leftmost.
        let s = spm(&[
            ("a", -1.0),
            ("b", -1.0),
            ("c", -1.0),
            ("ab", -5.0),
            ("bc", -2.0),
            ("\u{2581}", -1.0),
            ("\u{2581}a", -3.0),
        ]);
        assert_eq!(run(&s, "abc"), [0, 4]);
        assert_eq!(run(&s, " a"), [6]);
        assert_eq!(run(&s, "a a"), [0, 6]);
    }

    #[test]
    fn equal_scores_merge_leftmost_and_chains_continue() {
        let s = spm(&[("a", 0.0), ("aa", -1.0), ("aaaa", -1.0)]);
        assert_eq!(run(&s, "aaa"), [1, 0]);
        assert_eq!(run(&s, "aaaa"), [2]);
    }

    #[test]
    fn unknown_characters_fall_back_to_byte_tokens() {
        let mut tokens = vec![("x".to_string(), 0.0)];
        for b in 0..=255u8 {
            tokens.push((format!("<0x{b:02X}>"), 0.0));
        }
        let refs: Vec<(&str, f32)> = tokens.iter().map(|(t, s)| (t.as_str(), *s)).collect();
        let s = spm(&refs);
        // "é" is C3 A9: bytes 0xC3, 0xA9 are ids 1 + 0xC3, 1 + 0xA9.
        assert_eq!(run(&s, "xé"), [0, 1 + 0xC3, 1 + 0xA9]);
        assert_eq!(byte_token("<0x0A>"), Some(10));
        assert_eq!(byte_token("<0x0>"), None);
        assert_eq!(byte_token("<0xZZ>"), None);
    }
}
