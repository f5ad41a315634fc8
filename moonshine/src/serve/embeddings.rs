//! `POST /v1/embeddings`: each input through the whole chain in one stateless `/chain` trip
//! whose exit answers every row's final hidden state (after the output norm,
//! [`station_wire::wire::ExitAsk::hidden`]) instead of logits; the gateway pools the rows
//! (`--pooling`: mean by default, as llama-server `--embeddings --pooling mean` on a
//! generative model; `last`, `cls`) and L2-normalises the vector.
//!
//! Inputs (OpenAI's and llama-server's forms): a string; an array of token ids (one input);
//! an array whose entries are strings, token-id arrays (ids and strings may mix in one),
//! `{"prompt_string": ...}` or `{"content": [{"type": "text", "text"}...]}`.
//! `encoding_format`: `float` (default) or `base64` (little-endian f32). At most
//! [`MAX_INPUTS`] inputs, each within the chain's context; `dimensions` is refused.

use super::*;
use base64::Engine as _;
use station_wire::client::{Answer as ChainAnswer, Ask, StepTrace};

/// Most inputs in one request.
pub const MAX_INPUTS: usize = 256;

/// How the rows of one input become one vector.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The rows' mean.
    #[default]
    Mean,
    /// The last row.
    Last,
    /// The first row.
    Cls,
}

/// One input's pieces: ids as given, or text tokenized with the model's special tokens.
#[derive(Debug, PartialEq)]
enum Piece {
    Ids(Vec<u32>),
    Text(String),
}

/// A 400 naming `input`.
fn bad_input(m: impl Into<String>) -> ApiError {
    bad(Some("input"), m)
}

/// A token id in the vocabulary.
fn token_id(v: &Value, vocab: Option<u32>) -> Result<u32, ApiError> {
    let id = v
        .as_u64()
        .and_then(|i| u32::try_from(i).ok())
        .ok_or_else(|| bad_input(format!("{v} is not a token id")))?;
    if vocab.is_some_and(|n| id >= n) {
        return Err(bad_input(format!(
            "token id {id} is outside the vocabulary"
        )));
    }
    Ok(id)
}

/// One input from a string, an id/string array or an object.
fn one_input(v: &Value, vocab: Option<u32>) -> Result<Vec<Piece>, ApiError> {
    match v {
        Value::String(s) => Ok(vec![Piece::Text(s.clone())]),
        Value::Array(a) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(Piece::Text(s.clone())),
                n => token_id(n, vocab).map(|id| Piece::Ids(vec![id])),
            })
            .collect(),
        Value::Object(o) => {
            if let Some(s) = o.get("prompt_string").and_then(Value::as_str) {
                return Ok(vec![Piece::Text(s.to_string())]);
            }
            let parts = o.get("content").and_then(Value::as_array).ok_or_else(|| {
                bad_input("an input object has prompt_string or content: [{\"type\": \"text\", \"text\"}]")
            })?;
            let mut t = String::new();
            for p in parts {
                match (p["type"].as_str(), p["text"].as_str()) {
                    (Some("text"), Some(s)) => t.push_str(s),
                    (k, _) => {
                        return Err(bad_input(format!(
                            "content part type {} is not supported (text only: this model has no image, audio or video input)",
                            k.unwrap_or("(none)")
                        )))
                    }
                }
            }
            Ok(vec![Piece::Text(t)])
        }
        _ => Err(bad_input(
            "input must be a string, token ids, or an array of those",
        )),
    }
}

/// The request's inputs.
fn inputs(input: &Value, vocab: Option<u32>) -> Result<Vec<Vec<Piece>>, ApiError> {
    let list = match input {
        // Ids alone (or mixed with strings, llama-server's form) are one input.
        Value::Array(a) if a.iter().any(Value::is_number) => vec![one_input(input, vocab)?],
        Value::Array(a) if a.is_empty() => return Err(bad_input("input must not be empty")),
        Value::Array(a) => a
            .iter()
            .map(|x| one_input(x, vocab))
            .collect::<Result<_, _>>()?,
        v => vec![one_input(v, vocab)?],
    };
    if list.len() > MAX_INPUTS {
        return Err(bad_input(format!(
            "at most {MAX_INPUTS} inputs per request, got {}",
            list.len()
        )));
    }
    Ok(list)
}

