//! Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`,
//! translated onto the one request model (an OpenAI chat body) and back.
//!
//! Request: `system` (a string or text blocks), `messages` whose content is a string or
//! blocks (`text`; an assistant's `tool_use`; a user's `tool_result`, which becomes a
//! `tool` turn; `thinking` history is dropped: the served models do not reason), `tools`
//! (`input_schema`), `tool_choice` (`auto`, `any`, `tool`, `none`), `stop_sequences`,
//! `temperature`, `top_p`, `top_k`, `max_tokens`, `stream`. `metadata` and `thinking` ask for
//! nothing the answer shows and are accepted. Images and documents are refused (400).
//! Answer: a `message` with `text` and `tool_use` blocks, `stop_reason` (`end_turn`,
//! `max_tokens`, `tool_use`), `usage`; streamed as `message_start`, `ping`,
//! `content_block_start`/`_delta`/`_stop`, `message_delta`, `message_stop`. Errors:
//! `{"type": "error", "error": {"type", "message"}}`.

use super::dialect::*;
use super::*;
use serde_json::Map;

/// `POST /v1/messages`.
pub(super) async fn messages(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let t0 = Instant::now();
    let answer = async {
        let body = json_body(st, req).await?;
        let job = chat_job(st, &to_chat(st, &body, false)?)?;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&st.served_name)
            .to_string();
        generate(st, job, Route::Chat, Box::new(Messages::new(model)), t0).await
    }
    .await;
    Ok(answer.unwrap_or_else(|e| error(&e)))
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}` for the prompt the request
/// would run (system, messages and tools rendered with the chat template).
pub(super) async fn count_tokens(
    st: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    let answer = async {
        let body = json_body(st, req).await?;
        let job = chat_job(st, &to_chat(st, &body, true)?)?;
        let n = count_prompt(st, job).await?;
        Ok(json_resp(StatusCode::OK, &json!({"input_tokens": n})))
    }
    .await;
    Ok(answer.unwrap_or_else(|e| error(&e)))
}

/// An error in Anthropic's shape, its `type` from the status.
pub(super) fn error(e: &ApiError) -> Resp {
    let kind = match e.status.as_u16() {
        400 | 405 | 408 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let mut r = json_resp(
        e.status,
        &json!({"type": "error", "error": {"type": kind, "message": e.message}}),
    );
    if e.status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut()
            .insert("retry-after", HeaderValue::from_static("1"));
    }
    r
}

/// A 400 naming an Anthropic field.
fn refuse(param: &'static str, message: impl Into<String>) -> ApiError {
    bad(Some(param), message)
}

/// The text of `content` (a string or text blocks); other blocks are refused.
fn text_of(content: &Value, what: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(blocks) => {
            let mut t = String::new();
            for b in blocks {
                match b["type"].as_str() {
                    Some("text") => t.push_str(b["text"].as_str().unwrap_or_default()),
                    Some(k @ ("image" | "document")) => {
                        return Err(refuse(
                            "messages",
                            format!("{what}: {k} input is not supported (image input is not supported by this text-only gateway)"),
                        ))
                    }
                    k => {
                        return Err(refuse(
                            "messages",
                            format!("{what}: content block type {k:?} is not supported here"),
                        ))
                    }
                }
            }
            Ok(t)
        }
        _ => Err(refuse(
            "messages",
            format!("{what}: content must be a string or an array of blocks"),
        )),
    }
}

/// An Anthropic request body as the OpenAI chat body it asks for. `count`: for
/// count_tokens (no `max_tokens` needed).
pub(super) fn to_chat(
    st: &AppState,
    body: &Map<String, Value>,
    count: bool,
) -> Result<Value, ApiError> {
    let mut msgs: Vec<Value> = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(s) => {
            let t = text_of(s, "system")?;
            msgs.push(json!({"role": "system", "content": t}));
        }
    }
    let list = match body.get("messages") {
        Some(Value::Array(l)) => l,
        Some(_) => return Err(refuse("messages", "messages must be an array")),
        None => return Err(refuse("messages", "messages is required")),
    };
    for (i, m) in list.iter().enumerate() {
        let what = format!("messages[{i}]");
        let role = m["role"].as_str().unwrap_or_default();
        if !["user", "assistant"].contains(&role) {
            return Err(refuse(
                "messages",
                format!(
                    "{what}.role must be \"user\" or \"assistant\", got {}",
                    m["role"]
                ),
            ));
        }
        let blocks = match &m["content"] {
            Value::String(s) => {
                msgs.push(json!({"role": role, "content": s}));
                continue;
            }
            Value::Array(b) => b,
            _ => {
                return Err(refuse(
                    "messages",
                    format!("{what}.content must be a string or an array of blocks"),
                ))
            }
        };
        let mut text = String::new();
        let mut calls = Vec::new();
        for b in blocks {
            match b["type"].as_str() {
                Some("text") => text.push_str(b["text"].as_str().unwrap_or_default()),
                // Reasoning history: the served models do not reason; it is not rendered.
                Some("thinking" | "redacted_thinking") => {}
                Some("tool_use") if role == "assistant" => {
                    let name = b["name"].as_str().filter(|n| !n.is_empty()).ok_or_else(|| {
                        refuse("messages", format!("{what}: a tool_use block needs a name"))
                    })?;
                    let input = if b["input"].is_null() { json!({}) } else { b["input"].clone() };
                    calls.push(json!({"id": b["id"], "type": "function",
                        "function": {"name": name, "arguments": input.to_string()}}));
                }
                Some("tool_result") if role == "user" => {
                    // The text before it is its own turn, in order.
                    if !text.is_empty() {
                        msgs.push(json!({"role": "user", "content": std::mem::take(&mut text)}));
                    }
                    let mut out = text_of(&b["content"], &what)?;
                    if b["is_error"] == Value::Bool(true) {
                        out = format!("Error: {out}");
                    }
                    msgs.push(json!({"role": "tool", "tool_call_id": b["tool_use_id"], "content": out}));
                }
                Some(k @ ("image" | "document")) => {
                    return Err(refuse(
                        "messages",
                        format!("{what}: {k} input is not supported (image input is not supported by this text-only gateway)"),
                    ))
                }
                k => {
                    return Err(refuse(
                        "messages",
                        format!("{what}: content block type {k:?} is not supported for role {role}"),
                    ))
                }
            }
        }
        if !calls.is_empty() {
            msgs.push(json!({"role": "assistant", "content": text, "tool_calls": calls}));
        } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
            msgs.push(json!({"role": role, "content": text}));
        }
    }
    if !msgs.iter().any(|m| m["role"] != "system") {
        // llama-server's leniency: an empty conversation is one empty user turn.
        msgs.push(json!({"role": "user", "content": ""}));
    }
    let mut chat = json!({
        "model": body.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).unwrap_or(&st.served_name),
        "messages": msgs,
    });
    match body.get("max_tokens") {
        Some(n) if !n.is_null() => chat["max_tokens"] = n.clone(),
        _ if count => {}
        // Anthropic requires it; llama-server defaults it, and so does the gateway.
        _ => {}
    }
    for k in ["temperature", "top_p", "top_k"] {
        if let Some(v) = body.get(k).filter(|v| !v.is_null()) {
            chat[k] = v.clone();
        }
    }
    if let Some(s) = body.get("stop_sequences").filter(|v| !v.is_null()) {
        chat["stop"] = s.clone();
    }
    if body.get("stream") == Some(&Value::Bool(true)) && !count {
        chat["stream"] = json!(true);
        // message_delta carries the output tokens.
        chat["stream_options"] = json!({"include_usage": true});
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let tools = tools
            .as_array()
            .ok_or_else(|| refuse("tools", "tools must be an array"))?;
        let mut list = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            let name = t["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    refuse(
                        "tools",
                        format!("tools[{i}] needs a name (server tools are not supported)"),
                    )
                })?;
            let mut f = json!({"name": name, "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))});
            if let Some(d) = t.get("description").filter(|d| d.is_string()) {
                f["description"] = d.clone();
            }
            list.push(json!({"type": "function", "function": f}));
        }
        chat["tools"] = Value::Array(list);
    }
    if let Some(c) = body.get("tool_choice").filter(|v| !v.is_null()) {
        chat["tool_choice"] = match c["type"].as_str() {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": c["name"]}}),
            _ => {
                return Err(refuse(
                    "tool_choice",
                    "tool_choice must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\": ...}",
                ))
            }
        };
    }
    Ok(chat)
}

/// Anthropic's `stop_reason` for an OpenAI `finish_reason`.
fn stop_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" => "tool_use",
        _ => "end_turn",
    }
}

/// Anthropic's `usage` from OpenAI's.
fn usage(u: &Value) -> Value {
    json!({
        "input_tokens": u["prompt_tokens"].as_u64().unwrap_or(0),
        "output_tokens": u["completion_tokens"].as_u64().unwrap_or(0),
        "cache_read_input_tokens": u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        "cache_creation_input_tokens": 0,
    })
}

/// The answer's shapes: a `message`, or its event stream.
struct Messages {
    id: String,
    model: String,
    prompt_tokens: usize,
    /// Index of the next content block; the open text block's, if any.
    next: usize,
    open_text: Option<usize>,
    stop: Option<&'static str>,
    finished: bool,
}

impl Messages {
    fn new(model: String) -> Self {
        Messages {
            id: new_id("msg_"),
            model,
            prompt_tokens: 0,
            next: 0,
            open_text: None,
            stop: None,
            finished: false,
        }
    }

    fn close_text(&mut self, out: &mut Vec<Bytes>) {
        if let Some(i) = self.open_text.take() {
            out.push(named_event(
                &json!({"type": "content_block_stop", "index": i}),
            ));
        }
    }

    /// message_delta and message_stop, once.
    fn finish(&mut self, output_tokens: u64, out: &mut Vec<Bytes>) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.close_text(out);
        out.push(named_event(&json!({"type": "message_delta",
            "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": null},
            "usage": {"output_tokens": output_tokens}})));
        out.push(named_event(&json!({"type": "message_stop"})));
    }
}

impl Dialect for Messages {
    fn prompt(&mut self, tokens: usize) {
        self.prompt_tokens = tokens;
    }

    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        let p = ChunkParts::of(chunk);
        let mut out = Vec::new();
        if p.start {
            out.push(named_event(&json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0,
                    "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}})));
            out.push(named_event(&json!({"type": "ping"})));
        }
        if !p.text.is_empty() {
            let i = match self.open_text {
                Some(i) => i,
                None => {
                    let i = self.next;
                    self.next += 1;
                    self.open_text = Some(i);
                    out.push(named_event(
                        &json!({"type": "content_block_start", "index": i,
                        "content_block": {"type": "text", "text": ""}}),
                    ));
                    i
                }
            };
            out.push(named_event(
                &json!({"type": "content_block_delta", "index": i,
                "delta": {"type": "text_delta", "text": p.text}}),
            ));
        }
        for (id, name, args) in p.calls {
            self.close_text(&mut out);
            let i = self.next;
            self.next += 1;
            out.push(named_event(&json!({"type": "content_block_start", "index": i,
                "content_block": {"type": "tool_use", "id": tool_id(&id), "name": name, "input": {}}})));
            out.push(named_event(&json!({"type": "content_block_delta", "index": i,
                "delta": {"type": "input_json_delta", "partial_json": args_object(&args).to_string()}})));
            out.push(named_event(
                &json!({"type": "content_block_stop", "index": i}),
            ));
        }
        if let Some(f) = p.finish {
            self.stop = Some(stop_reason(&f));
        }
        if let Some(u) = p.usage {
            let n = u["completion_tokens"].as_u64().unwrap_or(0);
            self.finish(n, &mut out);
        }
        out
    }

    fn done(&mut self) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.finish(0, &mut out);
        out
    }

    fn stream_error(&mut self, e: &ApiError) -> Vec<Bytes> {
        self.finished = true;
        vec![named_event(
            &json!({"type": "error", "error": {"type": "api_error", "message": e.message}}),
        )]
    }

    fn whole(&self, a: Value) -> Value {
        let choice = &a["choices"][0];
        let msg = &choice["message"];
        let mut content = Vec::new();
        if let Some(t) = msg["content"].as_str().filter(|t| !t.is_empty()) {
            content.push(json!({"type": "text", "text": t}));
        }
        for (id, name, args) in calls_of(&msg["tool_calls"]) {
            content.push(json!({"type": "tool_use", "id": tool_id(&id), "name": name, "input": args_object(&args)}));
        }
        if content.is_empty() {
            content.push(json!({"type": "text", "text": ""}));
        }
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": content,
            "stop_reason": stop_reason(choice["finish_reason"].as_str().unwrap_or("stop")),
            "stop_sequence": null, "usage": usage(&a["usage"])})
    }
}

/// A call id in Anthropic's form (`toolu_...`).
fn tool_id(openai: &str) -> String {
    format!("toolu_{}", openai.trim_start_matches("call_"))
}
