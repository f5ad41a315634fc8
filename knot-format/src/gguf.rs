//! A GGUF v2/v3 reader: metadata key/values (every value type, nested arrays), tensor infos,
//! alignment and the data offset. Treats the file as hostile: every length and count is
//! checked against the bytes that remain before anything is allocated, and offset
//! arithmetic is checked.
//!
//! Layout (little-endian): magic `GGUF`, u32 version, u64 tensor_count, u64 kv_count,
//! kv_count x (string key, u32 value_type, value), tensor_count x (string name, u32 n_dims,
//! n_dims x u64 dim, u32 ggml_type, u64 offset), padding to `general.alignment` (default 32),
//! tensor data. Strings are u64 length + UTF-8 bytes.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::container::MAX_DIMS;
use crate::error::KnotError;
use crate::DType;

/// Alignment of the tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest array nesting accepted (arrays of arrays of ...).
const MAX_DEPTH: u32 = 3;
/// Most metadata key/values accepted (models carry about 30 to 60).
pub const MAX_KV: u64 = 1 << 16;
/// Most tensor infos accepted (the largest released models have a few thousand).
pub const MAX_TENSORS: u64 = 1 << 16;
/// Longest metadata key or tensor name (GGUF's limit for keys).
pub const MAX_NAME_LEN: u64 = (1 << 16) - 1;
/// Most arrays nested inside other arrays, over the whole file. An inner array costs ~56
/// bytes in memory but only 12 on disk, so this is what keeps nesting from amplifying.
pub const MAX_NESTED_ARRAYS: usize = 1 << 16;

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(GgufArray),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// Any non-negative integer (or a uniform array of them, as per-layer keys can be).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            GgufValue::Array(ref a) => {
                let first = a.u64_at(0)?;
                (1..a.len())
                    .all(|i| a.u64_at(i) == Some(first))
                    .then_some(first)
            }
            _ => None,
        }
    }

    /// Any integer as i64.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// Any number as f32.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => self.as_i64().map(|v| v as f32),
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// GGUF's name for the value's type, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
        }
    }
}

/// A metadata array, held compactly: numbers in a plain vector of their own type (an
/// element costs in memory what it costs in the file), strings in one buffer. A hostile
/// file therefore cannot make the parser hold much more than the file's own size (a
/// `Vec<GgufValue>` spent 32 bytes per `u8` element: a 64 MiB GGUF took 2.17 GB).
#[derive(Clone, Debug, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StrArray),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
    /// Arrays of arrays (at most [`MAX_NESTED_ARRAYS`] inner arrays per file).
    Array(Vec<GgufArray>),
}

/// Strings of an array, concatenated: element `i` is `text[ends[i-1]..ends[i]]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StrArray {
    text: String,
    ends: Vec<usize>,
}

