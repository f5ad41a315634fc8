//! Writing a KNOT: collect tensors (borrowed, e.g. from an mmapped GGUF or parent KNOT),
//! then [`KnotWriter::write`] streams them once to a temp file, hashing as it goes, and
//! renames it into place.

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::container::{
    align_up, check_tensor_shape, Preamble, ALIGN, HASH_CHUNK, MAX_TENSORS, PREAMBLE_LEN,
};
use crate::error::KnotError;
use crate::header::{ArchConfig, Header, SectionRef, ShardRecord, TensorEntry, TokenizerData};
use crate::DType;

/// Placeholder hash while laying out; every BLAKE3 hex string has this length.
const ZERO_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

struct Pending<'a> {
    name: String,
    dtype: DType,
    shape: Vec<u64>,
    bytes: Cow<'a, [u8]>,
}

/// Builds a KNOT file. Tensor bytes are borrowed for `'a` (an mmap of the source), so a
/// large model is never held in memory twice; [`KnotWriter::add_tensor_owned`] takes owned
/// bytes for synthetic data.
pub struct KnotWriter<'a> {
    model_id: String,
    arch: ArchConfig,
    tokenizer: Option<TokenizerData>,
    shard: Option<ShardRecord>,
    tensors: Vec<Pending<'a>>,
    names: HashSet<String>,
}

impl std::fmt::Debug for KnotWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnotWriter")
            .field("model_id", &self.model_id)
            .field("tensors", &self.tensors.len())
            .field("tensor_bytes", &self.tensor_bytes())
            .finish()
    }
}

impl<'a> KnotWriter<'a> {
    /// A writer for a model called `model_id` with architecture `arch`.
    pub fn new(model_id: impl Into<String>, arch: ArchConfig) -> Self {
        KnotWriter {
            model_id: model_id.into(),
            arch,
            tokenizer: None,
            shard: None,
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Sets the tokenizer section.
    pub fn tokenizer(&mut self, t: TokenizerData) -> &mut Self {
        self.tokenizer = Some(t);
        self
    }

    /// Marks the file as a shard.
    pub fn shard(&mut self, s: ShardRecord) -> &mut Self {
        self.shard = Some(s);
        self
    }

    /// Adds a tensor whose bytes are borrowed until [`KnotWriter::write`]. Checks the name is
    /// new and `bytes.len() == dtype.bytes_for(product(shape))`.
    pub fn add_tensor(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Vec<u64>,
        bytes: &'a [u8],
    ) -> Result<&mut Self, KnotError> {
        self.push(name, dtype, shape, Cow::Borrowed(bytes))
    }

    /// Like [`KnotWriter::add_tensor`], taking ownership of the bytes.
    pub fn add_tensor_owned(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Vec<u64>,
        bytes: Vec<u8>,
    ) -> Result<&mut Self, KnotError> {
        self.push(name, dtype, shape, Cow::Owned(bytes))
    }

    fn push(
        &mut self,
        name: &str,
        dtype: DType,
        shape: Vec<u64>,
        bytes: Cow<'a, [u8]>,
    ) -> Result<&mut Self, KnotError> {
        let bad = |reason: String| KnotError::InvalidTensor {
            tensor: name.to_string(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("empty name".into()));
        }
        if self.names.contains(name) {
            return Err(bad("duplicate name".into()));
        }
        if self.tensors.len() >= MAX_TENSORS {
            return Err(bad(format!("more than {MAX_TENSORS} tensors")));
        }
        check_tensor_shape(dtype, &shape, bytes.len() as u64).map_err(bad)?;
        self.names.insert(name.to_string());
        self.tensors.push(Pending {
            name: name.to_string(),
            dtype,
            shape,
            bytes,
        });
        Ok(self)
    }

    /// Number of tensors added so far.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Sum of tensor byte lengths: the progress total of [`KnotWriter::write`].
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.bytes.len() as u64).sum()
    }

