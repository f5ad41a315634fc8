//! Reading a KNOT: [`Knot::open`] maps the file, checks the preamble and header, and hands out
//! zero-copy [`TensorView`]s. Layout and rules: `specs/knot-format.md`.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::KnotError;
use crate::header::{
    ArchConfig, Header, LayerRange, SectionRef, ShardRecord, TensorEntry, TokenizerData,
};

/// First four bytes of every KNOT file.
pub const MAGIC: [u8; 4] = *b"KNOT";
/// The format version this crate reads and writes.
pub const VERSION: u32 = 1;
/// Size of the fixed preamble; the header JSON starts right after it.
pub const PREAMBLE_LEN: u64 = 128;
/// Preamble bytes no field uses yet: readers require them zero (no hash covers them).
pub const RESERVED: std::ops::Range<usize> = 64..PREAMBLE_LEN as usize;
/// Every section and tensor starts at a multiple of this (one page).
pub const ALIGN: u64 = 4096;
/// Largest header accepted (the Qwen header is ~60 KiB).
pub const MAX_HEADER_LEN: u64 = 256 << 20;
/// Largest tensor count accepted.
pub const MAX_TENSORS: usize = 1_000_000;
/// GGML's maximum number of dimensions.
pub const MAX_DIMS: usize = 4;
/// Largest element count of one tensor (2^48).
pub const MAX_ELEMS: u64 = 1 << 48;

/// Chunk size for streaming hashes (verify, write).
pub(crate) const HASH_CHUNK: usize = 4 << 20;

/// Rounds `x` up to a multiple of [`ALIGN`]; `None` on overflow.
pub(crate) fn align_up(x: u64) -> Option<u64> {
    x.checked_add(ALIGN - 1).map(|v| v / ALIGN * ALIGN)
}

/// The fixed 128-byte start of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Preamble {
    pub header_offset: u64,
    pub header_len: u64,
    pub file_len: u64,
    pub header_hash: [u8; 32],
}

impl Preamble {
    pub fn encode(&self) -> [u8; PREAMBLE_LEN as usize] {
        let mut b = [0u8; PREAMBLE_LEN as usize];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&VERSION.to_le_bytes());
        b[8..16].copy_from_slice(&self.header_offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.header_len.to_le_bytes());
        b[24..32].copy_from_slice(&self.file_len.to_le_bytes());
        b[32..64].copy_from_slice(&self.header_hash);
        b
    }

    /// Parses and checks the preamble against the real file length.
    fn decode(b: &[u8], path: &Path) -> Result<Preamble, KnotError> {
        let actual = b.len() as u64;
        if b.starts_with(b"GGUF") {
            return Err(KnotError::IsGguf { path: path.into() });
        }
        if actual < PREAMBLE_LEN {
            return Err(KnotError::CorruptHeader {
                path: path.into(),
                reason: format!(
                    "file is {actual} bytes, shorter than the {PREAMBLE_LEN}-byte preamble"
                ),
            });
        }
        if b[0..4] != MAGIC {
            return Err(KnotError::BadMagic {
                path: path.into(),
                found: String::from_utf8_lossy(&b[0..4]).into_owned(),
            });
        }
        let u64_at = |o: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(a)
        };
        let mut v = [0u8; 4];
        v.copy_from_slice(&b[4..8]);
        let version = u32::from_le_bytes(v);
        if version != VERSION {
            return Err(KnotError::UnsupportedVersion {
                path: path.into(),
                version,
            });
        }
        if let Some(i) = b[RESERVED].iter().position(|&x| x != 0) {
            return Err(KnotError::CorruptHeader {
                path: path.into(),
                reason: format!(
                    "reserved preamble byte {} is {:#04x}, must be zero",
                    RESERVED.start + i,
                    b[RESERVED.start + i]
                ),
            });
        }
        let mut header_hash = [0u8; 32];
        header_hash.copy_from_slice(&b[32..64]);
        let p = Preamble {
            header_offset: u64_at(8),
            header_len: u64_at(16),
            file_len: u64_at(24),
            header_hash,
        };
        if p.file_len != actual {
            return Err(KnotError::LengthMismatch {
                path: path.into(),
                expected: p.file_len,
                actual,
            });
        }
        let bad = |reason: String| {
            Err(KnotError::CorruptHeader {
                path: path.into(),
                reason,
            })
        };
        if p.header_offset != PREAMBLE_LEN {
            return bad(format!(
                "header_offset is {}, expected {PREAMBLE_LEN}",
                p.header_offset
            ));
        }
        if p.header_len == 0 || p.header_len > MAX_HEADER_LEN {
            return bad(format!(
                "header_len {} is outside 1..={MAX_HEADER_LEN}",
                p.header_len
            ));
        }
        match p.header_offset.checked_add(p.header_len) {
            Some(end) if end <= actual => {}
            _ => {
                return bad(format!(
                    "header ({} bytes) runs past the end of the {actual}-byte file",
                    p.header_len
                ))
            }
        }
        Ok(p)
    }
}

