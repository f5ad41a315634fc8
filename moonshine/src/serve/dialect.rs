//! The APIs other than OpenAI's chat (Anthropic's Messages, Ollama's, OpenAI's Responses)
//! are translations at the edge: each turns its request into the gateway's one request
//! model (an OpenAI chat body, parsed into a [`Job`] by [`api::parse`]) and the generation's
//! OpenAI chat answer (whole, or chunk by chunk when streamed) into its own shapes. A
//! [`Dialect`] is that output translation; [`OpenAi`] is the identity.

use super::*;
use serde_json::Map;

/// How an API writes the answer of one generation, given its OpenAI chat form.
pub(super) trait Dialect: Send {
    /// The stream's bytes for one `chat.completion.chunk` (or the usage chunk).
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes>;
    /// The stream's end, after the last chunk (OpenAI's `[DONE]`).
    fn done(&mut self) -> Vec<Bytes>;
    /// A failure after the stream began.
    fn stream_error(&mut self, e: &ApiError) -> Vec<Bytes>;
    /// The whole answer from the `chat.completion` object.
    fn whole(&self, answer: Value) -> Value;
    /// The prompt's token count, known before the first chunk.
    fn prompt(&mut self, _tokens: usize) {}
    /// The stream's content type.
    fn stream_type(&self) -> &'static str {
        "text/event-stream"
    }
}

/// OpenAI's own shapes: every chunk one `data:` event, `[DONE]` at the end.
pub(super) struct OpenAi;

impl Dialect for OpenAi {
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        vec![sse(chunk)]
    }
    fn done(&mut self) -> Vec<Bytes> {
        vec![Bytes::from_static(b"data: [DONE]\n\n")]
    }
    fn stream_error(&mut self, e: &ApiError) -> Vec<Bytes> {
        vec![sse(
            &json!({"error": {"message": e.message, "type": e.kind, "code": e.code}}),
        )]
    }
    fn whole(&self, answer: Value) -> Value {
        answer
    }
}

/// An error refused before a route's handler ran (the key, the method, no route) in the
/// shape of the API the path belongs to.
pub(super) fn error_for(path: &str, e: &ApiError) -> Resp {
    if path.starts_with("/v1/messages") {
        super::anthropic::error(e)
    } else if path.starts_with("/api/") {
        super::ollama::error(e)
    } else {
        e.response()
    }
}

/// A named server-sent event: `event: NAME\ndata: JSON\n\n` (Anthropic's and the
/// Responses API's form; the name repeats the data's `type`).
pub(super) fn named_event(v: &Value) -> Bytes {
    let name = v.get("type").and_then(Value::as_str).unwrap_or("message");
    Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
}

/// The parts of one OpenAI chat chunk a translation reads.
#[derive(Default, Debug)]
pub(super) struct ChunkParts {
    /// The role chunk that opens the stream.
    pub start: bool,
    /// Content text (may be empty).
    pub text: String,
    /// Finished calls: (id, name, arguments JSON text).
    pub calls: Vec<(String, String, String)>,
    pub finish: Option<String>,
    /// The usage chunk.
    pub usage: Option<Value>,
}

impl ChunkParts {
    pub fn of(chunk: &Value) -> ChunkParts {
        let mut p = ChunkParts {
            usage: chunk.get("usage").filter(|u| !u.is_null()).cloned(),
            ..Default::default()
        };
        if let Some(c) = chunk["choices"].get(0) {
            let d = &c["delta"];
            p.start = d.get("role").is_some();
            p.text = d["content"].as_str().unwrap_or_default().to_string();
            p.calls = calls_of(&d["tool_calls"]);
            p.finish = c["finish_reason"].as_str().map(String::from);
        }
        p
    }
}

/// OpenAI `tool_calls` as (id, name, arguments JSON text).
pub(super) fn calls_of(v: &Value) -> Vec<(String, String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = &c["function"];
            let args = match &f["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => "{}".to_string(),
                o => o.to_string(),
            };
            (
                c["id"].as_str().unwrap_or_default().to_string(),
                f["name"].as_str().unwrap_or_default().to_string(),
                args,
            )
        })
        .collect()
}

/// A call's arguments as a JSON object (a text that is not one becomes `{}`: the model's
/// output is not trusted to be JSON).
pub(super) fn args_object(args: &str) -> Value {
    match serde_json::from_str::<Value>(args) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// An id of `prefix` and the gateway's sequence (unique within the process).
pub(super) fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}{:x}{:x}",
        now_s(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A translated request body (an OpenAI chat body) parsed into the one request model and
/// checked against the served model.
pub(super) fn chat_job(st: &AppState, body: &Value) -> Result<Job, ApiError> {
    let job = api::parse(
        Route::Chat,
        body.to_string().as_bytes(),
        &request_limits(st),
    )?;
    check_model(st, Route::Chat, &job)?;
    Ok(job)
}

/// The request body as JSON (an object), read under the gateway's bounds.
pub(super) async fn json_body(
    st: &AppState,
    req: Request<Incoming>,
) -> Result<Map<String, Value>, ApiError> {
    let body = read_body(st, req).await?;
    match serde_json::from_slice(&body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad(None, "the body must be a JSON object")),
        Err(e) => Err(bad(None, format!("invalid JSON body: {e}"))),
    }
}

/// The prompt's token count (count_tokens routes): rendered and tokenized on the blocking pool.
pub(super) async fn count_prompt(st: &Arc<AppState>, job: Job) -> Result<usize, ApiError> {
    let st2 = st.clone();
    let n = tokio::task::spawn_blocking(move || prompt_tokens(&st2, &job).map(|p| p.0.len()))
        .await
        .map_err(|e| internal(format!("tokenize task: {e}")))?;
    n.map_err(|e| api_error(e, "messages"))
}
