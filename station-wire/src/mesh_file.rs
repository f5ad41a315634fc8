//! The mesh file: the stations of a chain in layer order, and the replica chains beside it.
//!
//! One schema for every reader and writer: a hand-written `{"stations": [{"url", "layers"}]}`
//! (`moonshine --mesh`, paris-probe), what `moonshine mesh form` writes (every chain found, the
//! first also as `stations`, with the model's name, hash and depth), and what the replica
//! client fails over between.

use serde::{Deserialize, Serialize};

/// One hop of a chain: a station and the layers it runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshHop {
    /// The node's id when the file was formed from beacons (empty in a hand-written file).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node_id: String,
    /// `http://host:port`.
    pub url: String,
    /// `a-b`, half-open original layer indices.
    pub layers: String,
}

/// A mesh file: `stations` in order (the first serves `/embed`, the last `/lm-head`), and
/// every disjoint replica chain in `chains` when there are several.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MeshFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n_layers: Option<u32>,
    /// The first chain.
    pub stations: Vec<MeshHop>,
    /// Every disjoint chain (replicas), in order of preference.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chains: Vec<Vec<MeshHop>>,
}

impl MeshFile {
    /// The chains; a plain mesh file (only `stations`) is one chain.
    pub fn all_chains(&self) -> Vec<Vec<MeshHop>> {
        if self.chains.is_empty() {
            vec![self.stations.clone()]
        } else {
            self.chains.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hand_written_file_is_one_chain_and_writes_back_as_written() {
        let text = r#"{"stations":[{"url":"http://a:1","layers":"0-12"},{"url":"http://b:1","layers":"12-24"}]}"#;
        let f: MeshFile = serde_json::from_str(text).expect("parse");
        assert_eq!(f.all_chains().len(), 1);
        assert_eq!(f.all_chains()[0][1].layers, "12-24");
        assert_eq!(serde_json::to_string(&f).expect("write"), text);
    }

    #[test]
    fn a_formed_file_lists_its_replicas() {
        let hop = |n: &str| MeshHop {
            node_id: n.into(),
            url: format!("http://{n}:1"),
            layers: "0-24".into(),
        };
        let f = MeshFile {
            model: Some("m".into()),
            stations: vec![hop("a")],
            chains: vec![vec![hop("a")], vec![hop("b")]],
            ..MeshFile::default()
        };
        let back: MeshFile =
            serde_json::from_str(&serde_json::to_string(&f).expect("write")).expect("parse");
        assert_eq!(back.all_chains(), vec![vec![hop("a")], vec![hop("b")]]);
        assert_eq!(back.model.as_deref(), Some("m"));
    }
}