/// `rows` (n, hidden) pooled and L2-normalised; empty when there is not one whole row.
pub fn pool(rows: &[f32], hidden: usize, how: Pooling) -> Vec<f32> {
    if hidden == 0 || rows.len() < hidden {
        return Vec::new();
    }
    let n = rows.len() / hidden;
    let mut v = match how {
        Pooling::Cls => rows[..hidden].to_vec(),
        Pooling::Last => rows[(n - 1) * hidden..].to_vec(),
        Pooling::Mean => {
            let mut s = vec![0.0f64; hidden];
            for r in rows.chunks_exact(hidden) {
                for (a, &x) in s.iter_mut().zip(r) {
                    *a += f64::from(x);
                }
            }
            s.iter().map(|&a| (a / n as f64) as f32).collect()
        }
    };
    let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    if norm > 0.0 {
        for x in &mut v {
            *x = (f64::from(*x) / norm) as f32;
        }
    }
    v
}

/// `POST /v1/embeddings`.
pub(super) async fn embeddings(
    st: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    let body = super::dialect::json_body(st, req).await?;
    for (k, v) in &body {
        match k.as_str() {
            "dimensions" if !v.is_null() => {
                return Err(bad(
                    Some("dimensions"),
                    "dimensions is not supported: the vectors have the model's hidden size",
                ))
            }
            "encoding_format" if !(v.is_null() || v == "float" || v == "base64") => {
                return Err(bad(
                    Some("encoding_format"),
                    "encoding_format must be \"float\" or \"base64\"",
                ))
            }
            _ => {}
        }
    }
    let base64 = body.get("encoding_format") == Some(&json!("base64"));
    let input = body
        .get("input")
        .or(body.get("content"))
        .filter(|v| !v.is_null())
        .ok_or_else(|| bad_input("input is required"))?;
    let list = inputs(input, st.backend.info.as_ref().map(|i| i.vocab))?;
    let (vectors, tokens) = embed(st, list).await?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(json_resp(
        StatusCode::OK,
        &json!({"object": "list", "data": data, "model": body.get("model").and_then(Value::as_str).unwrap_or(&st.served_name),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    ))
}

/// The inputs' vectors and their token count: one slot of the gateway's (as a generation),
/// one stateless chain trip per input on the blocking pool.
async fn embed(
    st: &Arc<AppState>,
    list: Vec<Vec<Piece>>,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let permit = admit(st).await?;
    let st2 = st.clone();
    tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let mut out = Vec::with_capacity(list.len());
        let mut tokens = 0;
        for (i, pieces) in list.iter().enumerate() {
            let ids = ids_of(&st2, pieces).map_err(|e| api_error(e, "input"))?;
            if ids.is_empty() {
                return Err(bad_input(format!("input {i} has no tokens")));
            }
            if let Some(c) = st2.backend.context.filter(|&c| ids.len() > c) {
                return Err(ApiError {
                    code: Some("context_length_exceeded"),
                    ..bad_input(format!(
                        "input {i} is too large to process: {} tokens, the context holds {c}",
                        ids.len()
                    ))
                });
            }
            tokens += ids.len();
            let mut trace = StepTrace::default();
            let rows = match st2.backend.chain.trip(&ids, None, &Ask::Hidden, &mut trace) {
                Ok(ChainAnswer::Logits(r)) => r,
                Ok(ChainAnswer::Picks(_)) => {
                    return Err(internal(
                        "the exit answered picks, not hidden states".into(),
                    ))
                }
                Err(e) => return Err(api_error(GenError::Station(e), "input")),
            };
            let hidden = rows.len() / ids.len();
            if hidden == 0 || rows.len() != hidden * ids.len() {
                return Err(internal(format!(
                    "the exit answered {} values for {} tokens",
                    rows.len(),
                    ids.len()
                )));
            }
            out.push(pool(&rows, hidden, st2.args.pooling));
        }
        Ok((out, tokens))
    })
    .await
    .map_err(|e| internal(format!("embedding task: {e}")))?
}