    /// Writes the file atomically: a temp file in the target directory, fsync, rename.
    /// `progress` gets the cumulative tensor bytes written (total: [`KnotWriter::tensor_bytes`]).
    pub fn write(
        &self,
        path: impl AsRef<Path>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), KnotError> {
        let path = path.as_ref();
        let tok_json = match &self.tokenizer {
            Some(t) => Some(
                serde_json::to_vec(t)
                    .map_err(|e| KnotError::io("serialize tokenizer for", path, e.into()))?,
            ),
            None => None,
        };

        // Lay out: header (with placeholder tensor hashes of the final length), then the
        // tokenizer and the tensors at page-aligned offsets. Offsets depend on the header length
        // and vice versa; grow until the header fits in front of the data.
        let mut header = Header {
            model_id: self.model_id.clone(),
            arch: self.arch.clone(),
            tokenizer: tok_json.as_ref().map(|j| SectionRef {
                offset: 0,
                len: j.len() as u64,
                blake3: blake3::hash(j).to_hex().to_string(),
            }),
            tensors: self
                .tensors
                .iter()
                .map(|t| TensorEntry {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    offset: 0,
                    len: t.bytes.len() as u64,
                    blake3: ZERO_HASH.to_string(),
                })
                .collect(),
            shard: self.shard.clone(),
        };
        crate::container::check_values(&header).map_err(|reason| KnotError::InvalidHeader {
            path: path.into(),
            reason,
        })?;
        let overflow = || {
            KnotError::io(
                "lay out",
                path,
                std::io::Error::other("file size overflows u64"),
            )
        };
        let mut header_len = serialize(&header, path)?.len() as u64;
        let (data_start, file_len) = loop {
            let data_start = align_up(PREAMBLE_LEN + header_len).ok_or_else(overflow)?;
            let mut pos = data_start;
            if let Some(sec) = &mut header.tokenizer {
                sec.offset = pos;
                pos = align_up(pos + sec.len).ok_or_else(overflow)?;
            }
            let mut end = pos;
            for t in &mut header.tensors {
                t.offset = pos;
                end = pos.checked_add(t.len).ok_or_else(overflow)?;
                pos = align_up(end).ok_or_else(overflow)?;
            }
            let file_len = header.tensors.last().map_or_else(
                || {
                    header
                        .tokenizer
                        .as_ref()
                        .map_or(data_start, |s| s.offset + s.len)
                },
                |_| end,
            );
            let len = serialize(&header, path)?.len() as u64;
            if PREAMBLE_LEN + len <= data_start {
                header_len = len;
                break (data_start, file_len);
            }
            header_len = len;
        };

        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = path.file_name().ok_or_else(|| {
            KnotError::io(
                "write",
                path,
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "path has no file name"),
            )
        })?;
        let tmp = TempFile::create(&dir, file_name)?;
        let mut w = BufWriter::with_capacity(1 << 20, tmp.file());
        let werr = |e| KnotError::io("write", &tmp.path, e);

        // Zeros for the preamble + header region; filled in at the end.
        write_zeros(&mut w, data_start).map_err(werr)?;
        let mut pos = data_start;
        if let (Some(sec), Some(j)) = (&header.tokenizer, &tok_json) {
            write_zeros(&mut w, sec.offset - pos).map_err(werr)?;
            w.write_all(j).map_err(werr)?;
            pos = sec.offset + sec.len;
        }
        let mut done = 0u64;
        for (entry, t) in header.tensors.iter_mut().zip(&self.tensors) {
            write_zeros(&mut w, entry.offset - pos).map_err(werr)?;
            let mut h = blake3::Hasher::new();
            for chunk in t.bytes.chunks(HASH_CHUNK) {
                h.update(chunk);
                w.write_all(chunk).map_err(werr)?;
                done += chunk.len() as u64;
                progress(done);
            }
            entry.blake3 = h.finalize().to_hex().to_string();
            pos = entry.offset + entry.len;
        }
        debug_assert_eq!(pos, file_len);

        let hb = serialize(&header, path)?;
        if hb.len() as u64 != header_len {
            return Err(KnotError::io(
                "write",
                path,
                std::io::Error::other("internal: header length changed after hashing"),
            ));
        }
        let pre = Preamble {
            header_offset: PREAMBLE_LEN,
            header_len,
            file_len,
            header_hash: *blake3::hash(&hb).as_bytes(),
        };
        w.seek(SeekFrom::Start(0)).map_err(werr)?;
        w.write_all(&pre.encode()).map_err(werr)?;
        w.write_all(&hb).map_err(werr)?;
        w.flush().map_err(werr)?;
        drop(w);
        tmp.file()
            .sync_all()
            .map_err(|e| KnotError::io("fsync", &tmp.path, e))?;
        tmp.persist(path)?;
        // Make the rename durable.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

fn serialize(h: &Header, path: &Path) -> Result<Vec<u8>, KnotError> {
    serde_json::to_vec(h).map_err(|e| KnotError::io("serialize header for", path, e.into()))
}

fn write_zeros(w: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const Z: [u8; ALIGN as usize] = [0; ALIGN as usize];
    while n > 0 {
        let k = n.min(ALIGN) as usize;
        w.write_all(&Z[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// A temp file beside the destination, removed on drop unless persisted.
struct TempFile {
    path: PathBuf,
    file: Option<File>,
}

impl TempFile {
    fn create(dir: &Path, name: &std::ffi::OsStr) -> Result<TempFile, KnotError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = dir.join(format!(
            ".{}.tmp-{}-{nanos}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| KnotError::io("create", &path, e))?;
        Ok(TempFile {
            path,
            file: Some(file),
        })
    }

    fn file(&self) -> &File {
        self.file.as_ref().expect("file present until persist")
    }

    fn persist(mut self, to: &Path) -> Result<(), KnotError> {
        self.file = None;
        std::fs::rename(&self.path, to).map_err(|e| KnotError::io("rename temp file to", to, e))?;
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
