//! The residue record: the one type both the collector and its clients use.
//!
//! On the wire (and in the log) a record is JSON:
//!
//! ```json
//! {"key": "qwen2.5-coder-0.5b:dense:785,6722", "model": "qwen2.5-coder-0.5b",
//!  "tokens": [785, 6722], "argmax": 12095, "logit": 17.25,
//!  "top_k": [{"id": 12095, "logit": 17.25}, {"id": 576, "logit": 14.5}],
//!  "residual_b64": "AACAPwAAAMA=", "created": 1764403200}
//! ```
//!
//! `residual_b64` is optional: the final residual vector as little-endian `f32`
//! bytes in padded standard base64. `created` is set by the collector (Unix
//! seconds at admission); whatever a client sends there is overwritten.

use serde::{Deserialize, Serialize};

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;

/// Longest key the collector accepts, in bytes.
pub const MAX_KEY_BYTES: usize = 4096;
/// Longest model id the collector accepts, in bytes.
pub const MAX_MODEL_BYTES: usize = 256;
/// Most token ids one record may carry.
pub const MAX_TOKENS: usize = 32_768;
/// Most top-k entries one record may carry.
pub const MAX_TOP_K: usize = 1024;

/// One entry of the top-k list: a token id and its logit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TopK {
    /// Token id.
    pub id: u32,
    /// Its logit (pre-softmax score).
    pub logit: f32,
}

/// The residue of one forward pass: what the probe saw for a token sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResidueRecord {
    /// Cache key, usually [`ResidueRecord::dense_key`]; opaque to the collector.
    pub key: String,
    /// Model id (e.g. the model file stem).
    pub model: String,
    /// Input token ids.
    pub tokens: Vec<u32>,
    /// Argmax token id of the last position's logits.
    pub argmax: u32,
    /// Logit of the argmax token.
    pub logit: f32,
    /// Highest logits, best first.
    #[serde(default)]
    pub top_k: Vec<TopK>,
    /// Optional final residual: little-endian `f32` bytes, padded standard base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual_b64: Option<String>,
    /// Unix seconds at admission; set by the collector, ignored on input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<u64>,
}

/// What an admission did with the record (the `disposition` field of the admit response).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Disposition {
    /// A new key: the record was stored.
    Stored,
    /// The key held identical content (ignoring `created`): nothing was written.
    Unchanged,
    /// The key held different content: the new record replaced it.
    Replaced,
}

/// Body of a 200 answer to `POST /.aeon/model-forward-cache`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmitResponse {
    /// Always true on 200.
    pub ok: bool,
    /// The record's key.
    pub key: String,
    /// What happened to it.
    pub disposition: Disposition,
    /// `created` of the stored record (Unix seconds).
    pub created: u64,
}

/// Body of `GET /.aeon/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthResponse {
    /// "ok" while serving.
    pub status: String,
    /// Live records.
    pub records: usize,
    /// Bytes of the live records' log frames.
    pub bytes: u64,
    /// Size of the log file, including dead frames not yet compacted away.
    pub log_bytes: u64,
    /// Records evicted since start.
    pub evicted: u64,
    /// Compactions since start.
    pub compactions: u64,
    /// Seconds since the server started.
    pub uptime_s: u64,
}

/// Body of an error answer: `{"error": "bad_request", "detail": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    /// Short machine-readable code: `bad_request`, `payload_too_large`, `not_found`,
    /// `method_not_allowed`, `internal`.
    pub error: String,
    /// Human-readable explanation.
    #[serde(default)]
    pub detail: String,
}