/// A borrowed tensor: its table entry and its bytes inside the mapping.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub entry: &'a TensorEntry,
    pub bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// GGUF name (`blk.12.attn_q.weight`).
    pub fn name(&self) -> &'a str {
        &self.entry.name
    }
    /// Layer index for `blk.N.*` tensors.
    pub fn layer(&self) -> Option<u32> {
        layer_of(&self.entry.name)
    }
}

/// The layer index of a `blk.N.*` tensor name (also `blk_N_*`).
pub fn layer_of(name: &str) -> Option<u32> {
    let rest = name
        .strip_prefix("blk.")
        .or_else(|| name.strip_prefix("blk_"))?;
    let end = rest.find(['.', '_'])?;
    rest[..end].parse().ok()
}

/// The resolver key: `.bin` dropped, dots turned into underscores.
fn alias_key(name: &str) -> String {
    name.strip_suffix(".bin").unwrap_or(name).replace('.', "_")
}

/// An open, validated KNOT file. Owns the memory map; tensor views borrow from it.
pub struct Knot {
    path: PathBuf,
    mmap: Mmap,
    header_len: u64,
    header: Header,
    model_hash: String,
    index: HashMap<String, usize>,
    /// `alias_key(name)` -> index, `None` where two names collide.
    alias: HashMap<String, Option<usize>>,
}

