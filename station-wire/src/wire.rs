//! The station wire: routes, header names, JSON bodies and the residual codec.
//!
//! The only place that knows how bytes travel between stations and clients; the server and
//! every client (moonshine, paris-probe, parity tools) import it. Contract:
//! `specs/station-wire.md`.

use serde::{Deserialize, Serialize};

/// Layer range to run, half-open, original indices: `a-b`.
pub const H_LAYER_RANGE: &str = "x-layer-range";
/// Session id selecting a KV cache (1..=64 chars of `[A-Za-z0-9_.:-]`).
pub const H_SESSION: &str = "x-session";
/// Position the client believes the first row is at; a rewind truncates, a gap is refused.
pub const H_POS: &str = "x-pos";
/// Milliseconds of engine compute this response took.
pub const H_COMPUTE_MS: &str = "x-compute-ms";
/// Rows in a residual body.
pub const H_SEQ: &str = "x-seq";
/// Residual width.
pub const H_HIDDEN: &str = "x-hidden";
/// Position of the first row a forward ran at.
pub const H_START_POS: &str = "x-start-pos";
/// Element encoding of a residual body: `f32` (default) or `f16`.
pub const H_DTYPE: &str = "x-dtype";
/// `/lm-head`: logits of the last N rows (`[N, vocab]`), default 1; what a client verifying
/// N - 1 drafted tokens in one step asks for. At most [`MAX_LOGIT_ROWS`] and the rows sent.
pub const H_LOGIT_ROWS: &str = "x-logit-rows";
/// Most rows one `X-Logit-Rows` may ask for (a Qwen2.5 row is 600 KB of f32 logits).
pub const MAX_LOGIT_ROWS: usize = 64;

pub const ROUTE_EMBED: &str = "/embed";
pub const ROUTE_FORWARD: &str = "/forward";
pub const ROUTE_LM_HEAD: &str = "/lm-head";
pub const ROUTE_TOKENIZE: &str = "/tokenize";
pub const ROUTE_DETOKENIZE: &str = "/detokenize";
pub const ROUTE_HEALTH: &str = "/health";
pub const ROUTE_TOKENIZER: &str = "/tokenizer";
/// `GET /vocab`: every token's bytes, in id order ([`encode_vocab`]).
pub const ROUTE_VOCAB: &str = "/vocab";
/// `GET /metrics`: Prometheus text (`station::metrics`).
pub const ROUTE_METRICS: &str = "/metrics";

// ---- Mesh (`specs/mesh.md`): one request per token, stations forward to their successor. ----

/// `POST /chain`: the entry takes `{"tokens": [...]}`, every other node a residual; each runs
/// its layers and forwards to the next hop; the exit answers with logits or the argmax token.
pub const ROUTE_CHAIN: &str = "/chain";
/// Id of one token step through the chain (1..=64 chars of `[A-Za-z0-9_.:-]`), bound by seals.
pub const H_REQUEST_ID: &str = "x-request-id";
/// What the exit returns: `logits` (default; f32 body) or `token` (JSON [`ChainToken`]).
pub const H_RETURN: &str = "x-return";
/// Remaining hops after this station, comma-separated base URLs (else the manifest successor).
pub const H_ROUTE: &str = "x-route";
/// `v1` when the body is sealed (nonce || ChaCha20-Poly1305 ciphertext || tag).
pub const H_SEAL: &str = "x-seal";
/// Unix milliseconds the seal was made (bound by the seal; replay window).
pub const H_SEAL_TS: &str = "x-seal-ts";
/// Layer boundary a forwarded residual is at (the sender's range end).
pub const H_FROM_LAYER: &str = "x-from-layer";
/// Byte length of the [`ExitAsk`] JSON after a forwarded `/chain` residual (inside the seal).
pub const H_EXIT_ASK: &str = "x-exit-ask";
/// Hex of a monster-guard grant file (entry stations started with `--require-grant`).
pub const H_GRANT: &str = "x-grant";
/// Per-node timing of a chain step: `node=a-b:ms,...` in chain order.
pub const H_CHAIN_TRACE: &str = "x-chain-trace";
/// On a 5xx from `/chain`: the base URL of the hop that failed.
pub const H_FAILED_HOP: &str = "x-failed-hop";
/// Node -> replica: a session's state at one position (checkpoint shipping, issue 35), body
/// [`encode_checkpoint`], sealed in a sealed mesh; `X-Session`, `X-Pos` (the state's
/// position) and `X-Request-Id` travel as headers.
pub const ROUTE_CHECKPOINT: &str = "/checkpoint";
/// Longest model hash a checkpoint envelope carries.
pub const MAX_HASH_LEN: usize = 128;

