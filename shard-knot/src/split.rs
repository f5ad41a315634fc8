//! Cutting a whole model into per-node shards.

use std::path::{Path, PathBuf};

use knot_format::{Knot, KnotWriter, LayerRange, Role, ShardRecord, TensorView};

use crate::ShardError;

/// Tensor names outside the blocks that have a fixed role.
const EMBED: &str = "token_embd.weight";
const OUTPUT_NORM: &str = "output_norm.weight";
/// LFM2's final norm (llama.cpp's converter names it so).
const OUTPUT_NORM_LFM2: &str = "token_embd_norm.weight";
/// A LayerNorm's bias beside the final norm (starcoder2).
const OUTPUT_NORM_BIAS: &str = "output_norm.bias";
const OUTPUT: &str = "output.weight";

/// One shard written by [`split`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct ShardOutput {
    /// Where it was written.
    pub path: PathBuf,
    pub role: Role,
    /// Original layer indices, half-open.
    pub layers: LayerRange,
    /// Tensors it holds.
    pub tensors: usize,
    /// Sum of its tensor lengths.
    pub tensor_bytes: u64,
    /// Its file length.
    pub file_len: u64,
    /// Its own header hash (`Knot::model_hash` of the shard).
    pub model_hash: String,
}

/// The role of `range` in a model of `n_layers` blocks: `0..L` is full, `0..a` entry, `b..L`
/// exit, anything else mid.
pub fn role_for(range: LayerRange, n_layers: u32) -> Role {
    match (range.start == 0, range.end == n_layers) {
        (true, true) => Role::Full,
        (true, false) => Role::Entry,
        (false, true) => Role::Exit,
        (false, false) => Role::Mid,
    }
}

/// Parses `0..12,12..24` (or `0-12,12-24`) and checks the ranges are non-empty, in order,
/// non-overlapping and inside `0..n_layers`. Gaps are allowed (extracting one mid shard is
/// legitimate); the caller may warn about them.
pub fn parse_ranges(spec: &str, n_layers: u32) -> Result<Vec<LayerRange>, ShardError> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            continue;
        }
        let r = LayerRange::parse(item).ok_or_else(|| ShardError::BadRange {
            item: item.to_string(),
            reason: "expected a..b or a-b with a <= b".into(),
        })?;
        if r.is_empty() {
            return Err(ShardError::BadRange {
                item: item.to_string(),
                reason: "empty range".into(),
            });
        }
        out.push(r);
    }
    check_ranges(&out, n_layers)?;
    Ok(out)
}

fn check_ranges(ranges: &[LayerRange], n_layers: u32) -> Result<(), ShardError> {
    let bad = |reason: String| ShardError::BadRanges {
        ranges: fmt_ranges(ranges),
        reason,
    };
    if ranges.is_empty() {
        return Err(bad("no ranges given".into()));
    }
    let mut prev_end = 0;
    for (i, r) in ranges.iter().enumerate() {
        if r.is_empty() {
            return Err(bad(format!("{r} is empty")));
        }
        if r.end > n_layers {
            return Err(bad(format!("{r} is outside the model's 0..{n_layers}")));
        }
        if r.start < prev_end {
            return Err(bad(format!(
                "{r} overlaps or precedes the previous range (ending at {prev_end}); give ranges in layer order"
            )));
        }
        // The first range may start late (one node's slice); later ones start where the
        // previous one ended.
        if i > 0 && r.start > prev_end {
            return Err(bad(format!(
                "layers {prev_end}..{} are in no range: the shards would not make a whole chain",
                r.start
            )));
        }
        prev_end = r.end;
    }
    // Ranges that start late or end early (one node's slice, `8..16`) are allowed: the
    // shards they make are a contiguous part of a chain, with no hole inside.
    Ok(())
}