impl std::fmt::Debug for Knot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Knot")
            .field("path", &self.path)
            .field("model_hash", &self.model_hash)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl Knot {
    /// Maps `path`, checks preamble, header hash and every table entry (offsets, alignment,
    /// overlaps, sizes). Reads no tensor bytes; takes microseconds to milliseconds.
    pub fn open(path: impl AsRef<Path>) -> Result<Knot, KnotError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| KnotError::io("open", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| KnotError::io("stat", &path, e))?
            .len();
        if len < PREAMBLE_LEN {
            return Err(KnotError::CorruptHeader {
                path,
                reason: format!(
                    "file is {len} bytes, shorter than the {PREAMBLE_LEN}-byte preamble"
                ),
            });
        }
        // SAFETY: the map is read-only and lives as long as `Knot`. Another process truncating
        // or rewriting the file while it is mapped is outside our control (as for every mmap
        // reader); KNOT writers never do that: they write a temp file and rename it.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| KnotError::io("mmap", &path, e))?;
        let pre = Preamble::decode(&mmap, &path)?;
        let hb = &mmap[pre.header_offset as usize..(pre.header_offset + pre.header_len) as usize];
        let hash = blake3::hash(hb);
        if hash.as_bytes() != &pre.header_hash {
            return Err(KnotError::HeaderHashMismatch { path });
        }
        let header: Header =
            serde_json::from_slice(hb).map_err(|source| KnotError::HeaderJson {
                path: path.clone(),
                source,
            })?;
        validate(&header, pre.header_len, len, &path)?;
        let mut index = HashMap::with_capacity(header.tensors.len());
        let mut alias: HashMap<String, Option<usize>> =
            HashMap::with_capacity(header.tensors.len());
        for (i, t) in header.tensors.iter().enumerate() {
            index.insert(t.name.clone(), i);
            alias
                .entry(alias_key(&t.name))
                .and_modify(|v| *v = None)
                .or_insert(Some(i));
        }
        Ok(Knot {
            path,
            mmap,
            header_len: pre.header_len,
            header,
            model_hash: hash.to_hex().to_string(),
            index,
            alias,
        })
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Architecture and hyper-parameters.
    pub fn arch(&self) -> &ArchConfig {
        &self.header.arch
    }

    /// Lowercase hex BLAKE3 of the header bytes; it covers every tensor hash and the tokenizer
    /// hash, so it identifies the model.
    pub fn model_hash(&self) -> &str {
        &self.model_hash
    }

    /// The shard record, when this file is a per-node shard.
    pub fn shard(&self) -> Option<&ShardRecord> {
        self.header.shard.as_ref()
    }

    /// Length of the whole file in bytes.
    pub fn file_len(&self) -> u64 {
        self.mmap.len() as u64
    }

    /// Sum of all tensor lengths.
    pub fn tensor_bytes(&self) -> u64 {
        self.header.tensors.iter().map(|t| t.len).sum()
    }

    /// Bytes [`Knot::verify`] hashes (header + tokenizer + tensors): the progress total.
    pub fn verify_bytes(&self) -> u64 {
        self.header_len + self.header.tokenizer.as_ref().map_or(0, |s| s.len) + self.tensor_bytes()
    }

    /// Tells the kernel this process no longer needs the pages of `bytes`, a slice of this
    /// file's mapping (a tensor the engine has copied into another layout): they leave the
    /// resident set and are read from the file again if touched. Other slices are ignored.
    pub fn release(&self, bytes: &[u8]) {
        let base = self.mmap.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        if bytes.is_empty() || start < base || start + bytes.len() > base + self.mmap.len() {
            return;
        }
        // SAFETY: `Mmap::map` maps the file shared and read-only, so MADV_DONTNEED only drops
        // this process's mapping of clean page-cache pages; a later read faults the file's
        // unchanged bytes back in (nothing is zeroed, unlike a private writable mapping). It
        // may widen to whole pages: those too are only dropped, never changed.
        let advised = unsafe {
            self.mmap.unchecked_advise_range(
                memmap2::UncheckedAdvice::DontNeed,
                start - base,
                bytes.len(),
            )
        };
        if let Err(e) = advised {
            tracing::debug!("madvise(DONTNEED) on {}: {e}", self.path.display());
        }
    }

    /// Pins the pages of `bytes`, a slice of this file's mapping, in memory (`mlock`): they are
    /// read in now and never evicted, so a process paging the rest of its weights re-reads
    /// only the rest. Needs CAP_IPC_LOCK or room under RLIMIT_MEMLOCK; the pages count
    /// against the memory cgroup. A slice outside the mapping is an `InvalidInput` error.
    pub fn lock(&self, bytes: &[u8]) -> std::io::Result<()> {
        let base = self.mmap.as_ptr() as usize;
        let start = bytes.as_ptr() as usize;
        if bytes.is_empty() || start < base || start + bytes.len() > base + self.mmap.len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "lock: the slice is not in this file's mapping",
            ));
        }
        // SAFETY: the range lies inside this live mapping (checked above); mlock only pins
        // its pages (rounding out to whole pages, all of them mapped by this mapping: the
        // map starts on a page and its last page is whole in the address space) and reads
        // or writes no memory. The pins end with the mapping.
        let rc = unsafe { libc::mlock(bytes.as_ptr().cast(), bytes.len()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    /// Looks a tensor up by GGUF name; also accepts `blk_12_attn_q_weight`,
    /// `blk.12.attn_q.weight.bin` and `blk_12_attn_q_weight.bin`.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let i = self.resolve(name)?;
        self.view(&self.header.tensors[i])
    }

    /// All tensors in table order.
    pub fn tensors(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.header.tensors.iter().filter_map(|e| self.view(e))
    }

    fn resolve(&self, name: &str) -> Option<usize> {
        if let Some(&i) = self.index.get(name) {
            return Some(i);
        }
        if let Some(&i) = name.strip_suffix(".bin").and_then(|n| self.index.get(n)) {
            return Some(i);
        }
        self.alias.get(&alias_key(name)).copied().flatten()
    }

    fn view<'a>(&'a self, entry: &'a TensorEntry) -> Option<TensorView<'a>> {
        // Ranges were checked in `open`; `get` keeps this panic-free regardless.
        let bytes = self.section_bytes(entry.offset, entry.len)?;
        Some(TensorView { entry, bytes })
    }

    fn section_bytes(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let end = usize::try_from(offset.checked_add(len)?).ok()?;
        self.mmap.get(start..end)
    }

    /// Parses the tokenizer section (after checking its hash); `None` when the file has none.
    pub fn tokenizer(&self) -> Result<Option<TokenizerData>, KnotError> {
        let Some(sec) = &self.header.tokenizer else {
            return Ok(None);
        };
        let bytes = self.checked_section(sec, "tokenizer")?;
        serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|source| KnotError::TokenizerJson {
                path: self.path.clone(),
                source,
            })
    }

    fn checked_section(&self, sec: &SectionRef, what: &'static str) -> Result<&[u8], KnotError> {
        let bytes =
            self.section_bytes(sec.offset, sec.len)
                .ok_or_else(|| KnotError::CorruptHeader {
                    path: self.path.clone(),
                    reason: format!("{what} section out of range"),
                })?;
        if blake3::hash(bytes).to_hex().as_str() != sec.blake3 {
            return Err(KnotError::SectionHashMismatch {
                path: self.path.clone(),
                section: what,
            });
        }
        Ok(bytes)
    }

    /// Re-hashes the header, the tokenizer section and every tensor, streaming.
    /// `progress` gets the cumulative bytes hashed (total: [`Knot::verify_bytes`]).
    /// The error names the first tensor (in table order) whose bytes do not match.
    pub fn verify(&self, progress: &mut dyn FnMut(u64)) -> Result<(), KnotError> {
        let hb = self
            .section_bytes(PREAMBLE_LEN, self.header_len)
            .ok_or_else(|| KnotError::HeaderHashMismatch {
                path: self.path.clone(),
            })?;
        if blake3::hash(hb).to_hex().as_str() != self.model_hash {
            return Err(KnotError::HeaderHashMismatch {
                path: self.path.clone(),
            });
        }
        let mut done = self.header_len;
        progress(done);
        if let Some(sec) = &self.header.tokenizer {
            self.checked_section(sec, "tokenizer")?;
            done += sec.len;
            progress(done);
        }
        for e in &self.header.tensors {
            let bytes =
                self.section_bytes(e.offset, e.len)
                    .ok_or_else(|| KnotError::BadTensorEntry {
                        path: self.path.clone(),
                        tensor: e.name.clone(),
                        reason: "bytes out of range".into(),
                    })?;
            let mut h = blake3::Hasher::new();
            for chunk in bytes.chunks(HASH_CHUNK) {
                h.update(chunk);
                done += chunk.len() as u64;
                progress(done);
            }
            let actual = h.finalize().to_hex();
            if actual.as_str() != e.blake3 {
                return Err(KnotError::TensorHashMismatch {
                    path: self.path.clone(),
                    tensor: e.name.clone(),
                    expected: e.blake3.clone(),
                    actual: actual.to_string(),
                });
            }
        }
        Ok(())
    }
}

