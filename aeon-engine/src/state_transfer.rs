//! A session's state at one position as bytes, so that a replica of a node can take over a
//! conversation from there instead of replaying it from position 0 (issue 35: checkpoints
//! shipped to replicas; the wire route is `POST /checkpoint`, specs/station-wire.md).
//!
//! The record covers the session's held blocks `a..b` at position `pos`: every recurrent
//! block's live state (a short convolution's last inputs, a state-space layer's window and
//! scan state, a Gated DeltaNet's window and matrices: a size fixed by the model, whatever
//! `pos`) and every attention block's keys and values from position `from` on (the rows the
//! receiver does not hold yet; a KV cache only grows, so a sender ships each row once).
//!
//! Layout, little-endian: `AEONST01`; u32 `a`, u32 `b`; u64 `from`, u64 `pos`; then per block
//! a kind byte (0 attention, 1 short convolution, 2 state space, 3 Gated DeltaNet) and its
//! f32s: attention `(pos - from) * kv_dim` keys then as many rows of `v_dim` values; a
//! recurrent block its live state. Every size follows from the receiver's own model config,
//! so a record is read only when its length is exactly what that config says: a record from
//! another model or layer range, or a hostile one, is refused before anything is allocated
//! or changed.

use crate::session::{KvRows, LayerCache, RecurrentState};
use crate::{Config, Session};

/// The record's first bytes.
pub const STATE_MAGIC: &[u8; 8] = b"AEONST01";

/// Bytes before the first block.
const HEADER: usize = 8 + 4 + 4 + 8 + 8;

/// Why a state record could not be made or taken.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The bytes are not a record this session can take (truncated, wrong magic, a size
    /// the model does not have, another layer range).
    #[error("state record refused: {0}")]
    Bad(String),
    /// The record's keys and values start at `from`, beyond the `held` positions this
    /// session's attention blocks hold: the sender must ship from `held`.
    #[error("the record's keys and values start at position {from}; this session holds {held}")]
    Gap { from: usize, held: usize },
    /// The model keeps a state this record does not carry (MLA's caches).
    #[error("state transfer does not cover {0}")]
    Unsupported(&'static str),
}

/// The position a record brings a session to, `None` when the bytes are not a record.
pub fn state_record_position(rec: &[u8]) -> Option<usize> {
    if rec.len() < HEADER || &rec[..8] != STATE_MAGIC {
        return None;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&rec[24..32]);
    usize::try_from(u64::from_le_bytes(b)).ok()
}

/// The kind byte of a block.
fn kind(c: &LayerCache) -> u8 {
    match &c.state {
        None => 0,
        Some(RecurrentState::Conv(_)) => 1,
        Some(RecurrentState::Ssm(_)) => 2,
        Some(RecurrentState::Delta(_)) => 3,
    }
}

/// Floats of a block's live recurrent state (0 for attention).
fn live_floats(c: &LayerCache) -> usize {
    c.state.as_ref().map_or(0, RecurrentState::live_floats)
}

fn push_f32s(out: &mut Vec<u8>, v: &[f32]) {
    out.reserve(v.len() * 4);
    for x in v {
        out.extend_from_slice(&x.to_le_bytes());
    }
}

fn kv_f32(rows: &KvRows, from: usize, to: usize) -> Vec<f32> {
    match rows {
        KvRows::F32(v) => v[from..to].to_vec(),
        KvRows::F16(v) => v[from..to].iter().map(|x| x.to_f32()).collect(),
    }
}

fn check_config(cfg: &Config) -> Result<(), StateError> {
    if cfg.mla.is_some() {
        return Err(StateError::Unsupported("MLA (deepseek2) key-value caches"));
    }
    Ok(())
}

impl Session {
    /// The record of this session's state at the position it holds, with keys and values
    /// from position `from` on (clamped to what it holds).
    pub fn export_state(&self, cfg: &Config, from: usize) -> Result<Vec<u8>, StateError> {
        check_config(cfg)?;
        let (kv, vd) = (cfg.kv_dim(), cfg.v_dim());
        let first = self.first_layer();
        let pos = self.positions(first, kv).unwrap_or(0);
        if self.caches.iter().any(|c| c.positions(kv) != pos) {
            return Err(StateError::Bad(
                "the session's blocks hold different positions".into(),
            ));
        }
        let from = from.min(pos);
        let mut out = Vec::with_capacity(HEADER);
        out.extend_from_slice(STATE_MAGIC);
        out.extend_from_slice(&(first as u32).to_le_bytes());
        out.extend_from_slice(&((first + self.caches.len()) as u32).to_le_bytes());
        out.extend_from_slice(&(from as u64).to_le_bytes());
        out.extend_from_slice(&(pos as u64).to_le_bytes());
        for c in &self.caches {
            out.push(kind(c));
            match &c.state {
                Some(s) => push_f32s(&mut out, &s.live()),
                None => {
                    push_f32s(&mut out, &kv_f32(&c.k, from * kv, pos * kv));
                    push_f32s(&mut out, &kv_f32(&c.v, from * vd, pos * vd));
                }
            }
        }
        Ok(out)
    }