impl StrArray {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..end)
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &str> {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
            GgufArray::Array(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The strings, when this is an array of strings.
    pub fn as_strs(&self) -> Option<&StrArray> {
        match self {
            GgufArray::String(s) => Some(s),
            _ => None,
        }
    }

    /// Element `i` as an i64, when this is an array of integers and it fits.
    pub fn i64_at(&self, i: usize) -> Option<i64> {
        match self {
            GgufArray::I8(v) => v.get(i).map(|&x| x.into()),
            GgufArray::I16(v) => v.get(i).map(|&x| x.into()),
            GgufArray::I32(v) => v.get(i).map(|&x| x.into()),
            GgufArray::I64(v) => v.get(i).copied(),
            _ => self.u64_at(i).and_then(|x| i64::try_from(x).ok()),
        }
    }

    /// Element `i` as a u64, when this is an array of integers and it is non-negative.
    pub fn u64_at(&self, i: usize) -> Option<u64> {
        match self {
            GgufArray::U8(v) => v.get(i).map(|&x| x.into()),
            GgufArray::U16(v) => v.get(i).map(|&x| x.into()),
            GgufArray::U32(v) => v.get(i).map(|&x| x.into()),
            GgufArray::U64(v) => v.get(i).copied(),
            GgufArray::I8(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I16(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I32(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            GgufArray::I64(v) => v.get(i).and_then(|&x| u64::try_from(x).ok()),
            _ => None,
        }
    }

    /// The inner array `i`, when this is an array of arrays.
    pub fn array_at(&self, i: usize) -> Option<&GgufArray> {
        match self {
            GgufArray::Array(v) => v.get(i),
            _ => None,
        }
    }

    /// GGUF's name for the element type, for error messages.
    pub fn elem_type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "u8",
            GgufArray::I8(_) => "i8",
            GgufArray::U16(_) => "u16",
            GgufArray::I16(_) => "i16",
            GgufArray::U32(_) => "u32",
            GgufArray::I32(_) => "i32",
            GgufArray::F32(_) => "f32",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "string",
            GgufArray::U64(_) => "u64",
            GgufArray::I64(_) => "i64",
            GgufArray::F64(_) => "f64",
            GgufArray::Array(_) => "array",
        }
    }
}

/// One tensor info record.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGML order: `shape[0]` is contiguous.
    pub shape: Vec<u64>,
    /// Raw `ggml_type` id (KNOT may not support it; see [`GgufTensorInfo::dtype`]).
    pub ggml_type: u32,
    /// Offset relative to the start of the tensor data.
    pub offset: u64,
}

impl GgufTensorInfo {
    /// The KNOT dtype, when supported.
    pub fn dtype(&self) -> Option<DType> {
        DType::from_ggml_id(self.ggml_type)
    }
    /// Element count (checked at parse time not to overflow).
    pub fn elems(&self) -> u64 {
        self.shape.iter().product()
    }
    /// Byte length, when the dtype is supported and the shape is whole blocks.
    pub fn byte_len(&self) -> Option<u64> {
        self.dtype()?.bytes_for(self.elems())
    }
}

/// A parsed GGUF header.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    /// Key/values in file order.
    pub metadata: Vec<(String, GgufValue)>,
    index: HashMap<String, usize>,
    pub tensors: Vec<GgufTensorInfo>,
    /// `general.alignment` or 32.
    pub alignment: u64,
    /// Absolute file offset of the tensor data.
    pub data_offset: u64,
}