/// True for 64 lowercase hex digits.
fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// Checks one tensor's shape, dtype and length; shared by the reader and the writer.
pub(crate) fn check_tensor_shape(
    dtype: crate::DType,
    shape: &[u64],
    len: u64,
) -> Result<(), String> {
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return Err(format!(
            "{} dimensions (1..={MAX_DIMS} allowed)",
            shape.len()
        ));
    }
    if shape.contains(&0) {
        return Err(format!("zero dimension in shape {shape:?}"));
    }
    let elems = shape
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMS)
        .ok_or_else(|| format!("shape {shape:?} has more than 2^48 elements"))?;
    match dtype.bytes_for(elems) {
        None => Err(format!(
            "{elems} elements is not a whole number of {dtype} blocks ({} elements each)",
            dtype.block_elems()
        )),
        Some(need) if need != len => Err(format!(
            "{len} bytes, but {elems} {dtype} elements need {need}"
        )),
        Some(_) => Ok(()),
    }
}

/// The header's counts and layer ranges, which readers size buffers and loops from:
/// [`ArchConfig::check`]'s caps; a shard's range is non-empty, inside `0..n_layers`, and its
/// `parent_layers` is `n_layers`; every `blk.N` tensor is a block the file holds. Shared by the
/// reader ([`Knot::open`]) and the writer, so no writer produces a file readers refuse.
pub(crate) fn check_values(h: &Header) -> Result<(), String> {
    h.arch.check()?;
    let n = h.arch.n_layers;
    let held = match &h.shard {
        Some(s) => {
            if s.parent_layers != n {
                return Err(format!(
                    "shard.parent_layers {} differs from arch.n_layers {n}",
                    s.parent_layers
                ));
            }
            if s.layers.is_empty() || s.layers.end > n {
                return Err(format!(
                    "shard layers {} are not a non-empty range inside 0..{n}",
                    s.layers
                ));
            }
            if !is_hex64(&s.parent_hash) {
                return Err("shard.parent_hash is not 64 lowercase hex digits".into());
            }
            s.layers
        }
        None => LayerRange::new(0, n),
    };
    if let Some((t, l)) = h.tensors.iter().find_map(|t| {
        layer_of(&t.name)
            .filter(|l| !(held.start..held.end).contains(l))
            .map(|l| (t, l))
    }) {
        return Err(format!(
            "tensor {:?} belongs to block {l}, outside the blocks {held} this file holds",
            t.name
        ));
    }
    Ok(())
}