/// Why a record was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A required text field is empty.
    #[error("field `{0}` must not be empty")]
    Empty(&'static str),
    /// A field is longer than its cap.
    #[error("field `{field}` has {len} {unit}, more than the limit of {max}")]
    TooLong {
        /// Field name.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The cap.
        max: usize,
        /// "bytes" or "entries".
        unit: &'static str,
    },
    /// The key contains a control character (C0, DEL or C1).
    #[error("field `key` contains a control character at byte {0}")]
    ControlChar(usize),
    /// A logit is NaN or infinite.
    #[error("field `{0}` is not a finite number")]
    NotFinite(&'static str),
    /// `residual_b64` is not valid base64.
    #[error("field `residual_b64`: {0}")]
    Residual(#[from] base64::DecodeError),
    /// `residual_b64` does not decode to whole `f32`s.
    #[error("field `residual_b64` decodes to {0} bytes, not a multiple of 4 (f32 little-endian)")]
    ResidualLength(usize),
}

impl ResidueRecord {
    /// The conventional key of a dense (full-model) forward over `tokens`:
    /// `"MODEL:dense:785,6722,..."`.
    pub fn dense_key(model_id: &str, tokens: &[u32]) -> String {
        let mut key = String::with_capacity(model_id.len() + 7 + tokens.len() * 6);
        key.push_str(model_id);
        key.push_str(":dense:");
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                key.push(',');
            }
            key.push_str(&t.to_string());
        }
        key
    }

    /// A record keyed by [`ResidueRecord::dense_key`], with no top-k and no residual.
    pub fn dense(model_id: &str, tokens: &[u32], argmax: u32, logit: f32) -> Self {
        ResidueRecord {
            key: Self::dense_key(model_id, tokens),
            model: model_id.to_string(),
            tokens: tokens.to_vec(),
            argmax,
            logit,
            top_k: Vec::new(),
            residual_b64: None,
            created: None,
        }
    }

    /// Sets `residual_b64` from a residual vector (little-endian `f32`).
    pub fn set_residual(&mut self, residual: &[f32]) {
        let bytes: Vec<u8> = residual.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.residual_b64 = Some(BASE64.encode(&bytes));
    }

    /// Decodes `residual_b64`, if present.
    pub fn residual(&self) -> Result<Option<Vec<f32>>, RecordError> {
        let Some(text) = &self.residual_b64 else {
            return Ok(None);
        };
        let bytes = BASE64.decode(text)?;
        if bytes.len() % 4 != 0 {
            return Err(RecordError::ResidualLength(bytes.len()));
        }
        Ok(Some(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        ))
    }

    /// Checks the caps and formats the collector enforces on admission.
    pub fn validate(&self) -> Result<(), RecordError> {
        fn cap(
            field: &'static str,
            len: usize,
            max: usize,
            unit: &'static str,
        ) -> Result<(), RecordError> {
            if len > max {
                Err(RecordError::TooLong {
                    field,
                    len,
                    max,
                    unit,
                })
            } else {
                Ok(())
            }
        }
        if self.key.is_empty() {
            return Err(RecordError::Empty("key"));
        }
        if self.model.is_empty() {
            return Err(RecordError::Empty("model"));
        }
        cap("key", self.key.len(), MAX_KEY_BYTES, "bytes")?;
        cap("model", self.model.len(), MAX_MODEL_BYTES, "bytes")?;
        cap("tokens", self.tokens.len(), MAX_TOKENS, "entries")?;
        cap("top_k", self.top_k.len(), MAX_TOP_K, "entries")?;
        // C0 (U+0000..U+001F), DEL and C1 (U+0080..U+009F): `char::is_control`.
        if let Some((pos, _)) = self.key.char_indices().find(|(_, c)| c.is_control()) {
            return Err(RecordError::ControlChar(pos));
        }
        if !self.logit.is_finite() {
            return Err(RecordError::NotFinite("logit"));
        }
        if self.top_k.iter().any(|t| !t.logit.is_finite()) {
            return Err(RecordError::NotFinite("top_k.logit"));
        }
        self.residual()?;
        Ok(())
    }

    /// True when `self` and `other` carry the same data, ignoring `created`.
    pub fn same_content(&self, other: &ResidueRecord) -> bool {
        self.key == other.key
            && self.model == other.model
            && self.tokens == other.tokens
            && self.argmax == other.argmax
            && self.logit.to_bits() == other.logit.to_bits()
            && self.top_k.len() == other.top_k.len()
            && self
                .top_k
                .iter()
                .zip(&other.top_k)
                .all(|(a, b)| a.id == b.id && a.logit.to_bits() == b.logit.to_bits())
            && self.residual_b64 == other.residual_b64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_key_format() {
        assert_eq!(
            ResidueRecord::dense_key("qwen", &[785, 6722, 315]),
            "qwen:dense:785,6722,315"
        );
        assert_eq!(ResidueRecord::dense_key("m", &[]), "m:dense:");
    }

    #[test]
    fn residual_roundtrip_is_bit_exact() {
        let mut r = ResidueRecord::dense("m", &[1, 2], 3, 4.5);
        let v = [1.0f32, -2.5, f32::MIN_POSITIVE, 3.0e38, -0.0];
        r.set_residual(&v);
        let back = r.residual().unwrap().unwrap();
        assert_eq!(back.len(), v.len());
        for (a, b) in back.iter().zip(&v) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
        // 1.0f32 little-endian is 00 00 80 3f.
        r.set_residual(&[1.0]);
        assert_eq!(r.residual_b64.as_deref(), Some("AACAPw=="));
    }

    #[test]
    fn json_roundtrip_and_optional_fields() {
        let json = r#"{"key":"k","model":"m","tokens":[1],"argmax":2,"logit":0.1}"#;
        let r: ResidueRecord = serde_json::from_str(json).unwrap();
        assert!(r.top_k.is_empty() && r.residual_b64.is_none() && r.created.is_none());
        let again: ResidueRecord =
            serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(again, r);
        assert_eq!(again.logit.to_bits(), 0.1f32.to_bits());
    }

    /// Issue 17 item 13: keys with C1 control characters (U+0080..U+009F, two bytes in
    /// UTF-8) were accepted although the spec forbids control characters. Other non-ASCII
    /// text stays allowed.
    #[test]
    fn c1_control_characters_in_keys_are_refused() {
        for (key, at) in [("m:\u{85}x", 2), ("\u{80}", 0), ("é\u{9f}", 2)] {
            let mut r = ResidueRecord::dense("m", &[1], 2, 3.0);
            r.key = key.into();
            assert_eq!(r.validate(), Err(RecordError::ControlChar(at)), "{key:?}");
        }
        let mut r = ResidueRecord::dense("m", &[1], 2, 3.0);
        r.key = "modèle:dense:1,\u{a0}2 ✓".into();
        assert_eq!(r.validate(), Ok(()));
    }

    #[test]
    fn validate_rejects_bad_records() {
        let good = ResidueRecord::dense("m", &[1], 2, 3.0);
        assert_eq!(good.validate(), Ok(()));
        let mut r = good.clone();
        r.key.clear();
        assert_eq!(r.validate(), Err(RecordError::Empty("key")));
        let mut r = good.clone();
        r.key = "a\nb".into();
        assert_eq!(r.validate(), Err(RecordError::ControlChar(1)));
        let mut r = good.clone();
        r.key = "a\u{7f}".into();
        assert_eq!(r.validate(), Err(RecordError::ControlChar(1)));
        let mut r = good.clone();
        r.residual_b64 = Some("AAA=".into()); // 2 bytes: not whole f32s
        assert_eq!(r.validate(), Err(RecordError::ResidualLength(2)));
        let mut r = good.clone();
        r.residual_b64 = Some("not base64!".into());
        assert!(matches!(r.validate(), Err(RecordError::Residual(_))));
        let mut r = good;
        r.top_k = vec![TopK { id: 0, logit: 0.0 }; MAX_TOP_K + 1];
        assert!(matches!(
            r.validate(),
            Err(RecordError::TooLong { field: "top_k", .. })
        ));
    }

    #[test]
    fn same_content_ignores_created() {
        let a = ResidueRecord::dense("m", &[1], 2, 3.0);
        let mut b = a.clone();
        b.created = Some(99);
        assert!(a.same_content(&b));
        b.argmax = 7;
        assert!(!a.same_content(&b));
    }
}