impl Gguf {
    /// Parses the header part of a GGUF file held in `b`, checking every tensor's byte range
    /// against `b.len()`.
    pub fn parse(b: &[u8], path: &Path) -> Result<Gguf, KnotError> {
        let mut c = Cursor {
            b,
            pos: 0,
            path,
            nested_left: MAX_NESTED_ARRAYS,
        };
        let magic = c.take(4)?;
        if magic != b"GGUF" {
            return Err(c.err_at(
                0,
                format!(
                    "bad magic {:?}, expected \"GGUF\"",
                    String::from_utf8_lossy(magic)
                ),
            ));
        }
        let version = c.u32()?;
        match version {
            2 | 3 => {}
            1 => {
                return Err(c.err_at(
                    4,
                    "GGUF version 1 is not supported (re-convert with a current llama.cpp)".into(),
                ))
            }
            v if v.swap_bytes() <= 3 => {
                return Err(c.err_at(4, "big-endian GGUF is not supported".into()))
            }
            v => return Err(c.err_at(4, format!("unsupported GGUF version {v}"))),
        }
        let tensor_count = c.u64()?;
        let kv_count = c.u64()?;
        // Smallest kv: 8-byte empty key + u32 type + 1-byte value.
        let kv_n = c.count(kv_count, 13, MAX_KV, "metadata key/value count")?;
        let mut metadata = Vec::with_capacity(kv_n);
        let mut index = HashMap::with_capacity(kv_n);
        for _ in 0..kv_n {
            let at = c.pos;
            let key = c.name("metadata key")?;
            let ty = c.u32()?;
            let value = c.value(ty, 0)?;
            if index.insert(key.clone(), metadata.len()).is_some() {
                return Err(c.err_at(at, format!("duplicate metadata key {key:?}")));
            }
            metadata.push((key, value));
        }
        // Smallest tensor info: 8-byte name + u32 n_dims + one u64 dim + u32 type + u64 offset.
        let t_n = c.count(tensor_count, 32, MAX_TENSORS, "tensor count")?;
        let mut tensors = Vec::with_capacity(t_n);
        let mut names = std::collections::HashSet::with_capacity(t_n);
        for _ in 0..t_n {
            let at = c.pos;
            let name = c.name("tensor name")?;
            let n_dims = c.u32()?;
            if n_dims == 0 || n_dims as usize > MAX_DIMS {
                return Err(c.err_at(
                    at,
                    format!("tensor {name:?}: {n_dims} dimensions (1..={MAX_DIMS} allowed)"),
                ));
            }
            let mut shape = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                shape.push(c.u64()?);
            }
            if shape.contains(&0)
                || shape
                    .iter()
                    .try_fold(1u64, |a, &d| a.checked_mul(d))
                    .is_none_or(|n| n > crate::container::MAX_ELEMS)
            {
                return Err(c.err_at(at, format!("tensor {name:?}: absurd shape {shape:?}")));
            }
            let ggml_type = c.u32()?;
            let offset = c.u64()?;
            if !names.insert(name.clone()) {
                return Err(c.err_at(at, format!("duplicate tensor name {name:?}")));
            }
            tensors.push(GgufTensorInfo {
                name,
                shape,
                ggml_type,
                offset,
            });
        }
        let alignment = match index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(c.err_at(
                        0,
                        format!("general.alignment {v:?} is not a power of two <= 1 MiB"),
                    ))
                }
            },
        };
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = b.len() as u64;
        if data_offset > file_len && !tensors.is_empty() {
            return Err(c.err_at(c.pos, "file ends before the tensor data".into()));
        }
        for t in &tensors {
            if t.offset % alignment != 0 {
                return Err(c.err_at(
                    data_offset,
                    format!(
                        "tensor {:?}: offset {} not aligned to {alignment}",
                        t.name, t.offset
                    ),
                ));
            }
            // Unsupported types have no known size; the importer names them.
            if let Some(len) = t.byte_len() {
                let end = data_offset
                    .checked_add(t.offset)
                    .and_then(|s| s.checked_add(len));
                if end.is_none_or(|e| e > file_len) {
                    return Err(c.err_at(
                        data_offset,
                        format!("tensor {:?}: bytes at data+{} (+{len}) run past the end of the {file_len}-byte file", t.name, t.offset),
                    ));
                }
            } else if t.dtype().is_some() {
                return Err(c.err_at(
                    data_offset,
                    format!(
                        "tensor {:?}: shape {:?} is not whole blocks of its type",
                        t.name, t.shape
                    ),
                ));
            }
        }
        Ok(Gguf {
            version,
            metadata,
            index,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A tensor info by name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The bytes of `t` inside `file` (the whole GGUF file), when its type is supported.
    pub fn tensor_bytes<'a>(&self, t: &GgufTensorInfo, file: &'a [u8]) -> Option<&'a [u8]> {
        let start = self.data_offset.checked_add(t.offset)?;
        let end = start.checked_add(t.byte_len()?)?;
        file.get(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }
}

/// A memory-mapped GGUF file with its parsed header.
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    pub gguf: Gguf,
}

impl GgufFile {
    /// Maps and parses `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, KnotError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| KnotError::io("open", &path, e))?;
        // SAFETY: read-only map owned by `GgufFile`; the source file is not expected to change
        // while it is imported (as for any mmap reader).
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| KnotError::io("mmap", &path, e))?;
        let gguf = Gguf::parse(&mmap, &path)?;
        Ok(GgufFile { path, mmap, gguf })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        &self.mmap
    }

    /// The bytes of tensor `t` (`None` when its type is unsupported).
    pub fn tensor_bytes(&self, t: &GgufTensorInfo) -> Option<&[u8]> {
        self.gguf.tensor_bytes(t, &self.mmap)
    }

    /// Sum of the byte lengths of the supported tensors.
    pub fn tensor_data_len(&self) -> u64 {
        self.gguf.tensors.iter().filter_map(|t| t.byte_len()).sum()
    }
}