/// Every header rule of the spec that is not JSON syntax.
fn validate(h: &Header, header_len: u64, file_len: u64, path: &Path) -> Result<(), KnotError> {
    let corrupt = |reason: String| KnotError::CorruptHeader {
        path: path.into(),
        reason,
    };
    if h.tensors.len() > MAX_TENSORS {
        return Err(corrupt(format!(
            "{} tensors (at most {MAX_TENSORS})",
            h.tensors.len()
        )));
    }
    check_values(h).map_err(corrupt)?;
    let data_start = align_up(PREAMBLE_LEN + header_len)
        .ok_or_else(|| corrupt("header_len overflows".into()))?;
    // (start, end, what) of every byte range, for the overlap check.
    let mut ranges: Vec<(u64, u64, String)> = Vec::with_capacity(h.tensors.len() + 1);
    let mut check_range = |what: &str, offset: u64, len: u64| -> Result<(), String> {
        if !offset.is_multiple_of(ALIGN) {
            return Err(format!("offset {offset} is not a multiple of {ALIGN}"));
        }
        if offset < data_start {
            return Err(format!(
                "offset {offset} lies inside the preamble/header (data starts at {data_start})"
            ));
        }
        let end = offset
            .checked_add(len)
            .ok_or_else(|| format!("offset {offset} + len {len} overflows"))?;
        if end > file_len {
            return Err(format!(
                "bytes {offset}..{end} run past the end of the {file_len}-byte file"
            ));
        }
        ranges.push((offset, end, what.to_string()));
        Ok(())
    };
    if let Some(sec) = &h.tokenizer {
        if !is_hex64(&sec.blake3) {
            return Err(corrupt(
                "tokenizer blake3 is not 64 lowercase hex digits".into(),
            ));
        }
        check_range("tokenizer section", sec.offset, sec.len)
            .map_err(|r| corrupt(format!("tokenizer section: {r}")))?;
    }
    let mut names = std::collections::HashSet::with_capacity(h.tensors.len());
    for t in &h.tensors {
        let bad = |reason: String| KnotError::BadTensorEntry {
            path: path.into(),
            tensor: t.name.clone(),
            reason,
        };
        if t.name.is_empty() {
            return Err(bad("empty name".into()));
        }
        if !names.insert(t.name.as_str()) {
            return Err(bad("duplicate name".into()));
        }
        if !is_hex64(&t.blake3) {
            return Err(bad("blake3 is not 64 lowercase hex digits".into()));
        }
        check_tensor_shape(t.dtype, &t.shape, t.len).map_err(&bad)?;
        check_range(&format!("tensor {:?}", t.name), t.offset, t.len).map_err(&bad)?;
    }
    ranges.sort_unstable_by_key(|r| r.0);
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(corrupt(format!(
                "{} ({}..{}) overlaps {} ({}..{})",
                w[0].2, w[0].0, w[0].1, w[1].2, w[1].0, w[1].1
            )));
        }
    }
    Ok(())
}
