//! Byte-pair merging of one pre-tokenized word.
//!
//! The word starts as one symbol per byte. The lowest-ranked adjacent pair that the merge list
//! knows is merged, then the next, until no adjacent pair is mergeable; ties go to the leftmost
//! pair. Symbols sit in a doubly linked list over a vector and candidate pairs in a min-heap,
//! so each merge costs O(log n) instead of a rescan of the word. A popped pair whose symbols
//! changed since it was pushed is stale and skipped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::FastMap;

/// No symbol / no token.
pub(crate) const NONE: u32 = u32::MAX;

/// `(left id, right id) -> (rank, merged id)`.
pub(crate) type MergeMap = FastMap<(u32, u32), (u32, u32)>;

/// One symbol of the word being merged.
#[derive(Clone, Copy)]
struct Symbol {
    /// Token id of the symbol's bytes.
    id: u32,
    /// Index of the previous live symbol, or `NONE`.
    prev: u32,
    /// Index of the next live symbol, or `NONE`.
    next: u32,
    /// False once merged into its left neighbour.
    alive: bool,
}

/// A mergeable adjacent pair; ordered by (rank, left index) so the heap pops the winner.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    left_id: u32,
    right_id: u32,
    merged: u32,
}

/// Buffers reused across words.
#[derive(Default)]
pub(crate) struct Scratch {
    symbols: Vec<Symbol>,
    heap: BinaryHeap<Reverse<Candidate>>,
}

/// Merges `word` and appends its token ids to `out`. `byte_ids[b]` is the id of the
/// single-byte token `b` (or `NONE`); bytes without a token are dropped.
pub(crate) fn merge_word(
    word: &[u8],
    byte_ids: &[u32; 256],
    merges: &MergeMap,
    scratch: &mut Scratch,
    out: &mut Vec<u32>,
) {
    if let [b] = word {
        let id = byte_ids[usize::from(*b)];
        if id != NONE {
            out.push(id);
        }
        return;
    }
    let Scratch { symbols, heap } = scratch;
    symbols.clear();
    heap.clear();
    // Bytes without a token are dropped before merging, so their neighbours may merge across
    // them (as Hugging Face's BPE does; llama.cpp would keep them apart).
    symbols.extend(
        word.iter()
            .map(|&b| byte_ids[usize::from(b)])
            .filter(|&id| id != NONE)
            .map(|id| Symbol {
                id,
                prev: NONE,
                next: NONE,
                alive: true,
            }),
    );
    let n = symbols.len() as u32;
    if n == 0 {
        return;
    }
    for (i, s) in symbols.iter_mut().enumerate() {
        let i = i as u32;
        s.prev = if i == 0 { NONE } else { i - 1 };
        s.next = if i + 1 == n { NONE } else { i + 1 };
    }
    for i in 1..n {
        push_pair(symbols, merges, heap, i - 1, i);
    }
    while let Some(Reverse(c)) = heap.pop() {
        let (l, r) = (c.left as usize, c.right as usize);
        let (left, right) = (symbols[l], symbols[r]);
        let current = left.alive
            && right.alive
            && left.next == c.right
            && left.id == c.left_id
            && right.id == c.right_id;
        if !current {
            continue;
        }
        // Merge the right symbol into the left one and unlink it.
        symbols[l].id = c.merged;
        symbols[l].next = right.next;
        symbols[r].alive = false;
        if right.next != NONE {
            symbols[right.next as usize].prev = c.left;
        }
        if left.prev != NONE {
            push_pair(symbols, merges, heap, left.prev, c.left);
        }
        if right.next != NONE {
            push_pair(symbols, merges, heap, c.left, right.next);
        }
    }
    let mut i = 0u32;
    while i != NONE {
        let s = symbols[i as usize];
        if s.id != NONE {
            out.push(s.id);
        }
        i = s.next;
    }
}

/// Pushes the pair (`left`, `right`) if the merge list knows it.
fn push_pair(
    symbols: &[Symbol],
    merges: &MergeMap,
    heap: &mut BinaryHeap<Reverse<Candidate>>,
    left: u32,
    right: u32,
) {
    let (left_id, right_id) = (symbols[left as usize].id, symbols[right as usize].id);
    if left_id == NONE || right_id == NONE {
        return;
    }
    if let Some(&(rank, merged)) = merges.get(&(left_id, right_id)) {
        heap.push(Reverse(Candidate {
            rank,
            left,
            right,
            left_id,
            right_id,
            merged,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Byte ids are the byte values; merged tokens get ids from 256 on.
    fn setup(merges: &[(u32, u32)]) -> ([u32; 256], MergeMap) {
        let mut byte_ids = [NONE; 256];
        for (b, id) in byte_ids.iter_mut().enumerate() {
            *id = b as u32;
        }
        let mut map = MergeMap::default();
        for (rank, &(a, b)) in merges.iter().enumerate() {
            map.insert((a, b), (rank as u32, 256 + rank as u32));
        }
        (byte_ids, map)
    }

    fn run(word: &[u8], byte_ids: &[u32; 256], merges: &MergeMap) -> Vec<u32> {
        let mut out = Vec::new();
        merge_word(word, byte_ids, merges, &mut Scratch::default(), &mut out);
        out
    }

    #[test]
    fn merges_by_rank_not_position() {
        // "abc": (b,c) has rank 0, (a,b) rank 1: must give [a, bc], not [ab, c].
        let (ids, m) = setup(&[(b'b' as u32, b'c' as u32), (b'a' as u32, b'b' as u32)]);
        assert_eq!(run(b"abc", &ids, &m), vec![b'a' as u32, 256]);
    }

    #[test]
    fn ties_go_left_and_merges_chain() {
        // "aaaa" with (a,a)=256 rank 0 and (256,256)=257 rank 1 -> one token.
        let a = b'a' as u32;
        let (ids, m) = setup(&[(a, a), (256, 256)]);
        assert_eq!(run(b"aaaa", &ids, &m), vec![257]);
        // "aaa": leftmost pair first -> [aa, a].
        assert_eq!(run(b"aaa", &ids, &m), vec![256, a]);
    }

    #[test]
    fn unknown_bytes_are_dropped_before_merging() {
        let a = b'a' as u32;
        let (mut ids, m) = setup(&[(a, a)]);
        ids[usize::from(b'x')] = NONE;
        assert_eq!(run(b"axa", &ids, &m), vec![256]);
        assert_eq!(run(b"xx", &ids, &m), Vec::<u32>::new());
        assert_eq!(run(b"x", &ids, &m), Vec::<u32>::new());
    }
}