/// A checkpoint body: a u8 length and the sender's model hash (the whole model's, a shard's
/// parent), then the engine's state record (`aeon_engine::Session::export_state`). The
/// receiver refuses any other model's state before reading the record.
pub fn encode_checkpoint(model_hash: &str, record: &[u8]) -> Vec<u8> {
    let h = &model_hash.as_bytes()[..model_hash.len().min(MAX_HASH_LEN)];
    let mut out = Vec::with_capacity(1 + h.len() + record.len());
    out.push(h.len() as u8);
    out.extend_from_slice(h);
    out.extend_from_slice(record);
    out
}

/// Splits a checkpoint body into the model hash and the state record.
pub fn decode_checkpoint(b: &[u8]) -> Result<(&str, &[u8]), String> {
    let (&n, rest) = b.split_first().ok_or("empty checkpoint body")?;
    let n = n as usize;
    if n > MAX_HASH_LEN || rest.len() < n {
        return Err(format!("checkpoint body: bad model hash length {n}"));
    }
    let (h, rec) = rest.split_at(n);
    let h = std::str::from_utf8(h).map_err(|_| "checkpoint body: model hash is not UTF-8")?;
    Ok((h, rec))
}

/// `POST /chain` body at the entry.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChainRequest {
    pub tokens: Vec<u32>,
    /// What the exit answers (rows, sampling, log-probabilities); absent: the last row's
    /// logits, or its argmax with `X-Return: token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitAsk>,
}

/// What the chain's exit answers, as the entry got it; travels to every hop after the
/// residual (inside the seal) as a JSON trailer whose length is `X-Exit-Ask`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExitAsk {
    /// Logit rows (the last `rows` tokens of the request), `X-Return: logits`; 0 or absent
    /// is 1. With `X-Return: token` the rows are `drafts.len() + 1`.
    #[serde(default)]
    pub rows: usize,
    /// `X-Return: token`: how to pick (absent: greedy argmax, no penalties).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<SampleSpec>,
    /// `X-Return: token`: tokens drafted for the request's last `drafts.len()` positions (a
    /// lookup trip); the exit keeps each its sampler accepts and stops at the first it does
    /// not ([`ChainToken::picks`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drafts: Vec<u32>,
    /// `X-Return: token`: answer each pick's log-probability with this many alternatives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<usize>,
    /// `X-Return: token`: pick nothing; answer each row's this many best tokens after the
    /// bias and penalties ([`ChainToken::rows`]), for a gateway that masks them with a
    /// grammar and picks greedily itself. At most [`MAX_CANDIDATES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<usize>,
    /// `X-Return: logits`: answer the final hidden state (after the output norm) of every
    /// row of the step instead of logits, `(tokens, hidden)` f32 row-major (what the
    /// gateway pools into an embedding); `rows` is then ignored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hidden: bool,
}

/// Most candidates an [`ExitAsk`] may ask per row.
pub const MAX_CANDIDATES: usize = 1024;

/// The sampler's parameters and its state between two picks (`aeon_engine::sampling`), so
/// the exit picks exactly the ids the gateway would: same seed, same ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleSpec {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub repeat_last_n: usize,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    #[serde(default)]
    pub logit_bias: Vec<(u32, f32)>,
    /// The PCG32 state before this pick.
    pub rng: u64,
    /// The last `repeat_last_n` tokens (prompt and generated).
    #[serde(default)]
    pub recent: Vec<u32>,
    /// `(id, times generated)` so far, for the presence and frequency penalties.
    #[serde(default)]
    pub counts: Vec<(u32, u32)>,
}

/// `POST /chain` response with `X-Return: token`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChainToken {
    /// The last pick (without an [`ExitAsk`]: the argmax of the last row's logits).
    pub token: u32,
    /// Its raw logit.
    pub logit: f32,
    /// Every pick in order when the request carried an [`ExitAsk`]: accepted drafts, then the
    /// correction or the token after the last draft.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub picks: Vec<ChainPick>,
    /// The PCG32 state after the last pick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<u64>,
    /// With [`ExitAsk::candidates`]: each row's best `(id, logit)` after the bias and the
    /// penalties, best first (row `i + 1` as if `drafts[i]` was picked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<Vec<(u32, f32)>>,
}