struct Cursor<'a> {
    b: &'a [u8],
    pos: usize,
    path: &'a Path,
    /// Inner arrays the rest of the file may still hold ([`MAX_NESTED_ARRAYS`]).
    nested_left: usize,
}

impl<'a> Cursor<'a> {
    fn err_at(&self, offset: impl TryInto<u64>, reason: String) -> KnotError {
        let offset = offset.try_into().unwrap_or(u64::MAX);
        KnotError::Gguf {
            path: self.path.to_path_buf(),
            offset,
            reason,
        }
    }

    fn remaining(&self) -> usize {
        self.b.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], KnotError> {
        if n > self.remaining() {
            return Err(self.err_at(
                self.pos,
                format!(
                    "need {n} bytes, only {} remain (truncated file)",
                    self.remaining()
                ),
            ));
        }
        let s = &self.b[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], KnotError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u32(&mut self) -> Result<u32, KnotError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, KnotError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count of items each at least `min_size` bytes: rejected unless they can fit in the
    /// rest of the file, so a hostile count never drives an allocation.
    /// `max` caps it regardless of the file's size.
    fn count(&self, n: u64, min_size: u64, max: u64, what: &str) -> Result<usize, KnotError> {
        if n > max {
            return Err(self.err_at(self.pos, format!("{what} {n} is over the limit of {max}")));
        }
        match n.checked_mul(min_size) {
            Some(need) if need <= self.remaining() as u64 => Ok(n as usize),
            _ => Err(self.err_at(
                self.pos,
                format!(
                    "{what} {n} cannot fit in the {} bytes that remain",
                    self.remaining()
                ),
            )),
        }
    }

    /// A key or tensor name: a string of at most [`MAX_NAME_LEN`] bytes.
    fn name(&mut self, what: &str) -> Result<String, KnotError> {
        let at = self.pos;
        let len = self.u64()?;
        if len > MAX_NAME_LEN {
            return Err(self.err_at(
                at,
                format!("{what} of {len} bytes (at most {MAX_NAME_LEN})"),
            ));
        }
        self.pos = at;
        self.string()
    }

    fn string(&mut self) -> Result<String, KnotError> {
        let mut out = String::new();
        self.string_into(&mut out)?;
        Ok(out)
    }

    /// Reads one string and appends it to `out` (invalid UTF-8 replaced, with a warning).
    fn string_into(&mut self, out: &mut String) -> Result<(), KnotError> {
        let at = self.pos;
        let len = self.u64()?;
        if len > self.remaining() as u64 {
            return Err(self.err_at(
                at,
                format!(
                    "string length {len} exceeds the {} bytes that remain",
                    self.remaining()
                ),
            ));
        }
        let bytes = self.take(len as usize)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => out.push_str(s),
            Err(_) => {
                tracing::warn!(
                    offset = at,
                    "GGUF string is not valid UTF-8; replacing invalid bytes"
                );
                out.push_str(&String::from_utf8_lossy(bytes));
            }
        }
        Ok(())
    }

