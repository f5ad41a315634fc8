//! The durable record store: an in-memory index over an append-only log.
//!
//! # Log format (`DATA_DIR/residues.log`)
//!
//! ```text
//! magic   8 bytes  "FOILLOG1"
//! frame*  len: u32 LE | crc: u32 LE (CRC-32/IEEE of payload) | payload: `len` bytes of record JSON
//! ```
//!
//! Every admission appends one frame and `fdatasync`s before it is acknowledged, so an
//! acknowledged record survives `kill -9` and power loss (as far as the disk honours fsync).
//! On start the log is replayed in order; the last frame for a key wins. A frame that is cut
//! short or fails its checksum ends the replay: the log is truncated there with a warning (the
//! dropped bytes are copied first to a new `residues.log.dropped.N`, N = 1, 2, ..., so no
//! earlier recovery's bytes are overwritten) and the server starts anyway.
//! Only a file whose magic is wrong is refused, so a foreign file is never clobbered.
//!
//! # Bounds and eviction
//!
//! The store holds at most `max_records` records and `max_bytes` bytes of frames; past either
//! bound the oldest admissions are evicted first. Replaced and evicted frames stay in the log as
//! dead bytes until they exceed `compact_threshold`; then the live records are rewritten to
//! `residues.log.tmp`, fsynced, and renamed over the log (atomic), and the directory is fsynced.
//! A compaction that fails (e.g. ENOSPC) removes its temp file, so a full disk gets its space
//! back, leaves the old log in place and is retried once another `compact_threshold` of dead
//! bytes has built up. Replaying a log under the same bounds rebuilds the same set of records.
//!
//! # Duplicates
//!
//! Admitting a record whose content equals the stored one (ignoring `created`) is a no-op:
//! nothing is written and the original `created` is kept ([`Disposition::Unchanged`]). A record
//! with the same key but different content replaces the stored one, becomes the newest for
//! eviction, and gets a new `created` ([`Disposition::Replaced`]).

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::record::{Disposition, RecordError, ResidueRecord};
use crc32fast::hash as crc32;

/// First bytes of every log file.
pub const LOG_MAGIC: &[u8; 8] = b"FOILLOG1";
/// Bytes of a frame header (length + checksum).
pub const FRAME_HEADER: u64 = 8;
/// Largest frame payload replay accepts; a longer length field is treated as corruption.
pub const MAX_FRAME_PAYLOAD: u64 = 64 << 20;
/// File name of the log inside the data directory.
pub const LOG_FILE: &str = "residues.log";
/// File name the compactor writes before renaming over the log.
pub const TMP_FILE: &str = "residues.log.tmp";
/// Prefix of the files bytes dropped by recovery are copied to: `residues.log.dropped.N`,
/// N = 1, 2, ... (each recovery takes the first free number).
pub const DROPPED_FILE: &str = "residues.log.dropped";
/// Lock file that keeps two collectors off one data directory.
pub const LOCK_FILE: &str = "LOCK";

/// Errors of the store. Each names the file it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The data directory could not be created.
    #[error("cannot create data directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A file could not be opened.
    #[error("cannot open {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Another process holds the data directory's lock.
    #[error("data directory is in use by another foil-control (lock {path} is held)")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// The log exists but does not start with [`LOG_MAGIC`].
    #[error("{path} is not a foil-control log (bad magic); refusing to touch it")]
    NotALog {
        /// The file.
        path: PathBuf,
    },
    /// Reading, writing, syncing or truncating a file failed.
    #[error("{step} {path}")]
    Io {
        /// What was being done, e.g. "fsync".
        step: &'static str,
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The record could not be encoded.
    #[error("cannot encode record")]
    Encode(#[source] serde_json::Error),
    /// The record failed validation.
    #[error("invalid record: {0}")]
    Invalid(#[from] RecordError),
    /// One record is larger than the whole byte budget.
    #[error("record frame of {bytes} bytes exceeds the store's max of {max} bytes")]
    RecordTooLarge {
        /// Frame size.
        bytes: u64,
        /// The store's `max_bytes`.
        max: u64,
    },
}

/// Limits of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreConfig {
    /// Most records kept; the oldest are evicted past it. At least 1.
    pub max_records: usize,
    /// Most frame bytes kept (live records); the oldest are evicted past it.
    pub max_bytes: u64,
    /// Dead bytes in the log (evicted or replaced frames) that trigger a compaction.
    pub compact_threshold: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_records: 100_000,
            max_bytes: 256 << 20,
            compact_threshold: 16 << 20,
        }
    }
}

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Frames replayed successfully.
    pub frames: usize,
    /// Records live after replay (and eviction under the current bounds).
    pub records: usize,
    /// Bytes cut off the tail (torn or corrupt frame and everything after it).
    pub dropped_bytes: u64,
    /// Why the tail was cut, if it was.
    pub dropped_reason: Option<String>,
    /// Frames with a good checksum whose JSON did not parse (skipped).
    pub skipped_frames: usize,
}