/// One token the exit picked, with its log-probability when asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChainPick {
    pub id: u32,
    /// Log-probability after bias and penalties, when asked (absent when asked: minus
    /// infinity, a banned token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
    /// The most likely alternatives, best first, `(id, logprob or null)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<(u32, Option<f32>)>,
}

/// A log-probability for JSON: minus infinity (and NaN) as `None`.
pub fn finite(v: f32) -> Option<f32> {
    v.is_finite().then_some(v)
}

/// The trailer of a forwarded `/chain` residual: `body` is `residual || ask JSON` and `len`
/// is `X-Exit-Ask`. Returns the residual bytes and the ask, or why not.
pub fn split_exit_ask(body: &[u8], len: usize) -> Result<(&[u8], ExitAsk), String> {
    let cut = body
        .len()
        .checked_sub(len)
        .ok_or_else(|| format!("X-Exit-Ask {len} is longer than the body ({})", body.len()))?;
    let ask = serde_json::from_slice(&body[cut..]).map_err(|e| format!("exit ask: {e}"))?;
    Ok((&body[..cut], ask))
}

/// `POST /embed` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EmbedRequest {
    pub tokens: Vec<u32>,
}

/// `POST /tokenize` body: `text`, or `parts` whose texts are encoded as one text.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TokenizeRequest {
    #[serde(default)]
    pub text: String,
    /// Prepend BOS (when the model has one); default: the model's own `add_bos`.
    #[serde(default)]
    pub add_bos: Option<bool>,
    /// Whether special-token text in `text` (`<|im_start|>`) becomes its id; default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parse_special: Option<bool>,
    /// Instead of `text`: pieces encoded as their concatenation, with special tokens matched
    /// only inside pieces whose `parse_special` is true (a chat template's markup) and never
    /// inside the others (message content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<TextPart>>,
}

/// One piece of a `POST /tokenize` `parts` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TextPart {
    pub text: String,
    /// Match special-token text in this piece; default false (plain text).
    #[serde(default)]
    pub parse_special: bool,
}

impl TokenizeRequest {
    /// The text as `(piece, parse_special)` pieces, or why the body is contradictory.
    pub fn pieces(&self) -> Result<Vec<(&str, bool)>, &'static str> {
        match &self.parts {
            None => Ok(vec![(
                self.text.as_str(),
                self.parse_special.unwrap_or(true),
            )]),
            Some(_) if !self.text.is_empty() || self.parse_special.is_some() => {
                Err("give either text (with parse_special) or parts, not both")
            }
            Some(parts) => Ok(parts
                .iter()
                .map(|p| (p.text.as_str(), p.parse_special))
                .collect()),
        }
    }
}

/// `POST /tokenize` response, and `POST /detokenize` body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tokens {
    pub tokens: Vec<u32>,
}

/// `POST /detokenize` response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Text {
    pub text: String,
}

/// `GET /tokenizer` response: what a client needs to drive generation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TokenizerInfo {
    pub vocab: u32,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    /// Every id that ends generation (EOS and end-of-turn control tokens).
    pub eog_ids: Vec<u32>,
    /// Whether the model expects BOS prepended.
    pub add_bos: bool,
    /// The model's Jinja chat template, when it has one.
    pub chat_template: Option<String>,
}

/// `GET /health` response.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    pub model_id: String,
    /// The whole model's hash (`Knot::model_hash`; for a shard file its `parent_hash`), so
    /// the stations of one chain report the same hash whether they map the whole file or a shard.
    pub model_hash: String,
    /// The shard file's own hash when the station maps a shard (`None` for a whole model).
    #[serde(default)]
    pub shard_hash: Option<String>,
    pub arch: String,
    /// `entry`, `mid`, `exit` or `full`.
    pub role: String,
    /// Layers served, `a-b`.
    pub layers: String,
    pub n_layers: u32,
    pub hidden: u32,
    pub vocab: u32,
    pub serves_embed: bool,
    pub serves_lm_head: bool,
    pub has_tokenizer: bool,
    pub sessions: usize,
    /// KV-cache bytes the live sessions hold (as of their last request).
    #[serde(default)]
    pub session_bytes: usize,
    pub uptime_s: f64,
    /// `open` (no mesh key: residuals travel in clear, anyone may call) or `sealed`.
    #[serde(default)]
    pub mesh: Option<String>,
    /// The node id when started from a manifest.
    #[serde(default)]
    pub node_id: Option<String>,
    /// Most positions one session holds (`--max-positions`): the context a client checks a
    /// prompt against before sending it (absent from stations before issue 32).
    #[serde(default)]
    pub max_positions: Option<usize>,
    /// KV-cache bytes one session adds per position over the held blocks (attention blocks'
    /// keys and values as stored; MLA's latent rows with `--mla-latent-cache`; recurrent
    /// blocks' constant state not included). Absent from older stations.
    #[serde(default)]
    pub kv_bytes_per_position: Option<usize>,
}