/// An input's token ids: texts with the model's special tokens (BOS when it adds one) on the
/// first piece only, ids as given.
fn ids_of(st: &AppState, pieces: &[Piece]) -> Result<Vec<u32>, GenError> {
    let mut ids = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        match p {
            Piece::Ids(v) => ids.extend_from_slice(v),
            Piece::Text(t) if t.is_empty() => {}
            Piece::Text(t) => ids.extend(st.backend.tokenize(t, (i > 0).then_some(false))?),
        }
    }
    Ok(ids)
}

/// Ollama's `POST /api/embed`: `{"model", "input": string or strings}` ->
/// `{"model", "embeddings": [[...]], "prompt_eval_count"}`; errors `{"error": ...}`.
pub(super) async fn ollama_embed(
    st: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    let answer = async {
        let body = super::dialect::json_body(st, req).await?;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| bad(Some("model"), "model is required"))?
            .to_string();
        if body.get("dimensions").is_some_and(|v| !v.is_null()) {
            return Err(bad(
                Some("dimensions"),
                "dimensions is not supported: the vectors have the model's hidden size",
            ));
        }
        let list = match body.get("input") {
            Some(Value::String(s)) => vec![vec![Piece::Text(s.clone())]],
            Some(Value::Array(a)) if !a.is_empty() && a.len() <= MAX_INPUTS => a
                .iter()
                .map(|x| match x {
                    Value::String(s) => Ok(vec![Piece::Text(s.clone())]),
                    _ => Err(bad_input("input must be a string or an array of strings")),
                })
                .collect::<Result<_, _>>()?,
            _ => {
                return Err(bad_input(format!(
                    "input must be a string or an array of 1 to {MAX_INPUTS} strings"
                )))
            }
        };
        let (vectors, tokens) = embed(st, list).await?;
        Ok(json_resp(
            StatusCode::OK,
            &json!({"model": model, "embeddings": vectors, "prompt_eval_count": tokens}),
        ))
    }
    .await;
    Ok(answer.unwrap_or_else(|e| super::ollama::error(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_is_the_mean_last_or_first_row_normalised() {
        let rows = [3.0, 0.0, 0.0, 4.0, 1.0, 1.0];
        assert_eq!(pool(&rows, 2, Pooling::Cls), vec![1.0, 0.0]);
        let l = pool(&rows, 2, Pooling::Last);
        assert!((l[0] - l[1]).abs() < 1e-7 && (l[0] - 0.5f32.sqrt()).abs() < 1e-6);
        // Mean (4/3, 5/3) normalised: (4, 5) / sqrt(41).
        let m = pool(&rows, 2, Pooling::Mean);
        assert!((m[0] - 4.0 / 41f32.sqrt()).abs() < 1e-6, "{m:?}");
        assert!((m[1] - 5.0 / 41f32.sqrt()).abs() < 1e-6, "{m:?}");
        assert_eq!(pool(&[0.0, 0.0], 2, Pooling::Mean), vec![0.0, 0.0]);
    }

    #[test]
    fn inputs_take_openai_and_llama_server_forms() {
        let v = Some(100);
        let t = |s: &str| Piece::Text(s.into());
        assert_eq!(inputs(&json!("a"), v).unwrap(), vec![vec![t("a")]]);
        assert_eq!(
            inputs(&json!([1, 2]), v).unwrap(),
            vec![vec![Piece::Ids(vec![1]), Piece::Ids(vec![2])]]
        );
        assert_eq!(inputs(&json!(["a", [3], {"prompt_string": "b"}, {"content": [{"type": "text", "text": "c"}, {"type": "text", "text": "d"}]}]), v)
            .unwrap(), vec![vec![t("a")], vec![Piece::Ids(vec![3])], vec![t("b")], vec![t("cd")]]);
        for bad in [
            json!([]),
            json!([100]),
            json!([-1]),
            json!({"content": "x"}),
            json!({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
            json!(3),
            json!(vec!["a"; MAX_INPUTS + 1]),
        ] {
            let e = inputs(&bad, v).expect_err("refused");
            assert_eq!(
                (e.status, e.param),
                (StatusCode::BAD_REQUEST, Some("input")),
                "{bad}"
            );
        }
    }
}