/// Result of an admission.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// Stored, unchanged or replaced.
    pub disposition: Disposition,
    /// The record as stored (with `created`).
    pub record: ResidueRecord,
    /// Records evicted to make room.
    pub evicted: usize,
}

/// Counters for `/.aeon/health`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Live records.
    pub records: usize,
    /// Bytes of the live records' frames.
    pub live_bytes: u64,
    /// Size of the log file (live + dead frames + magic).
    pub log_bytes: u64,
    /// Records evicted since start (including during replay).
    pub evicted: u64,
    /// Compactions since start.
    pub compactions: u64,
}

struct Entry {
    seq: u64,
    frame_len: u64,
    record: ResidueRecord,
}

/// The store. Not internally synchronised: wrap it in a mutex to share it.
pub struct Store {
    dir: PathBuf,
    log_path: PathBuf,
    log: File,
    _lock: File,
    cfg: StoreConfig,
    entries: HashMap<String, Entry>,
    /// Admission order: seq -> key; the first entry is the oldest.
    order: BTreeMap<u64, String>,
    next_seq: u64,
    live_bytes: u64,
    dead_bytes: u64,
    log_bytes: u64,
    evicted: u64,
    compactions: u64,
    /// Dead bytes that trigger the next compaction: `compact_threshold`, raised by another
    /// threshold after a failed compaction so a full disk is not rewritten on every admit.
    compact_at: u64,
}

fn io<'a>(step: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        step,
        path: path.to_path_buf(),
        source,
    }
}

/// Takes an exclusive, non-blocking `flock` on `file`. The kernel drops it when the
/// process dies, so a `kill -9` never leaves a stale lock.
#[cfg(unix)]
fn lock_exclusive(file: &File, path: &Path) -> Result<(), StoreError> {
    use std::os::fd::AsRawFd;
    // SAFETY: flock on a file descriptor we own for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.kind() == std::io::ErrorKind::WouldBlock {
        Err(StoreError::Locked {
            path: path.to_path_buf(),
        })
    } else {
        Err(StoreError::Io {
            step: "flock",
            path: path.to_path_buf(),
            source: err,
        })
    }
}

#[cfg(not(unix))]
fn lock_exclusive(_file: &File, _path: &Path) -> Result<(), StoreError> {
    Ok(())
}

/// fsyncs a directory so a rename or create inside it is durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))
}

/// Creates `dir/PREFIX.N` for the first N from 1 that does not exist yet (`create_new`, so
/// an existing file is never truncated).
fn create_numbered(dir: &Path, prefix: &str) -> Result<(PathBuf, File), StoreError> {
    for n in 1u32.. {
        let path = dir.join(format!("{prefix}.{n}"));
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(f) => return Ok((path, f)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io("create", &path)(e)),
        }
    }
    Err(StoreError::Io {
        step: "create",
        path: dir.join(prefix),
        source: std::io::Error::other("every numbered name is taken"),
    })
}

/// Formats an error with its source chain, `a: b: c`.
pub struct ErrorChain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cur = self.0.source();
        while let Some(c) = cur {
            write!(f, ": {c}")?;
            cur = c.source();
        }
        Ok(())
    }
}

fn encode_frame(record: &ResidueRecord) -> Result<Vec<u8>, StoreError> {
    let payload = serde_json::to_vec(record).map_err(StoreError::Encode)?;
    let mut frame = Vec::with_capacity(payload.len() + FRAME_HEADER as usize);
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    Ok(frame)
}

/// Reads up to `buf.len()` bytes; returns how many were read (short only at EOF).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