/// Every 4xx/5xx body.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable machine code: `bad_request`, `not_held`, `unknown_session`, `too_large`, ...
    pub error: String,
    pub message: String,
    /// `session_mismatch` after a rewind a hybrid's recurrent state could not make: the
    /// positions the session holds now (its latest checkpoint); the caller re-sends from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
}

/// A station's 4xx/5xx answer as a caller reports it: the one shape the station client
/// ([`crate::client::ClientError::Refused`]) and the chain client
/// ([`crate::replicas::MeshError::Refused`]) share.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{url}: {status} {code}: {message}")]
pub struct Refusal {
    pub url: String,
    pub status: u16,
    /// [`ErrorBody::error`], or `http` when the body is not an [`ErrorBody`].
    pub code: String,
    pub message: String,
    /// [`ErrorBody::held`].
    pub held: Option<usize>,
}

impl Refusal {
    /// The refusal `url` answered with `status` and body `text`.
    pub fn from_body(url: String, status: u16, text: String) -> Refusal {
        let (code, message, held) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(e) => (e.error, e.message, e.held),
            Err(_) => ("http".into(), text, None),
        };
        Refusal {
            url,
            status,
            code,
            message,
            held: held.and_then(|h| usize::try_from(h).ok()),
        }
    }
}

/// Encodes f32 rows as little-endian bytes.
pub fn encode_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Decodes little-endian f32 bytes; `None` when the length is not a multiple of 4.
pub fn decode_f32(b: &[u8]) -> Option<Vec<f32>> {
    b.len().is_multiple_of(4).then(|| {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    })
}

/// Most bytes one token of a `/vocab` body may hold.
pub const MAX_TOKEN_BYTES: usize = 1024;

/// `GET /vocab` body: per token, in id order, one flags byte (bit 0: special, a control or
/// user-defined token), its length as a little-endian u16, then its bytes (what the token
/// decodes to: `" Paris"`, `"<|im_end|>"`, or a piece of a UTF-8 character).
pub fn encode_vocab<'a>(tokens: impl Iterator<Item = (bool, &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    for (special, b) in tokens {
        let b = &b[..b.len().min(MAX_TOKEN_BYTES)];
        out.push(u8::from(special));
        out.extend_from_slice(&(b.len() as u16).to_le_bytes());
        out.extend_from_slice(b);
    }
    out
}

/// One token of a decoded `/vocab` body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VocabToken {
    pub special: bool,
    pub bytes: Vec<u8>,
}

/// Decodes a `/vocab` body ([`encode_vocab`]), or says where it is malformed.
pub fn decode_vocab(mut b: &[u8]) -> Result<Vec<VocabToken>, String> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let [flags, l0, l1, rest @ ..] = b else {
            return Err(format!("token {}: truncated header", out.len()));
        };
        let len = u16::from_le_bytes([*l0, *l1]) as usize;
        if *flags > 1 || len > MAX_TOKEN_BYTES || len > rest.len() {
            return Err(format!(
                "token {}: flags {flags}, length {len} with {} bytes left",
                out.len(),
                rest.len()
            ));
        }
        out.push(VocabToken {
            special: *flags == 1,
            bytes: rest[..len].to_vec(),
        });
        b = &rest[len..];
    }
    Ok(out)
}

/// Encodes as little-endian IEEE half floats (halves the bytes on the wire; lossy).
pub fn encode_f16(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect()
}

/// Decodes little-endian half floats; `None` when the length is odd.
pub fn decode_f16(b: &[u8]) -> Option<Vec<f32>> {
    b.len().is_multiple_of(2).then(|| {
        b.chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect()
    })
}

// ---- Header values: the one place their text is read (the station and every client). ----

/// Longest number a header may carry: 9 digits (under 10^9, well inside `u32`).
const MAX_HEADER_DIGITS: usize = 9;