    /// Smallest encoded size of a value of type `ty` (for the array count check).
    fn min_size(ty: u32) -> u64 {
        match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            _ => 1,
        }
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue, KnotError> {
        let at = self.pos;
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(self.array::<1>()?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                v => return Err(self.err_at(at, format!("bool value {v} is neither 0 nor 1"))),
            },
            8 => GgufValue::String(self.string()?),
            9 => GgufValue::Array(self.array_value(depth)?),
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            t => return Err(self.err_at(at, format!("unknown metadata value type {t}"))),
        })
    }

    /// `n` fixed-size little-endian elements, decoded from one checked slice.
    fn fixed<T, const N: usize>(
        &mut self,
        n: usize,
        f: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, KnotError> {
        let bytes = self.take(n * N)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                f(a)
            })
            .collect())
    }

    /// An array value (after its type tag): element type, count, elements. The count is
    /// checked against the bytes that remain before anything is allocated.
    fn array_value(&mut self, depth: u32) -> Result<GgufArray, KnotError> {
        let at = self.pos;
        if depth >= MAX_DEPTH {
            return Err(self.err_at(at, format!("arrays nested deeper than {MAX_DEPTH}")));
        }
        let elem = self.u32()?;
        if elem > 12 {
            return Err(self.err_at(at, format!("array of unknown value type {elem}")));
        }
        let n = self.u64()?;
        let n = self.count(n, Self::min_size(elem), u64::MAX, "array length")?;
        Ok(match elem {
            0 => GgufArray::U8(self.take(n)?.to_vec()),
            1 => GgufArray::I8(self.fixed(n, i8::from_le_bytes)?),
            2 => GgufArray::U16(self.fixed(n, u16::from_le_bytes)?),
            3 => GgufArray::I16(self.fixed(n, i16::from_le_bytes)?),
            4 => GgufArray::U32(self.fixed(n, u32::from_le_bytes)?),
            5 => GgufArray::I32(self.fixed(n, i32::from_le_bytes)?),
            6 => GgufArray::F32(self.fixed(n, f32::from_le_bytes)?),
            7 => {
                let bytes = self.take(n)?;
                if let Some(i) = bytes.iter().position(|&b| b > 1) {
                    return Err(self.err_at(
                        self.pos - n + i,
                        format!("bool value {} is neither 0 nor 1", bytes[i]),
                    ));
                }
                GgufArray::Bool(bytes.iter().map(|&b| b == 1).collect())
            }
            8 => {
                let mut v = StrArray {
                    text: String::new(),
                    ends: Vec::with_capacity(n),
                };
                for _ in 0..n {
                    self.string_into(&mut v.text)?;
                    v.ends.push(v.text.len());
                }
                GgufArray::String(v)
            }
            9 => {
                if n > self.nested_left {
                    return Err(self.err_at(
                        at,
                        format!(
                            "{n} nested arrays: over the limit of {MAX_NESTED_ARRAYS} per file"
                        ),
                    ));
                }
                self.nested_left -= n;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(depth + 1)?);
                }
                GgufArray::Array(v)
            }
            10 => GgufArray::U64(self.fixed(n, u64::from_le_bytes)?),
            11 => GgufArray::I64(self.fixed(n, i64::from_le_bytes)?),
            _ => GgufArray::F64(self.fixed(n, f64::from_le_bytes)?),
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a GGUF in memory.
    pub(crate) struct Builder {
        kv: Vec<u8>,
        n_kv: u64,
        pub infos: Vec<u8>,
        pub n_t: u64,
        data: Vec<u8>,
    }

    pub(crate) fn gstr(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    impl Builder {
        pub fn new() -> Self {
            Builder {
                kv: vec![],
                n_kv: 0,
                infos: vec![],
                n_t: 0,
                data: vec![],
            }
        }
        pub fn raw_kv(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
            gstr(&mut self.kv, key);
            self.kv.extend_from_slice(&ty.to_le_bytes());
            self.kv.extend_from_slice(value);
            self.n_kv += 1;
            self
        }
        pub fn u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.raw_kv(key, 4, &v.to_le_bytes())
        }
        pub fn f32(&mut self, key: &str, v: f32) -> &mut Self {
            self.raw_kv(key, 6, &v.to_le_bytes())
        }
        pub fn string(&mut self, key: &str, v: &str) -> &mut Self {
            let mut b = vec![];
            gstr(&mut b, v);
            self.raw_kv(key, 8, &b)
        }
        pub fn strings(&mut self, key: &str, v: &[&str]) -> &mut Self {
            let mut b = 8u32.to_le_bytes().to_vec();
            b.extend_from_slice(&(v.len() as u64).to_le_bytes());
            for s in v {
                gstr(&mut b, s);
            }
            self.raw_kv(key, 9, &b)
        }
        pub fn tensor(&mut self, name: &str, dtype: DType, shape: &[u64], seed: u8) -> &mut Self {
            while !self.data.len().is_multiple_of(32) {
                self.data.push(0);
            }
            gstr(&mut self.infos, name);
            self.infos
                .extend_from_slice(&(shape.len() as u32).to_le_bytes());
            for d in shape {
                self.infos.extend_from_slice(&d.to_le_bytes());
            }
            self.infos.extend_from_slice(&dtype.ggml_id().to_le_bytes());
            self.infos
                .extend_from_slice(&(self.data.len() as u64).to_le_bytes());
            let n = dtype.bytes_for(shape.iter().product()).unwrap();
            self.data
                .extend((0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)));
            self.n_t += 1;
            self
        }
        pub fn build(&self) -> Vec<u8> {
            let mut b = b"GGUF".to_vec();
            b.extend_from_slice(&3u32.to_le_bytes());
            b.extend_from_slice(&self.n_t.to_le_bytes());
            b.extend_from_slice(&self.n_kv.to_le_bytes());
            b.extend_from_slice(&self.kv);
            b.extend_from_slice(&self.infos);
            while !b.len().is_multiple_of(32) {
                b.push(0);
            }
            b.extend_from_slice(&self.data);
            b
        }
    }

    fn parse(b: &[u8]) -> Result<Gguf, KnotError> {
        Gguf::parse(b, Path::new("t.gguf"))
    }

    #[test]
    fn parses_all_value_types_and_tensors() {
        let mut g = Builder::new();
        g.raw_kv("u8", 0, &[7])
            .raw_kv("i8", 1, &[0xff])
            .raw_kv("u16", 2, &300u16.to_le_bytes())
            .raw_kv("i16", 3, &(-3i16).to_le_bytes())
            .u32("u32", 70000)
            .raw_kv("i32", 5, &(-5i32).to_le_bytes())
            .f32("f32", 1.5)
            .raw_kv("bool", 7, &[1])
            .string("str", "héllo")
            .raw_kv("u64", 10, &(1u64 << 40).to_le_bytes())
            .raw_kv("i64", 11, &(-1i64).to_le_bytes())
            .raw_kv("f64", 12, &2.25f64.to_le_bytes())
            .strings("arr", &["a", "bc"]);
        // Nested array: [[1u8, 2u8]].
        let mut nested = 9u32.to_le_bytes().to_vec();
        nested.extend_from_slice(&1u64.to_le_bytes());
        nested.extend_from_slice(&0u32.to_le_bytes());
        nested.extend_from_slice(&2u64.to_le_bytes());
        nested.extend_from_slice(&[1, 2]);
        g.raw_kv("nested", 9, &nested);
        g.tensor("w", DType::Q8_0, &[64, 2], 1)
            .tensor("n", DType::F32, &[5], 2);
        let b = g.build();
        let p = parse(&b).unwrap();
        assert_eq!(p.get("u8"), Some(&GgufValue::U8(7)));
        assert_eq!(p.get("i8"), Some(&GgufValue::I8(-1)));
        assert_eq!(p.get("u16").unwrap().as_u64(), Some(300));
        assert_eq!(p.get("i16").unwrap().as_i64(), Some(-3));
        assert_eq!(p.get("u32").unwrap().as_u64(), Some(70000));
        assert_eq!(p.get("i32").unwrap().as_u64(), None);
        assert_eq!(p.get("f32").unwrap().as_f32(), Some(1.5));
        assert_eq!(p.get("bool").unwrap().as_bool(), Some(true));
        assert_eq!(p.get("str").unwrap().as_str(), Some("héllo"));
        assert_eq!(p.get("u64").unwrap().as_u64(), Some(1 << 40));
        assert_eq!(p.get("i64").unwrap().as_i64(), Some(-1));
        assert_eq!(p.get("f64").unwrap().as_f32(), Some(2.25));
        assert_eq!(p.get("arr").unwrap().as_array().unwrap().len(), 2);
        let n = p.get("nested").unwrap().as_array().unwrap();
        assert_eq!(n.array_at(0), Some(&GgufArray::U8(vec![1, 2])));
        let arr = p.get("arr").unwrap().as_array().unwrap().as_strs().unwrap();
        assert_eq!(arr.iter().collect::<Vec<_>>(), ["a", "bc"]);
        assert_eq!(p.tensors.len(), 2);
        assert_eq!(p.alignment, 32);
        assert_eq!(p.data_offset % 32, 0);
        let w = p.tensor("w").unwrap();
        assert_eq!((w.dtype(), w.byte_len()), (Some(DType::Q8_0), Some(136)));
        assert_eq!(p.tensor_bytes(w, &b).unwrap()[..3], [1, 32, 63]);
        let n = p.tensor("n").unwrap();
        assert_eq!(n.offset, 160);
        assert_eq!(p.tensor_bytes(n, &b).unwrap().len(), 20);
    }

    #[test]
    fn arrays_are_typed_and_compact() {
        let arr = |elem: u32, n: u64, body: &[u8]| {
            let mut v = elem.to_le_bytes().to_vec();
            v.extend_from_slice(&n.to_le_bytes());
            v.extend_from_slice(body);
            v
        };
        let i32s: Vec<u8> = [-1i32, 7, 300]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let f32s: Vec<u8> = [0.5f32, -2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let u64s: Vec<u8> = [9u64, 9, 9].iter().flat_map(|x| x.to_le_bytes()).collect();
        let big = vec![3u8; 1 << 20];
        let b = Builder::new()
            .raw_kv("i32s", 9, &arr(5, 3, &i32s))
            .raw_kv("f32s", 9, &arr(6, 2, &f32s))
            .raw_kv("u64s", 9, &arr(10, 3, &u64s))
            .raw_kv("big", 9, &arr(0, 1 << 20, &big))
            .build();
        let p = parse(&b).unwrap();
        let a = p.get("i32s").unwrap().as_array().unwrap();
        assert_eq!((a.len(), a.elem_type_name()), (3, "i32"));
        assert_eq!(
            (a.i64_at(0), a.u64_at(0), a.i64_at(2)),
            (Some(-1), None, Some(300))
        );
        assert_eq!(p.get("i32s").unwrap().as_u64(), None, "not uniform");
        assert_eq!(
            p.get("f32s").unwrap().as_array(),
            Some(&GgufArray::F32(vec![0.5, -2.0]))
        );
        assert_eq!(
            p.get("u64s").unwrap().as_u64(),
            Some(9),
            "uniform per-layer value"
        );
        // One byte per u8 element in memory, as in the file.
        match p.get("big").unwrap().as_array() {
            Some(GgufArray::U8(v)) => assert_eq!((v.len(), v.capacity()), (1 << 20, 1 << 20)),
            other => panic!("{other:?}"),
        }
    }

    fn expect(b: &[u8], want: &str) {
        match parse(b) {
            Ok(_) => panic!("hostile GGUF parsed; wanted {want:?}"),
            Err(e) => assert!(e.to_string().contains(want), "{e} lacks {want:?}"),
        }
    }

    #[test]
    fn hostile_ggufs_are_rejected() {
        let mut g = Builder::new();
        g.string("general.architecture", "llama")
            .tensor("w", DType::F32, &[8], 0);
        let good = g.build();
        parse(&good).unwrap();

        expect(b"", "truncated");
        expect(b"GGML\x03\0\0\0", "bad magic");
        let mut f = good.clone();
        f[4..8].copy_from_slice(&1u32.to_le_bytes());
        expect(&f, "version 1");
        f[4..8].copy_from_slice(&3u32.to_be_bytes());
        expect(&f, "big-endian");
        // Absurd counts: never allocate.
        let mut f = good.clone();
        f[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        expect(&f, "tensor count");
        let mut f = good.clone();
        f[16..24].copy_from_slice(&(1u64 << 60).to_le_bytes());
        expect(&f, "metadata key/value count");
        // A string length beyond the file.
        let mut f = good.clone();
        f[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        expect(
            &f,
            "metadata key of 18446744073709551612 bytes (at most 65535)",
        );
        let mut f = good.clone();
        f[24..32].copy_from_slice(&60_000u64.to_le_bytes());
        expect(&f, "string length 60000 exceeds");
        // Caps that hold however large the file.
        let mut f = good.clone();
        f[8..16].copy_from_slice(&(MAX_TENSORS + 1).to_le_bytes());
        expect(&f, "tensor count 65537 is over the limit of 65536");
        let mut f = good.clone();
        f[16..24].copy_from_slice(&(MAX_KV + 1).to_le_bytes());
        expect(&f, "metadata key/value count 65537 is over the limit");
        // Truncated anywhere in the header or data.
        for cut in [10, 30, 60, good.len() - 1] {
            assert!(parse(&good[..cut]).is_err(), "cut at {cut} parsed");
        }
        // An array count that cannot fit.
        let mut g2 = Builder::new();
        let mut v = 8u32.to_le_bytes().to_vec();
        v.extend_from_slice(&(1u64 << 40).to_le_bytes());
        g2.raw_kv("tokens", 9, &v);
        expect(&g2.build(), "array length");
        // Unknown type, bad bool, deep nesting.
        expect(
            &Builder::new().raw_kv("x", 99, &[0; 8]).build(),
            "unknown metadata value type 99",
        );
        expect(&Builder::new().raw_kv("x", 7, &[2]).build(), "bool value 2");
        let mut deep = Vec::new();
        for _ in 0..5 {
            deep.extend_from_slice(&9u32.to_le_bytes());
            deep.extend_from_slice(&1u64.to_le_bytes());
        }
        deep.extend_from_slice(&[0; 16]);
        expect(
            &Builder::new().raw_kv("x", 9, &deep).build(),
            "nested deeper",
        );
        // Inner arrays cost more in memory than on disk: capped per file.
        let mut many = 9u32.to_le_bytes().to_vec();
        many.extend_from_slice(&(MAX_NESTED_ARRAYS as u64 + 1).to_le_bytes());
        for _ in 0..=MAX_NESTED_ARRAYS {
            many.extend_from_slice(&0u32.to_le_bytes());
            many.extend_from_slice(&0u64.to_le_bytes());
        }
        expect(
            &Builder::new().raw_kv("x", 9, &many).build(),
            "65537 nested arrays: over the limit of 65536 per file",
        );
        let mut bools = 7u32.to_le_bytes().to_vec();
        bools.extend_from_slice(&3u64.to_le_bytes());
        bools.extend_from_slice(&[1, 0, 2]);
        expect(
            &Builder::new().raw_kv("b", 9, &bools).build(),
            "bool value 2",
        );
        // Duplicate keys, absurd dims, bad alignment, tensor beyond the file.
        expect(
            &Builder::new().u32("a", 1).u32("a", 2).build(),
            "duplicate metadata key",
        );
        let mut g4 = Builder::new();
        gstr(&mut g4.infos, "huge");
        g4.infos.extend_from_slice(&3u32.to_le_bytes());
        for _ in 0..3 {
            g4.infos.extend_from_slice(&(1u64 << 30).to_le_bytes());
        }
        g4.infos.extend_from_slice(&[0; 12]);
        g4.n_t = 1;
        expect(&g4.build(), "absurd shape");
        let mut g5 = Builder::new();
        gstr(&mut g5.infos, "fivedims");
        g5.infos.extend_from_slice(&5u32.to_le_bytes());
        g5.infos.extend_from_slice(&[1; 52]);
        g5.n_t = 1;
        expect(&g5.build(), "5 dimensions");
        expect(
            &Builder::new().u32("general.alignment", 3).build(),
            "power of two",
        );
        let mut g3 = Builder::new();
        g3.tensor("w", DType::F32, &[64], 0);
        let b3 = g3.build();
        expect(&b3[..b3.len() - 4], "run past the end");
    }

    #[test]
    fn random_corruption_never_panics() {
        let mut g = Builder::new();
        g.string("general.architecture", "llama")
            .strings("tokenizer.ggml.tokens", &["a", "b", "c"])
            .u32("llama.block_count", 2)
            .tensor("w", DType::Q4_0, &[32, 2], 0);
        let good = g.build();
        let mut s = 0x1234_5678_9abc_def1u64;
        for _ in 0..20_000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let mut f = good.clone();
            let at = (s as usize) % f.len();
            f[at] = (s >> 32) as u8;
            let _ = parse(&f);
        }
    }
}
