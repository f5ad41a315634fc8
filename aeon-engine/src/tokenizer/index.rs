//! Token bytes -> id lookup without one allocation per token.
//!
//! An open-addressing hash table (linear probing) of ids whose keys are the tokens' own bytes
//! in the tokenizer's byte arena. Building it for 150k tokens takes a few milliseconds; a
//! `HashMap` with boxed keys costs an allocation per token and several times as long.

use std::hash::Hasher;

use super::FxHasher;

/// Empty slot.
const EMPTY: u32 = u32::MAX;

/// The byte arena the index refers to: token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Copy)]
pub(crate) struct Arena<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) offsets: &'a [u32],
}

impl<'a> Arena<'a> {
    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    /// Token `id`'s bytes; `id` must be below `len()`.
    pub(crate) fn token(&self, id: u32) -> &'a [u8] {
        let i = id as usize;
        &self.bytes[self.offsets[i] as usize..self.offsets[i + 1] as usize]
    }
}

/// Finds a token by its bytes. Holds only ids; the arena is passed to each call.
pub(crate) struct VocabIndex {
    /// Token ids or `EMPTY`; a power-of-two length, at least twice the vocabulary.
    slots: Vec<u32>,
}

fn hash(key: &[u8]) -> usize {
    let mut h = FxHasher::default();
    h.write(key);
    h.write_usize(key.len());
    // Fx's low bits are weak; fold the high bits in before masking.
    let x = h.finish();
    (x ^ (x >> 32) ^ (x >> 47)) as usize
}

impl VocabIndex {
    /// Indexes every token of `arena`; where two tokens have the same bytes, the lower id wins.
    pub(crate) fn new(arena: Arena<'_>) -> VocabIndex {
        Self::new_filtered(arena, |_| true)
    }

    /// Indexes the tokens of `arena` for which `keep(id)` holds.
    pub(crate) fn new_filtered(arena: Arena<'_>, keep: impl Fn(u32) -> bool) -> VocabIndex {
        let n = arena.len();
        let cap = (2 * n).next_power_of_two().max(16);
        let mask = cap - 1;
        let mut slots = vec![EMPTY; cap];
        for id in (0..n as u32).filter(|&id| keep(id)) {
            let key = arena.token(id);
            let mut i = hash(key) & mask;
            loop {
                let s = slots[i];
                if s == EMPTY {
                    slots[i] = id;
                    break;
                }
                if arena.token(s) == key {
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        VocabIndex { slots }
    }

    /// The id of the token whose bytes are `key`. `arena` must be the one indexed.
    pub(crate) fn get(&self, arena: Arena<'_>, key: &[u8]) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = hash(key) & mask;
        loop {
            let s = self.slots[i];
            if s == EMPTY {
                return None;
            }
            if arena.token(s) == key {
                return Some(s);
            }
            i = (i + 1) & mask;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_every_token_and_prefers_the_lower_duplicate() {
        let words: Vec<&[u8]> = vec![b"a", b"ab", b"", b"abc", b"ab", b"\xff\x00"];
        let mut bytes = Vec::new();
        let mut offsets = vec![0u32];
        for w in &words {
            bytes.extend_from_slice(w);
            offsets.push(bytes.len() as u32);
        }
        let arena = Arena {
            bytes: &bytes,
            offsets: &offsets,
        };
        let idx = VocabIndex::new(arena);
        assert_eq!(idx.get(arena, b"a"), Some(0));
        assert_eq!(idx.get(arena, b"ab"), Some(1));
        assert_eq!(idx.get(arena, b""), Some(2));
        assert_eq!(idx.get(arena, b"abc"), Some(3));
        assert_eq!(idx.get(arena, b"\xff\x00"), Some(5));
        assert_eq!(idx.get(arena, b"b"), None);
        assert_eq!(idx.get(arena, b"abcd"), None);
    }
}