/// A plain decimal number as headers carry it: ASCII digits only (no sign, space or `_`),
/// no leading zero but `0` itself, at most [`MAX_HEADER_DIGITS`] digits; `None` otherwise.
/// Strict so that one value has one spelling: a relay, a log and the seal all read the
/// same number.
pub fn parse_header_number(v: &str) -> Option<u32> {
    plain_decimal(v, MAX_HEADER_DIGITS)
        .then(|| v.parse().ok())
        .flatten()
}

/// 1 to `max_digits` ASCII digits, no leading zero but `0` itself: the one spelling of a
/// number in a header.
fn plain_decimal(v: &str, max_digits: usize) -> bool {
    (1..=max_digits).contains(&v.len())
        && v.bytes().all(|b| b.is_ascii_digit())
        && (v == "0" || !v.starts_with('0'))
}

/// Parses an `X-Layer-Range`: exactly `a-b`, two [`parse_header_number`] numbers with
/// `a <= b` (an empty range is the caller's to refuse); else why not.
pub fn parse_layer_range(v: &str) -> Result<knot_format::LayerRange, String> {
    let bad = || format!("X-Layer-Range {v:?} is not a-b (two plain decimal numbers, a <= b)");
    let (a, b) = v.split_once('-').ok_or_else(bad)?;
    let (a, b) = (
        parse_header_number(a).ok_or_else(bad)?,
        parse_header_number(b).ok_or_else(bad)?,
    );
    if a > b {
        return Err(bad());
    }
    Ok(knot_format::LayerRange::new(a, b))
}

/// Parses an `X-Seal-Ts` (Unix milliseconds): 1 to 16 ASCII digits, no leading zero.
pub fn parse_timestamp_ms(v: &str) -> Option<u64> {
    plain_decimal(v, 16).then(|| v.parse().ok()).flatten()
}

/// Parses an `X-Dtype`: `f32` (also the default without the header) or `f16`; true for f16.
pub fn parse_dtype(v: &str) -> Result<bool, String> {
    match v {
        "f32" => Ok(false),
        "f16" => Ok(true),
        _ => Err(format!("X-Dtype {v:?}: expected f32 or f16")),
    }
}

/// Parses a header that carries a position or a layer index (`X-Pos`, `X-From-Layer`):
/// [`parse_header_number`], or why not naming `name`.
pub fn parse_index(name: &str, v: &str) -> Result<usize, String> {
    parse_header_number(v)
        .map(|n| n as usize)
        .ok_or_else(|| format!("{name} {v:?} is not a plain decimal number"))
}

/// Parses an `X-Logit-Rows` value against a residual of `seq` rows: `1..=min(seq,
/// MAX_LOGIT_ROWS)`, or why not.
pub fn parse_logit_rows(v: &str, seq: usize) -> Result<usize, String> {
    let n = parse_index("X-Logit-Rows", v)?;
    let most = seq.min(MAX_LOGIT_ROWS);
    if n == 0 || n > most {
        return Err(format!(
            "X-Logit-Rows {n}: must be 1..={most} for a residual of {seq} rows (at most {MAX_LOGIT_ROWS})"
        ));
    }
    Ok(n)
}