fn fmt_ranges(ranges: &[LayerRange]) -> String {
    ranges
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `nodes` contiguous ranges tiling `0..n_layers`; sizes differ by at most one, the larger
/// ranges first (24 over 3 = 0..8, 8..16, 16..24; 30 over 4 = 8, 8, 7, 7).
pub fn even_ranges(n_layers: u32, nodes: u32) -> Result<Vec<LayerRange>, ShardError> {
    let err = |reason| ShardError::BadNodes {
        nodes,
        layers: n_layers,
        reason,
    };
    if nodes == 0 {
        return Err(err("need at least one node"));
    }
    if nodes > n_layers {
        return Err(err("more nodes than layers"));
    }
    let (base, extra) = (n_layers / nodes, n_layers % nodes);
    let mut start = 0;
    Ok((0..nodes)
        .map(|i| {
            let len = base + u32::from(i < extra);
            let r = LayerRange::new(start, start + len);
            start += len;
            r
        })
        .collect())
}

/// `<stem>.L00-12.knot`: layer numbers zero-padded to the width of the layer count (at least 2).
pub fn shard_file_name(stem: &str, range: LayerRange, n_layers: u32) -> String {
    let w = n_layers.to_string().len().max(2);
    format!("{stem}.L{:0w$}-{:0w$}.knot", range.start, range.end, w = w)
}

/// The parent's tensors a shard of `range` holds, in the parent's table order.
///
/// Blocks in `range`; the embedding for entry/full; final norm and head for exit/full (the
/// embedding when the parent has no `output.weight`, i.e. a tied head); and any other
/// non-block tensor (e.g. `rope_freqs.weight`) in every shard, since every block may read it.
pub fn select_tensors(parent: &Knot, range: LayerRange) -> Result<Vec<TensorView<'_>>, ShardError> {
    let n = parent.arch().n_layers;
    let role = role_for(range, n);
    let has_embed = matches!(role, Role::Entry | Role::Full);
    let has_head = matches!(role, Role::Exit | Role::Full);
    let tied = parent.tensor(OUTPUT).is_none();
    let incomplete = |what: String| ShardError::Incomplete {
        path: parent.path().to_path_buf(),
        role,
        layers: range,
        what,
    };
    let mut seen_layers = vec![false; range.len() as usize];
    let mut out = Vec::new();
    for t in parent.tensors() {
        let keep = match (t.layer(), t.name()) {
            (Some(l), _) => {
                let inside = l >= range.start && l < range.end;
                if inside {
                    seen_layers[(l - range.start) as usize] = true;
                }
                inside
            }
            (None, EMBED) => has_embed || (has_head && tied),
            (None, OUTPUT_NORM | OUTPUT_NORM_LFM2 | OUTPUT_NORM_BIAS | OUTPUT) => has_head,
            (None, _) => true,
        };
        if keep {
            out.push(t);
        }
    }
    if let Some(i) = seen_layers.iter().position(|s| !s) {
        return Err(incomplete(format!("block {}", range.start + i as u32)));
    }
    let held = |name: &str| out.iter().any(|t| t.name() == name);
    if has_embed && !held(EMBED) {
        return Err(incomplete(EMBED.into()));
    }
    if has_head && !held(OUTPUT_NORM) && !held(OUTPUT_NORM_LFM2) {
        return Err(incomplete(OUTPUT_NORM.into()));
    }
    if has_head && !held(OUTPUT) && !held(EMBED) {
        return Err(incomplete(format!("{OUTPUT} (or a tied {EMBED})")));
    }
    Ok(out)
}

/// Shards are cut from whole models only.
fn ensure_whole(parent: &Knot) -> Result<(), ShardError> {
    match parent.shard() {
        Some(s) => Err(ShardError::AlreadyShard {
            path: parent.path().to_path_buf(),
            role: s.role,
            layers: s.layers,
        }),
        None => Ok(()),
    }
}

/// Tensor bytes [`split`] will write for `ranges`: the progress total.
pub fn split_bytes(parent: &Knot, ranges: &[LayerRange]) -> Result<u64, ShardError> {
    ensure_whole(parent)?;
    let mut total = 0;
    for r in ranges {
        total += select_tensors(parent, *r)?
            .iter()
            .map(|t| t.bytes.len() as u64)
            .sum::<u64>();
    }
    Ok(total)
}

