//! What a shard (or a whole model) holds, and how many bytes of each kind.

use std::path::PathBuf;

use knot_format::{Knot, LayerRange, Role};
use serde::Serialize;

/// Tensor bytes by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    /// `token_embd.weight` when it serves `/embed` (entry, full).
    pub embedding: u64,
    /// `blk.N.*` tensors.
    pub layers: u64,
    /// `output_norm.weight` + `output.weight`, or the tied embedding on an exit shard.
    pub head: u64,
    /// Anything else (e.g. `rope_freqs.weight`).
    pub other: u64,
    /// Sum of the above.
    pub total: u64,
}

/// A shard's identity and contents, as `shard-knot inspect` prints it.
#[derive(Clone, Debug, Serialize)]
pub struct ShardSummary {
    pub path: PathBuf,
    pub model_id: String,
    /// This file's own header hash.
    pub model_hash: String,
    pub file_len: u64,
    /// `None` for a whole (unsharded) model.
    pub role: Option<Role>,
    /// Blocks held, original indices (the whole model's `0..L` when unsharded).
    pub layers: LayerRange,
    /// Parent model hash (`None` when unsharded).
    pub parent_hash: Option<String>,
    /// Parent layer count (the model's own when unsharded).
    pub parent_layers: u32,
    /// Whether the head is the token embedding (tied).
    pub tied_head: bool,
    pub tensor_count: usize,
    pub bytes: Breakdown,
    /// Tokenizer section length (0 when absent).
    pub tokenizer_bytes: u64,
    /// Bytes per held block, `(layer, bytes)`.
    pub per_layer: Vec<(u32, u64)>,
    /// Blocks inside `layers` with no tensors at all (a broken shard; normally empty).
    pub missing_layers: Vec<u32>,
    /// Names of the tensors outside the blocks (embedding, final norm, head, ...).
    pub non_block: Vec<String>,
}

/// Summarizes `knot` (reads only the header).
pub fn summarize(knot: &Knot) -> ShardSummary {
    let h = knot.header();
    let n = h.arch.n_layers;
    let (role, layers, parent_hash, parent_layers) = match &h.shard {
        Some(s) => (
            Some(s.role),
            s.layers,
            Some(s.parent_hash.clone()),
            s.parent_layers,
        ),
        None => (None, LayerRange::new(0, n), None, n),
    };
    let tied_head = knot.tensor("output.weight").is_none();
    let embed_is_head_only = role == Some(Role::Exit);
    let mut b = Breakdown::default();
    let mut per_layer: Vec<(u32, u64)> = (layers.start..layers.end).map(|l| (l, 0)).collect();
    for t in &h.tensors {
        let len = t.len;
        match (knot_format::layer_of(&t.name), t.name.as_str()) {
            (Some(l), _) => {
                b.layers += len;
                if let Some(slot) = l
                    .checked_sub(layers.start)
                    .and_then(|i| per_layer.get_mut(i as usize))
                {
                    slot.1 += len;
                }
            }
            (None, "token_embd.weight") if embed_is_head_only => b.head += len,
            (None, "token_embd.weight") => b.embedding += len,
            (None, "output_norm.weight" | "token_embd_norm.weight" | "output.weight") => {
                b.head += len
            }
            (None, _) => b.other += len,
        }
    }
    b.total = b.embedding + b.layers + b.head + b.other;
    let missing_layers = per_layer
        .iter()
        .filter(|(_, bytes)| *bytes == 0)
        .map(|(l, _)| *l)
        .collect();
    ShardSummary {
        path: knot.path().to_path_buf(),
        model_id: h.model_id.clone(),
        model_hash: knot.model_hash().to_string(),
        file_len: knot.file_len(),
        role,
        layers,
        parent_hash,
        parent_layers,
        tied_head,
        tensor_count: h.tensors.len(),
        bytes: b,
        tokenizer_bytes: h.tokenizer.as_ref().map_or(0, |s| s.len),
        per_layer,
        missing_layers,
        non_block: h
            .tensors
            .iter()
            .filter(|t| knot_format::layer_of(&t.name).is_none())
            .map(|t| t.name.clone())
            .collect(),
    }
}
