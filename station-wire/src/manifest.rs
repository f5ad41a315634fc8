//! Node manifests: what one mesh node serves, where it listens and whom it forwards to.
//!
//! Written by `shard-knot plan -o DIR` (one `NODE.json` per node), read by
//! `fat-station --manifest NODE.json`: this is the one home of that schema. Contract:
//! `specs/mesh.md`.

use std::path::{Path, PathBuf};

use knot_format::{Holdings, LayerRange, Role};
use serde::{Deserialize, Serialize};

/// Why a manifest could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading manifest {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("manifest {path}: {why}")]
    Invalid { path: PathBuf, why: String },
}

/// The next node of a chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Successor {
    pub node_id: String,
    /// `http://host:port`.
    pub url: String,
    /// `a-b` the successor runs.
    pub layers: String,
}

/// One node's manifest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeManifest {
    /// Unique in the mesh (`n0`, `r1-n2`, `phone1`).
    pub node_id: String,
    pub model_id: String,
    /// Header hash of the WHOLE model (`Knot::model_hash`; a shard's `parent_hash`).
    pub model_hash: String,
    pub role: Role,
    /// `a-b`, half-open, original indices.
    pub layers: String,
    /// Where this node forwards its output residual; `null` on the exit.
    #[serde(default)]
    pub successor: Option<Successor>,
    /// `host:port` to listen on.
    pub listen: String,
    /// Shard (or whole-model) file, relative to the manifest's directory unless absolute.
    pub shard: String,
    /// Replica chain index.
    #[serde(default)]
    pub chain: u32,
}

impl NodeManifest {
    /// Reads and checks a manifest; `shard` is resolved against the manifest's directory.
    pub fn load(path: &Path) -> Result<(NodeManifest, PathBuf), ManifestError> {
        let text = std::fs::read_to_string(path).map_err(|source| ManifestError::Read {
            path: path.into(),
            source,
        })?;
        let m: NodeManifest = serde_json::from_str(&text).map_err(|e| ManifestError::Invalid {
            path: path.into(),
            why: e.to_string(),
        })?;
        let bad = |why: String| ManifestError::Invalid {
            path: path.into(),
            why,
        };
        let r = m
            .range()
            .ok_or_else(|| bad(format!("layers {:?} is not a non-empty a-b", m.layers)))?;
        if m.node_id.is_empty() || !crate::wire::valid_session_id(&m.node_id) {
            return Err(bad(format!(
                "node_id {:?} must be 1-64 chars of [A-Za-z0-9_.:-]",
                m.node_id
            )));
        }
        if (m.role == Role::Entry || m.role == Role::Full) && r.start != 0 {
            return Err(bad(format!(
                "an {:?} node must start at layer 0, not {}",
                m.role, r.start
            )));
        }
        if m.role != Role::Exit && m.role != Role::Full && m.successor.is_none() {
            return Err(bad(format!("a {:?} node needs a successor", m.role)));
        }
        let shard = PathBuf::from(&m.shard);
        let shard = if shard.is_absolute() {
            shard
        } else {
            path.parent().unwrap_or(Path::new(".")).join(shard)
        };
        Ok((m, shard))
    }

    /// The layer range.
    pub fn range(&self) -> Option<LayerRange> {
        LayerRange::parse(&self.layers).filter(|r| !r.is_empty())
    }

    /// What the station must hold.
    pub fn holdings(&self) -> Option<Holdings> {
        Some(Holdings::of_role(self.role, self.range()?))
    }

    /// Checks the served file belongs to this manifest's model: its own hash (a whole model)
    /// or its shard record's parent hash.
    pub fn check_file(&self, knot: &knot_format::Knot) -> Result<(), String> {
        let file_hash = knot
            .shard()
            .map(|s| s.parent_hash.as_str())
            .unwrap_or(knot.model_hash());
        if file_hash != self.model_hash {
            return Err(format!(
                "{} belongs to model {} but the manifest names {}",
                knot.path().display(),
                &file_hash[..file_hash.len().min(16)],
                &self.model_hash[..self.model_hash.len().min(16)]
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_load_and_refuse_inconsistency() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("n1.json");
        let good = r#"{"node_id":"n1","model_id":"m","model_hash":"h","role":"mid","layers":"8-16",
            "successor":{"node_id":"n2","url":"http://127.0.0.1:7702","layers":"16-24"},
            "listen":"127.0.0.1:7701","shard":"m.L08-16.knot","chain":0}"#;
        std::fs::write(&p, good).unwrap();
        let (m, shard) = NodeManifest::load(&p).unwrap();
        assert_eq!(shard, d.path().join("m.L08-16.knot"));
        assert_eq!(
            m.holdings().unwrap(),
            Holdings {
                embed: false,
                layers: LayerRange::new(8, 16),
                head: false
            }
        );
        std::fs::write(
            &p,
            good.replace(
                r#""successor":{"node_id":"n2","url":"http://127.0.0.1:7702","layers":"16-24"}"#,
                r#""successor":null"#,
            ),
        )
        .unwrap();
        assert!(NodeManifest::load(&p)
            .unwrap_err()
            .to_string()
            .contains("needs a successor"));
        std::fs::write(&p, good.replace("8-16", "16-8")).unwrap();
        assert!(NodeManifest::load(&p)
            .unwrap_err()
            .to_string()
            .contains("not a non-empty"));
        std::fs::write(&p, good.replace(r#""role":"mid""#, r#""role":"entry""#)).unwrap();
        assert!(NodeManifest::load(&p)
            .unwrap_err()
            .to_string()
            .contains("must start at layer 0"));
    }
}