impl Store {
    /// Opens (creating if needed) the store in `dir`, takes its lock and replays the log.
    pub fn open(dir: &Path, cfg: StoreConfig) -> Result<(Store, RecoveryReport), StoreError> {
        let cfg = StoreConfig {
            max_records: cfg.max_records.max(1),
            ..cfg
        };
        std::fs::create_dir_all(dir).map_err(|source| StoreError::CreateDir {
            path: dir.to_path_buf(),
            source,
        })?;
        let lock_path = dir.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|source| StoreError::Open {
                path: lock_path.clone(),
                source,
            })?;
        lock_exclusive(&lock, &lock_path)?;

        // A leftover temp file is an interrupted compaction; the rename never happened,
        // so the log itself is intact.
        let tmp_path = dir.join(TMP_FILE);
        if tmp_path.exists() {
            tracing::warn!(path = %tmp_path.display(), "removing leftover compaction file");
            std::fs::remove_file(&tmp_path).map_err(io("remove", &tmp_path))?;
        }

        let log_path = dir.join(LOG_FILE);
        let log = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(&log_path)
            .map_err(|source| StoreError::Open {
                path: log_path.clone(),
                source,
            })?;
        let mut store = Store {
            dir: dir.to_path_buf(),
            log_path,
            log,
            _lock: lock,
            cfg,
            entries: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            live_bytes: 0,
            dead_bytes: 0,
            log_bytes: 0,
            evicted: 0,
            compactions: 0,
            compact_at: cfg.compact_threshold,
        };
        let report = store.replay()?;
        store.maybe_compact();
        Ok((store, report))
    }

    /// Replays the log into the index, truncating a torn or corrupt tail.
    fn replay(&mut self) -> Result<RecoveryReport, StoreError> {
        let path = self.log_path.clone();
        let len = self.log.metadata().map_err(io("stat", &path))?.len();
        let mut report = RecoveryReport::default();
        let mut reader = BufReader::with_capacity(1 << 16, &self.log);

        // Magic. An empty or half-written header is a log whose creation was interrupted.
        let mut magic = [0u8; 8];
        let got = read_full(&mut reader, &mut magic).map_err(io("read", &path))?;
        if got < magic.len() {
            if magic[..got] != LOG_MAGIC[..got] {
                return Err(StoreError::NotALog { path });
            }
            drop(reader);
            self.log.set_len(0).map_err(io("truncate", &path))?;
            self.log.write_all(LOG_MAGIC).map_err(io("write", &path))?;
            self.log.sync_all().map_err(io("fsync", &path))?;
            sync_dir(&self.dir)?;
            self.log_bytes = LOG_MAGIC.len() as u64;
            return Ok(report);
        }
        if &magic != LOG_MAGIC {
            return Err(StoreError::NotALog { path });
        }

        let mut offset = LOG_MAGIC.len() as u64;
        let mut frames: Vec<(ResidueRecord, u64)> = Vec::new();
        let mut cut: Option<String> = None;
        let mut payload = Vec::new();
        while offset < len {
            let remaining = len - offset;
            if remaining < FRAME_HEADER {
                cut = Some(format!("incomplete frame header ({remaining} bytes)"));
                break;
            }
            let mut hdr = [0u8; FRAME_HEADER as usize];
            read_full(&mut reader, &mut hdr).map_err(io("read", &path))?;
            let plen = u64::from(u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]));
            let crc = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
            if plen > MAX_FRAME_PAYLOAD || plen > remaining - FRAME_HEADER {
                cut = Some(format!(
                    "frame length {plen} exceeds the {} bytes left",
                    remaining - FRAME_HEADER
                ));
                break;
            }
            payload.resize(plen as usize, 0);
            read_full(&mut reader, &mut payload).map_err(io("read", &path))?;
            if crc32(&payload) != crc {
                cut = Some("checksum mismatch".to_string());
                break;
            }
            let frame_len = FRAME_HEADER + plen;
            match serde_json::from_slice::<ResidueRecord>(&payload) {
                Ok(record) => frames.push((record, frame_len)),
                Err(e) => {
                    tracing::warn!(offset, error = %e, "skipping log frame whose JSON does not parse");
                    report.skipped_frames += 1;
                    self.dead_bytes += frame_len;
                }
            }
            offset += frame_len;
        }
        drop(reader);

        if let Some(reason) = cut {
            let dropped = len - offset;
            let saved = self.save_dropped(offset)?;
            tracing::warn!(
                path = %path.display(),
                offset,
                dropped_bytes = dropped,
                reason = %reason,
                saved_to = %saved.display(),
                "torn or corrupt log tail: truncating (dropped bytes copied first)"
            );
            self.log.set_len(offset).map_err(io("truncate", &path))?;
            self.log.sync_all().map_err(io("fsync", &path))?;
            report.dropped_bytes = dropped;
            report.dropped_reason = Some(reason);
        }
        self.log_bytes = offset;
        report.frames = frames.len();
        for (record, frame_len) in frames {
            self.apply(record, frame_len);
        }
        report.records = self.entries.len();
        Ok(report)
    }

    /// Copies the log from `offset` to the end into a new `DROPPED_FILE.N` (the first free
    /// N from 1; bounded by the log size), so a truncation never destroys bytes without a
    /// trace and a later recovery never overwrites an earlier one's bytes.
    fn save_dropped(&self, offset: u64) -> Result<PathBuf, StoreError> {
        use std::io::{Seek, SeekFrom};
        let mut src = File::open(&self.log_path).map_err(io("open", &self.log_path))?;
        src.seek(SeekFrom::Start(offset))
            .map_err(io("seek", &self.log_path))?;
        let (dropped_path, mut dst) = create_numbered(&self.dir, DROPPED_FILE)?;
        std::io::copy(&mut src, &mut dst).map_err(io("write", &dropped_path))?;
        dst.sync_all().map_err(io("fsync", &dropped_path))?;
        sync_dir(&self.dir)?;
        Ok(dropped_path)
    }

    /// Puts a record into the index as the newest and evicts past the bounds.
    fn apply(&mut self, record: ResidueRecord, frame_len: u64) -> usize {
        if let Some(old) = self.entries.remove(&record.key) {
            self.order.remove(&old.seq);
            self.live_bytes -= old.frame_len;
            self.dead_bytes += old.frame_len;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.insert(seq, record.key.clone());
        self.live_bytes += frame_len;
        self.entries.insert(
            record.key.clone(),
            Entry {
                seq,
                frame_len,
                record,
            },
        );
        self.evict()
    }

    /// Evicts the oldest records until both bounds hold; returns how many went.
    fn evict(&mut self) -> usize {
        let mut n = 0;
        while self.entries.len() > self.cfg.max_records || self.live_bytes > self.cfg.max_bytes {
            let Some((_, key)) = self.order.pop_first() else {
                break;
            };
            if let Some(old) = self.entries.remove(&key) {
                self.live_bytes -= old.frame_len;
                self.dead_bytes += old.frame_len;
                n += 1;
            }
        }
        self.evicted += n as u64;
        n
    }

    /// Admits a record: validates it, appends and fsyncs its frame, then indexes it.
    /// `now` (Unix seconds) becomes its `created`. Returns once the frame is durable.
    pub fn admit(&mut self, record: &ResidueRecord, now: u64) -> Result<Admitted, StoreError> {
        record.validate()?;
        if let Some(existing) = self.entries.get(&record.key) {
            if existing.record.same_content(record) {
                return Ok(Admitted {
                    disposition: Disposition::Unchanged,
                    record: existing.record.clone(),
                    evicted: 0,
                });
            }
        }
        let mut stored = record.clone();
        stored.created = Some(now);
        let frame = encode_frame(&stored)?;
        let frame_len = frame.len() as u64;
        if frame_len > self.cfg.max_bytes {
            return Err(StoreError::RecordTooLarge {
                bytes: frame_len,
                max: self.cfg.max_bytes,
            });
        }
        let before = self.log_bytes;
        let written = self
            .log
            .write_all(&frame)
            .map_err(io("append to", &self.log_path))
            .and_then(|()| self.log.sync_data().map_err(io("fsync", &self.log_path)));
        if let Err(e) = written {
            // Never leave a partial frame in the middle of the log: cut back to the last
            // acknowledged frame so later appends stay readable.
            if let Err(te) = self.log.set_len(before) {
                tracing::error!(error = %te, "cannot truncate log after a failed append");
            }
            return Err(e);
        }
        self.log_bytes += frame_len;
        let disposition = if self.entries.contains_key(&stored.key) {
            Disposition::Replaced
        } else {
            Disposition::Stored
        };
        let evicted = self.apply(stored.clone(), frame_len);
        self.maybe_compact();
        Ok(Admitted {
            disposition,
            record: stored,
            evicted,
        })
    }

    /// Compacts when the dead bytes have reached the trigger. A failure is logged, not
    /// returned: the old log is still valid (the rename is the commit point), so the store
    /// goes on serving and tries again after another `compact_threshold` of dead bytes.
    fn maybe_compact(&mut self) {
        if self.dead_bytes <= self.compact_at {
            return;
        }
        match self.compact() {
            Ok(()) => self.compact_at = self.cfg.compact_threshold,
            Err(e) => {
                self.compact_at = self.dead_bytes.saturating_add(self.cfg.compact_threshold);
                tracing::warn!(
                    error = %ErrorChain(&e),
                    retry_at_dead_bytes = self.compact_at,
                    "log compaction failed; serving from the old log"
                );
            }
        }
    }

    /// Rewrites the log with only the live records (oldest first), atomically. On failure
    /// the temp file is removed (a half-written copy must not keep a full disk full) and the
    /// old log stays in place.
    pub fn compact(&mut self) -> Result<(), StoreError> {
        let tmp_path = self.dir.join(TMP_FILE);
        let written = self.write_compacted(&tmp_path);
        if written.is_err() {
            if let Err(e) = std::fs::remove_file(&tmp_path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::error!(path = %tmp_path.display(), error = %e, "cannot remove the failed compaction's temp file");
                }
            }
        }
        let bytes = written?;
        self.log = OpenOptions::new()
            .read(true)
            .append(true)
            .open(&self.log_path)
            .map_err(|source| StoreError::Open {
                path: self.log_path.clone(),
                source,
            })?;
        tracing::info!(
            reclaimed_bytes = self.log_bytes.saturating_sub(bytes),
            log_bytes = bytes,
            records = self.entries.len(),
            "compacted log"
        );
        self.log_bytes = bytes;
        self.dead_bytes = 0;
        self.compactions += 1;
        Ok(())
    }

    /// Writes the live records to `tmp_path`, fsyncs it and renames it over the log (then
    /// fsyncs the directory); returns the new log's length.
    fn write_compacted(&self, tmp_path: &Path) -> Result<u64, StoreError> {
        let tmp = File::create(tmp_path).map_err(io("create", tmp_path))?;
        let mut w = BufWriter::with_capacity(1 << 16, tmp);
        w.write_all(LOG_MAGIC).map_err(io("write", tmp_path))?;
        let mut bytes = LOG_MAGIC.len() as u64;
        for key in self.order.values() {
            let entry = &self.entries[key];
            let frame = encode_frame(&entry.record)?;
            w.write_all(&frame).map_err(io("write", tmp_path))?;
            bytes += frame.len() as u64;
        }
        let tmp = w.into_inner().map_err(|e| StoreError::Io {
            step: "write",
            path: tmp_path.to_path_buf(),
            source: e.into_error(),
        })?;
        tmp.sync_all().map_err(io("fsync", tmp_path))?;
        drop(tmp);
        std::fs::rename(tmp_path, &self.log_path).map_err(io("rename over log", tmp_path))?;
        sync_dir(&self.dir)?;
        Ok(bytes)
    }

    /// The record stored under `key`, if any.
    pub fn get(&self, key: &str) -> Option<&ResidueRecord> {
        self.entries.get(key).map(|e| &e.record)
    }

    /// Current counters.
    pub fn stats(&self) -> Stats {
        Stats {
            records: self.entries.len(),
            live_bytes: self.live_bytes,
            log_bytes: self.log_bytes,
            evicted: self.evicted,
            compactions: self.compactions,
        }
    }

    /// Path of the log file.
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: u32) -> ResidueRecord {
        ResidueRecord::dense("m", &[i, i + 1], i * 3, i as f32 * 0.5)
    }

    fn cfg(max_records: usize, compact_threshold: u64) -> StoreConfig {
        StoreConfig {
            max_records,
            max_bytes: 1 << 30,
            compact_threshold,
        }
    }

    #[test]
    fn replay_restores_records_and_dispositions() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, rep) = Store::open(dir.path(), cfg(100, 1 << 20)).unwrap();
            assert_eq!(rep.records, 0);
            for i in 0..10 {
                assert_eq!(
                    s.admit(&rec(i), 7).unwrap().disposition,
                    Disposition::Stored
                );
            }
            let a = s.admit(&rec(3), 8).unwrap();
            assert_eq!(a.disposition, Disposition::Unchanged);
            assert_eq!(
                a.record.created,
                Some(7),
                "an unchanged duplicate keeps its created"
            );
            let mut changed = rec(4);
            changed.argmax = 999;
            assert_eq!(
                s.admit(&changed, 9).unwrap().disposition,
                Disposition::Replaced
            );
        }
        let (s, rep) = Store::open(dir.path(), cfg(100, 1 << 20)).unwrap();
        assert_eq!(rep.records, 10);
        assert_eq!(rep.frames, 11);
        assert_eq!(rep.dropped_bytes, 0);
        assert_eq!(s.get(&rec(4).key).unwrap().argmax, 999);
        assert_eq!(s.get(&rec(4).key).unwrap().created, Some(9));
        assert_eq!(s.get(&rec(0).key).unwrap().created, Some(7));
    }

    #[test]
    fn second_open_on_same_dir_is_refused_while_locked() {
        let dir = tempfile::tempdir().unwrap();
        let (_s, _) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert!(matches!(
            Store::open(dir.path(), StoreConfig::default()),
            Err(StoreError::Locked { .. })
        ));
    }

    #[test]
    fn torn_tail_is_truncated_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let good_len;
        {
            let (mut s, _) = Store::open(dir.path(), StoreConfig::default()).unwrap();
            for i in 0..5 {
                s.admit(&rec(i), 1).unwrap();
            }
            good_len = s.stats().log_bytes;
        }
        let log = dir.path().join(LOG_FILE);
        // Half a frame: a header announcing 100 bytes followed by 10.
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(&100u32.to_le_bytes()).unwrap();
        f.write_all(&0u32.to_le_bytes()).unwrap();
        f.write_all(&[b'{'; 10]).unwrap();
        drop(f);
        let (mut s, rep) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(rep.records, 5);
        assert_eq!(rep.dropped_bytes, 18);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), good_len);
        assert_eq!(
            std::fs::metadata(dir.path().join(format!("{DROPPED_FILE}.1")))
                .unwrap()
                .len(),
            18
        );
        // Appends after recovery are readable.
        s.admit(&rec(50), 2).unwrap();
        drop(s);
        let (_s, rep) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!((rep.records, rep.dropped_bytes), (6, 0));
    }

    /// Issue 17 item 13: each recovery overwrote `residues.log.dropped`, so an earlier torn
    /// tail was lost. Each recovery now keeps its own numbered copy.
    #[test]
    fn each_recovery_keeps_its_own_dropped_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(LOG_FILE);
        for (round, tail) in [&b"first torn tail"[..], b"second, longer torn tail"]
            .into_iter()
            .enumerate()
        {
            let (mut s, _) = Store::open(dir.path(), StoreConfig::default()).unwrap();
            s.admit(&rec(round as u32), 1).unwrap();
            drop(s);
            let mut f = OpenOptions::new().append(true).open(&log).unwrap();
            f.write_all(&1000u32.to_le_bytes()).unwrap();
            f.write_all(&0u32.to_le_bytes()).unwrap();
            f.write_all(tail).unwrap();
        }
        let (_s, rep) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(rep.records, 2);
        let dropped = |n: u32| std::fs::read(dir.path().join(format!("{DROPPED_FILE}.{n}")));
        assert_eq!(&dropped(1).unwrap()[8..], b"first torn tail");
        assert_eq!(&dropped(2).unwrap()[8..], b"second, longer torn tail");
        assert!(dropped(3).is_err());
    }

    /// Issue 17 item 13: a compaction that failed with ENOSPC left `residues.log.tmp`
    /// behind, keeping the disk full (every later admit failed) until a restart. The temp
    /// file is removed on failure and the store keeps serving from the old log. ENOSPC comes
    /// from `/dev/full`: the temp path is a symlink to it.
    #[cfg(target_os = "linux")]
    #[test]
    fn failed_compaction_removes_its_temp_file_and_keeps_serving() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(TMP_FILE);
        let (mut s, _) = Store::open(dir.path(), cfg(4, 1024)).unwrap();
        std::os::unix::fs::symlink("/dev/full", &tmp).unwrap();
        // Past the 1024 dead bytes that trigger a compaction (each frame is ~120 bytes,
        // four live), but short of the next try.
        let i = 16;
        for j in 0..i {
            s.admit(&rec(j), 1)
                .expect("admits go on while compaction fails");
        }
        let st = s.stats();
        assert!(
            st.log_bytes > st.live_bytes + 1024,
            "a compaction was due: {st:?}"
        );
        assert_eq!(st.compactions, 0, "the compaction hit ENOSPC");
        assert!(
            std::fs::symlink_metadata(&tmp).is_err(),
            "the failed compaction's temp file is gone"
        );
        // With the space back, a later compaction succeeds and nothing was lost.
        for j in i..i + 40 {
            s.admit(&rec(j), 2).unwrap();
        }
        assert!(s.stats().compactions > 0);
        assert_eq!(s.stats().records, 4);
        let last = rec(i + 39).key;
        drop(s);
        let (s, _) = Store::open(dir.path(), cfg(4, 1024)).unwrap();
        assert!(s.get(&last).is_some());
    }

    #[test]
    fn checksum_mismatch_cuts_the_log_there() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut s, _) = Store::open(dir.path(), StoreConfig::default()).unwrap();
            for i in 0..3 {
                s.admit(&rec(i), 1).unwrap();
            }
        }
        let log = dir.path().join(LOG_FILE);
        let mut bytes = std::fs::read(&log).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x55; // flip a byte in the last payload
        std::fs::write(&log, &bytes).unwrap();
        let (s, rep) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(rep.records, 2);
        assert_eq!(rep.dropped_reason.as_deref(), Some("checksum mismatch"));
        assert!(s.get(&rec(2).key).is_none());
    }

    #[test]
    fn foreign_file_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join(LOG_FILE);
        std::fs::write(&log, b"not a log at all").unwrap();
        assert!(matches!(
            Store::open(dir.path(), StoreConfig::default()),
            Err(StoreError::NotALog { .. })
        ));
        assert_eq!(std::fs::read(&log).unwrap(), b"not a log at all");
    }

    #[test]
    fn half_written_magic_is_recovered() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOG_FILE), &LOG_MAGIC[..3]).unwrap();
        let (mut s, _) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        s.admit(&rec(1), 1).unwrap();
        drop(s);
        let (_s, rep) = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(rep.records, 1);
    }

    #[test]
    fn eviction_is_oldest_first_and_compaction_bounds_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(10, 2048);
        let mut max_log = 0;
        {
            let (mut s, _) = Store::open(dir.path(), c).unwrap();
            for i in 0..200 {
                s.admit(&rec(i), 1).unwrap();
                max_log = max_log.max(s.stats().log_bytes);
                assert!(s.stats().records <= 10);
            }
            let st = s.stats();
            assert_eq!(st.records, 10);
            assert_eq!(st.evicted, 190);
            assert!(st.compactions > 0);
            assert!(s.get(&rec(189).key).is_none());
            assert!(s.get(&rec(190).key).is_some());
            // Log size stays within live + threshold + one frame.
            assert!(
                max_log <= st.live_bytes + 2048 + 200 + 8,
                "log grew to {max_log}"
            );
        }
        assert!(!dir.path().join(TMP_FILE).exists());
        let (s, rep) = Store::open(dir.path(), c).unwrap();
        assert_eq!(rep.records, 10);
        assert!(s.get(&rec(190).key).is_some() && s.get(&rec(199).key).is_some());
        assert!(s.get(&rec(189).key).is_none());
    }

    #[test]
    fn byte_budget_evicts_and_oversized_record_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let one = encode_frame(&{
            let mut r = rec(0);
            r.created = Some(1);
            r
        })
        .unwrap()
        .len() as u64;
        let c = StoreConfig {
            max_records: 1000,
            max_bytes: one * 3,
            compact_threshold: 1 << 20,
        };
        let (mut s, _) = Store::open(dir.path(), c).unwrap();
        for i in 0..5 {
            s.admit(&rec(i), 1).unwrap();
        }
        assert!(s.stats().live_bytes <= one * 3);
        assert!(s.get(&rec(4).key).is_some() && s.get(&rec(0).key).is_none());
        let mut big = rec(9);
        big.set_residual(&vec![0.0; 1000]);
        assert!(matches!(
            s.admit(&big, 1),
            Err(StoreError::RecordTooLarge { .. })
        ));
    }
}
