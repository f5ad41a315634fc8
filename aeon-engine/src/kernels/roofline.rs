//! The read roofline: how fast this machine streams a given byte range, the ceiling a
//! weight-streaming matvec over the same bytes can reach.
//!
//! Why a kernel of its own rather than a plain sum: the kernels touch each 4 KiB page
//! well ahead of the stream ([`touch_page`], at home here), which on this KVM guest
//! lifts a 4 KiB-page stream from ~20 to ~30 GB/s. A roofline read without that touch is
//! slower than the kernels it is meant to bound (kernel-bench once printed 98-409% of it).
//! [`stream_read`] does the same touch, reads every byte once with wide loads, and splits the
//! range over the team's threads as the matmuls do, so a kernel's GB/s over the same bytes,
//! timed the same way, divided by this is an honest fraction.

use super::team;

/// How far ahead [`touch_page`] reaches: 64 pages of 4 KiB.
pub const PAGE_AHEAD: usize = 256 << 10;

/// Touches (prefetch into L1) the 4 KiB page that holds `p + PAGE_AHEAD + bytes`, the page the
/// stream enters `PAGE_AHEAD` bytes after the `bytes` at `p`. Kernels call it once per tile or
/// few cache lines, so every page gets a few touches (the repeats hit the line in flight).
///
/// Why: the weights sit on 4 KiB pages, and a plain streaming read of them reached only
/// 19-23 GB/s on this KVM guest, against 32-37 over the same bytes on 2 MiB pages. The
/// hardware prefetchers stop at each 4 KiB edge, and each new page needs a TLB walk, nested
/// under virtualization, before the stream goes on. One touch far ahead starts both early,
/// while the lines themselves are left to the hardware prefetchers (each line prefetched
/// into L1 that far ahead was slower; the same touch into L2, `T1`, gained half as much).
/// From DRAM at one token this took Q4_0/Q5_0/Q8_0 from 19-21 to 27-30 GB/s of weights.
/// Any address will do: a prefetch never faults.
#[inline(always)]
pub fn touch_page(p: *const u8, bytes: usize) {
    let q = p.wrapping_add(PAGE_AHEAD + bytes);
    touch(q.wrapping_sub(q as usize & 4095));
}

/// Bytes per parallel task: large enough that a task is mostly streaming, small enough that
/// two threads split a 2.5 MB matrix evenly.
const CHUNK: usize = 64 << 10;

/// Reads every byte of `data` (in parallel over the current rayon pool's threads, on the
/// team the matmuls use) and returns a checksum, so the reads cannot be optimised away.
pub fn stream_read(data: &[u8]) -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let sink = AtomicU64::new(0);
    let chunks = data.len().div_ceil(CHUNK);
    team::for_each_chunk(chunks, |c| {
        let lo = c * CHUNK;
        let piece = &data[lo..(lo + CHUNK).min(data.len())];
        sink.fetch_xor(sum_touching(piece), Ordering::Relaxed);
    });
    sink.into_inner()
}

/// Wrapping sum of `piece` as little-endian u64 words (a tail under 64 bytes byte by byte),
/// touching the page [`PAGE_AHEAD`] past each 4 KiB.
fn sum_touching(piece: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    let mut lines = piece.chunks_exact(64);
    for (i, line) in lines.by_ref().enumerate() {
        if i % 64 == 0 {
            touch(piece.as_ptr().wrapping_add(i * 64 + PAGE_AHEAD));
        }
        for (k, a) in acc.iter_mut().enumerate() {
            let w: [u8; 8] = line[8 * k..8 * k + 8].try_into().unwrap_or_default();
            *a = a.wrapping_add(u64::from_le_bytes(w));
        }
    }
    let tail = lines.remainder().iter().map(|&b| b as u64);
    acc.iter().copied().chain(tail).fold(0, u64::wrapping_add)
}

/// Prefetches the line at `p` into L1 (any address: a prefetch never faults).
#[inline(always)]
fn touch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of the x86_64 baseline; a prefetch reads nothing architecturally and
    // never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum is the per-chunk sums xor-ed (whatever the threads), each chunk's sum the
    /// plain wrapping sum of its words and tail bytes, and a flipped last byte changes it.
    #[test]
    fn stream_read_reads_every_byte() {
        let n = 3 * CHUNK + 200 + 5;
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + i / 251) as u8).collect();
        let want = data
            .chunks(CHUNK)
            .map(sum_touching)
            .fold(0u64, |a, b| a ^ b);
        assert_eq!(stream_read(&data), want);
        // And the piece sum itself against a plain definition.
        let piece = &data[..CHUNK + 70];
        let body = piece.len() / 64 * 64;
        let words = piece[..body]
            .chunks(8)
            .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
            .fold(0u64, u64::wrapping_add);
        let tail = piece[body..].iter().map(|&b| b as u64).sum::<u64>();
        assert_eq!(sum_touching(piece), words.wrapping_add(tail));
        let mut flipped = data.clone();
        flipped[n - 1] ^= 1;
        assert_ne!(stream_read(&flipped), stream_read(&data));
    }
}