/// Writes one shard per range of `parent` into `out_dir` as `<stem>.Laa-bb.knot`.
///
/// Each file is written atomically (temp file + rename) with the parent's architecture and
/// tokenizer and a [`ShardRecord`] naming `parent.model_hash()`. `progress` gets the
/// cumulative tensor bytes written across all shards (total: [`split_bytes`]).
pub fn split(
    parent: &Knot,
    ranges: &[LayerRange],
    out_dir: &Path,
    stem: &str,
    progress: &mut dyn FnMut(u64),
) -> Result<Vec<ShardOutput>, ShardError> {
    ensure_whole(parent)?;
    let n = parent.arch().n_layers;
    check_ranges(ranges, n)?;
    // Check every range before writing anything.
    let selections = ranges
        .iter()
        .map(|r| select_tensors(parent, *r))
        .collect::<Result<Vec<_>, _>>()?;
    std::fs::create_dir_all(out_dir).map_err(|source| ShardError::CreateDir {
        path: out_dir.to_path_buf(),
        source,
    })?;
    let read_err = |source| ShardError::Read {
        path: parent.path().to_path_buf(),
        source: Box::new(source),
    };
    let tokenizer = parent.tokenizer().map_err(read_err)?;
    let mut done_before = 0u64;
    let mut outputs = Vec::with_capacity(ranges.len());
    for (range, tensors) in ranges.iter().zip(selections) {
        let role = role_for(*range, n);
        let path = out_dir.join(shard_file_name(stem, *range, n));
        let write_err = |source| ShardError::Write {
            path: path.clone(),
            source: Box::new(source),
        };
        let mut w = KnotWriter::new(parent.header().model_id.clone(), parent.arch().clone());
        if let Some(t) = &tokenizer {
            w.tokenizer(t.clone());
        }
        w.shard(ShardRecord {
            role,
            layers: *range,
            parent_hash: parent.model_hash().to_string(),
            parent_layers: n,
        });
        for t in &tensors {
            w.add_tensor(t.name(), t.entry.dtype, t.entry.shape.clone(), t.bytes)
                .map_err(write_err)?;
        }
        let bytes = w.tensor_bytes();
        tracing::info!(path = %path.display(), ?role, layers = %range, tensors = tensors.len(), bytes, "writing shard");
        w.write(&path, &mut |d| progress(done_before + d))
            .map_err(write_err)?;
        done_before += bytes;
        let written = Knot::open(&path).map_err(|source| ShardError::Read {
            path: path.clone(),
            source: Box::new(source),
        })?;
        outputs.push(ShardOutput {
            role,
            layers: *range,
            tensors: tensors.len(),
            tensor_bytes: bytes,
            file_len: written.file_len(),
            model_hash: written.model_hash().to_string(),
            path,
        });
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_follow_the_range() {
        assert_eq!(role_for(LayerRange::new(0, 24), 24), Role::Full);
        assert_eq!(role_for(LayerRange::new(0, 8), 24), Role::Entry);
        assert_eq!(role_for(LayerRange::new(8, 16), 24), Role::Mid);
        assert_eq!(role_for(LayerRange::new(16, 24), 24), Role::Exit);
    }

    #[test]
    fn ranges_parse_and_reject_overlap_order_gaps_and_overflow() {
        let r = parse_ranges("0..12, 12-24", 24).unwrap();
        assert_eq!(r, vec![LayerRange::new(0, 12), LayerRange::new(12, 24)]);
        assert!(
            parse_ranges("8..16", 24).is_ok(),
            "a single mid range is allowed"
        );
        for bad in [
            "0..12,10..24",
            "12..24,0..12",
            "0..25",
            "5..5",
            "x..3",
            "",
            "3..1",
            "0..8,12..24",
        ] {
            assert!(parse_ranges(bad, 24).is_err(), "{bad:?} must be refused");
        }
        assert_eq!(
            parse_ranges("0..8,12..24", 24).unwrap_err().to_string(),
            "ranges 0..8,12..24: layers 8..12 are in no range: the shards would not make a whole chain"
        );
    }

    #[test]
    fn even_split_tiles_the_model() {
        let r = even_ranges(24, 3).unwrap();
        assert_eq!(
            r,
            vec![
                LayerRange::new(0, 8),
                LayerRange::new(8, 16),
                LayerRange::new(16, 24)
            ]
        );
        let r = even_ranges(30, 4).unwrap();
        assert_eq!(r.iter().map(|r| r.len()).collect::<Vec<_>>(), [8, 8, 7, 7]);
        assert_eq!(r.last().unwrap().end, 30);
        assert!(even_ranges(24, 0).is_err());
        assert!(even_ranges(4, 5).is_err());
    }

    #[test]
    fn file_names_are_padded() {
        assert_eq!(
            shard_file_name("m", LayerRange::new(0, 8), 24),
            "m.L00-08.knot"
        );
        assert_eq!(
            shard_file_name("m", LayerRange::new(96, 120), 120),
            "m.L096-120.knot"
        );
    }
}