/// Checks a session id: 1..=64 chars of `[A-Za-z0-9_.:-]`.
pub fn valid_session_id(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_ask_travels_after_the_residual_and_is_cut_off_by_its_length() {
        let ask = ExitAsk {
            drafts: vec![5, 6],
            logprobs: Some(3),
            ..Default::default()
        };
        let mut body = encode_f32(&[1.0, -2.5]);
        let trailer = serde_json::to_vec(&ask).expect("json");
        body.extend_from_slice(&trailer);
        let (rows, got) = split_exit_ask(&body, trailer.len()).expect("split");
        assert_eq!(decode_f32(rows), Some(vec![1.0, -2.5]));
        assert_eq!(got, ask);
        let e = split_exit_ask(&body, body.len() + 1).unwrap_err();
        assert!(e.contains("longer than the body"), "{e}");
        assert!(split_exit_ask(&body, trailer.len() - 1).is_err());
        // A request without an ask is what it was before the ask existed.
        let plain = serde_json::to_string(&ChainRequest {
            tokens: vec![1],
            exit: None,
        })
        .expect("json");
        assert_eq!(plain, r#"{"tokens":[1]}"#);
    }

    #[test]
    fn header_numbers_and_ranges_have_one_spelling() {
        use knot_format::LayerRange;
        assert_eq!(parse_layer_range("0-1"), Ok(LayerRange::new(0, 1)));
        assert_eq!(parse_layer_range("12-30"), Ok(LayerRange::new(12, 30)));
        assert_eq!(parse_layer_range("3-3"), Ok(LayerRange::new(3, 3)));
        for bad in [
            "0 - 1",
            " 0-1",
            "0-1 ",
            "00-1",
            "0000000001-2",
            "01-2",
            "+0-1",
            "0..1",
            "1-0",
            "0-1-2",
            "-1",
            "0-",
            "",
            "0-1234567890",
            "\u{661}-2",
        ] {
            assert!(parse_layer_range(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_index("X-Pos", "0"), Ok(0));
        assert_eq!(parse_index("X-Pos", "4095"), Ok(4095));
        for bad in [" 5", "5 ", "+5", "05", "1e3", "", "5_0", "9999999999"] {
            assert!(parse_index("X-Pos", bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(parse_dtype("f16"), Ok(true));
        assert_eq!(parse_dtype("f32"), Ok(false));
        assert!(parse_dtype("F16").is_err() && parse_dtype("f16 ").is_err());
        assert!(parse_logit_rows(" 2", 4).is_err() && parse_logit_rows("2", 4) == Ok(2));
    }

    #[test]
    fn f32_codec_round_trips_and_rejects_ragged() {
        let x = [1.5f32, -0.0, f32::MAX, 1e-30];
        assert_eq!(decode_f32(&encode_f32(&x)).unwrap(), x);
        assert!(decode_f32(&[0u8; 5]).is_none());
    }

    #[test]
    fn vocab_codec_round_trips_and_rejects_truncation() {
        let toks: [(bool, &[u8]); 3] =
            [(false, b" Paris"), (true, b"<|im_end|>"), (false, b"\xe4")];
        let b = encode_vocab(toks.iter().copied());
        let back = decode_vocab(&b).unwrap();
        assert_eq!(back.len(), 3);
        assert_eq!(
            (back[1].special, back[2].bytes.as_slice()),
            (true, &b"\xe4"[..])
        );
        assert!(decode_vocab(&b[..b.len() - 1]).is_err());
        assert!(decode_vocab(&[7, 0, 0]).is_err());
    }

    #[test]
    fn f16_codec_is_close() {
        let x = [1.5f32, -2.25, 1000.0];
        assert_eq!(decode_f16(&encode_f16(&x)).unwrap(), x);
    }

    #[test]
    fn tokenize_bodies_old_and_new() {
        let r: TokenizeRequest = serde_json::from_str(r#"{"text": "a<|x|>"}"#).unwrap();
        assert_eq!(r.pieces(), Ok(vec![("a<|x|>", true)]));
        let r: TokenizeRequest =
            serde_json::from_str(r#"{"text": "a", "parse_special": false}"#).unwrap();
        assert_eq!(r.pieces(), Ok(vec![("a", false)]));
        let r: TokenizeRequest = serde_json::from_str(
            r#"{"parts": [{"text": "<|x|>", "parse_special": true}, {"text": "b"}]}"#,
        )
        .unwrap();
        assert_eq!(r.pieces(), Ok(vec![("<|x|>", true), ("b", false)]));
        let r: TokenizeRequest =
            serde_json::from_str(r#"{"text": "a", "parts": [{"text": "b"}]}"#).unwrap();
        assert!(r.pieces().is_err());
    }

    #[test]
    fn logit_rows_are_bounded_by_the_rows_sent_and_the_cap() {
        assert_eq!(parse_logit_rows("3", 8), Ok(3));
        // One spelling (issue 32 item 12): hyper has already trimmed what HTTP allows.
        assert!(parse_logit_rows(" 8 ", 8).is_err());
        assert_eq!(parse_logit_rows("8", 8), Ok(8));
        assert!(parse_logit_rows("9", 8).is_err());
        assert!(parse_logit_rows("0", 8).is_err());
        assert!(parse_logit_rows("-1", 8).is_err());
        assert!(parse_logit_rows("x", 8).is_err());
        assert!(parse_logit_rows("65", 1000).is_err());
        assert_eq!(parse_logit_rows("64", 1000), Ok(64));
    }

    #[test]
    fn session_ids() {
        assert!(valid_session_id("chat-1:a"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("a b"));
        assert!(!valid_session_id(&"x".repeat(65)));
    }
}
