//! A GGUF runs directly: the first use imports it once into the model cache, later uses reuse
//! that KNOT. The GGUF itself is never mapped in place: the KNOT's per-tensor BLAKE3 hashes are
//! what the station verifies and grants bind to, and a GGUF carries none.
//!
//! The cached file is named by the source's canonical path, length and modification time, so
//! a GGUF changed in place (or a different file at the same path) is imported again; an
//! unchanged one costs one `stat`. Writes are atomic (the writer's temp file + rename), so two
//! stations starting on the same GGUF at once both end with a whole file and nothing is lost
//! when an import is interrupted.

use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use crate::KnotError;

/// The model cache: `$AEON_MODELS_DIR`, else `$XDG_CACHE_HOME/aeon-shell/models`, else
/// `~/.cache/aeon-shell/models` (where `scripts/fetch-model.sh` keeps the real models).
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("AEON_MODELS_DIR") {
        return d;
    }
    let base = env("XDG_CACHE_HOME")
        .or_else(|| env("HOME").map(|h| h.join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("aeon-shell").join("models")
}

/// Whether `path` starts with GGUF's magic.
pub fn is_gguf(path: &Path) -> Result<bool, KnotError> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut f = std::fs::File::open(path).map_err(|e| KnotError::io("open", path, e))?;
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == b"GGUF"),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(KnotError::io("read", path, e)),
    }
}

/// Where the import of `gguf` lives in `dir`: `imported/STEM-KEY.knot`, KEY naming the source
/// by canonical path, length and modification time.
pub fn imported_path(gguf: &Path, dir: &Path) -> Result<PathBuf, KnotError> {
    let canon = gguf
        .canonicalize()
        .map_err(|e| KnotError::io("resolve", gguf, e))?;
    let meta = std::fs::metadata(&canon).map_err(|e| KnotError::io("stat", gguf, e))?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let mut h = blake3::Hasher::new();
    h.update(canon.as_os_str().as_encoded_bytes());
    h.update(&meta.len().to_le_bytes());
    h.update(&mtime.to_le_bytes());
    let key = h.finalize().to_hex();
    let stem = canon
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    Ok(dir
        .join("imported")
        .join(format!("{stem}-{}.knot", &key[..16])))
}