    /// Bytes of a record from `from` to `pos` for this session's blocks (what a checkpoint
    /// costs on the wire).
    pub fn state_record_bytes(&self, cfg: &Config, from: usize, pos: usize) -> usize {
        let rows = pos.saturating_sub(from);
        HEADER
            + self
                .caches
                .iter()
                .map(|c| {
                    1 + 4 * match kind(c) {
                        0 => rows * (cfg.kv_dim() + cfg.v_dim()),
                        _ => live_floats(c),
                    }
                })
                .sum::<usize>()
    }

    /// Takes a record made by [`Session::export_state`] on a node holding the same blocks of
    /// the same model: afterwards this session holds the record's position, its recurrent
    /// blocks the shipped states (each kept as a checkpoint, so a rewind to it is exact) and
    /// its attention blocks their keys and values up to there. Returns that position.
    /// Nothing changes when the record is refused.
    pub fn import_state(&mut self, cfg: &Config, rec: &[u8]) -> Result<usize, StateError> {
        check_config(cfg)?;
        let bad = |why: String| StateError::Bad(why);
        if rec.len() < HEADER || &rec[..8] != STATE_MAGIC {
            return Err(bad("not a state record (no AEONST01 header)".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&rec[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let (a, b) = (u32_at(8) as usize, u32_at(12) as usize);
        let first = self.first_layer();
        if (a, b) != (first, first + self.caches.len()) {
            return Err(bad(format!(
                "the record covers layers {a}-{b}; this session holds {first}-{}",
                first + self.caches.len()
            )));
        }
        let (from, pos) = (u64_at(16), u64_at(24));
        if from > pos || pos > self.max_positions() as u64 {
            return Err(bad(format!(
                "positions {from}..{pos} (this session holds at most {})",
                self.max_positions()
            )));
        }
        let (from, pos) = (from as usize, pos as usize);
        let (kv, vd) = (cfg.kv_dim(), cfg.v_dim());
        // The exact length this session's config gives, before touching anything.
        let want = self.state_record_bytes(cfg, from, pos);
        if rec.len() != want {
            return Err(bad(format!(
                "{} bytes where this model's layers {a}-{b} at positions {from}..{pos} take {want}",
                rec.len()
            )));
        }
        let mut o = HEADER;
        for (i, c) in self.caches.iter().enumerate() {
            if rec[o] != kind(c) {
                return Err(bad(format!(
                    "layer {} is of kind {} in the record but {} here",
                    first + i,
                    rec[o],
                    kind(c)
                )));
            }
            o += 1 + 4 * match kind(c) {
                0 => (pos - from) * (kv + vd),
                _ => live_floats(c),
            };
        }
        let held = self
            .caches
            .iter()
            .filter(|c| kind(c) == 0)
            .map(|c| c.positions(kv))
            .min();
        if let Some(held) = held.filter(|&h| from > h) {
            return Err(StateError::Gap { from, held });
        }
        let f32s = |bytes: &[u8]| -> Vec<f32> {
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect()
        };
        let mut o = HEADER;
        for c in &mut self.caches {
            o += 1;
            match &mut c.state {
                Some(s) => {
                    let n = s.live_floats() * 4;
                    s.set_live(pos, &f32s(&rec[o..o + n]));
                    o += n;
                }
                None => {
                    let (nk, nv) = ((pos - from) * kv * 4, (pos - from) * vd * 4);
                    c.k.truncate(from * kv);
                    c.v.truncate(from * vd);
                    c.k.extend(&f32s(&rec[o..o + nk]));
                    c.v.extend(&f32s(&rec[o + nk..o + nk + nv]));
                    o += nk + nv;
                }
            }
        }
        Ok(pos)
    }
}
