//! OpenAI's Responses API: `POST /v1/responses`, translated onto the one request model (an
//! OpenAI chat body) and back.
//!
//! Request: `input` as a string or items (messages with text parts, `function_call` and
//! `function_call_output` items; `reasoning` items are dropped), `instructions` (the system
//! turn), `max_output_tokens`, `temperature`, `top_p`, function `tools` and `tool_choice`,
//! `text.format` (`text`, `json_object`, `json_schema`), `stream`. Nothing is stored:
//! `previous_response_id` and `background` are refused; `store`, `metadata`, `user`,
//! `truncation`, `parallel_tool_calls` ask for nothing the answer shows. Answer: a
//! `response` whose `output` holds a `message` item (`output_text`) and `function_call`
//! items; streamed as `response.created`, `response.in_progress`,
//! `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`/`.done`, `response.content_part.done`,
//! `response.function_call_arguments.delta`/`.done`, `response.output_item.done`, then
//! `response.completed` (or `response.incomplete` at `max_output_tokens`). Errors: OpenAI's.

use super::dialect::*;
use super::*;
use serde_json::Map;

/// `POST /v1/responses`.
pub(super) async fn responses(
    st: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    let t0 = Instant::now();
    let body = json_body(st, req).await?;
    let job = chat_job(st, &to_chat(st, &body)?)?;
    let echo = |k: &str| body.get(k).cloned().unwrap_or(Value::Null);
    let d = Responses {
        id: new_id("resp_"),
        msg_id: new_id("msg_"),
        created: now_s(),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(&st.served_name)
            .to_string(),
        request: json!({
            "instructions": echo("instructions"),
            "max_output_tokens": echo("max_output_tokens"),
            "temperature": body.get("temperature").cloned().unwrap_or(json!(1.0)),
            "top_p": body.get("top_p").cloned().unwrap_or(json!(1.0)),
            "tools": body.get("tools").cloned().unwrap_or(json!([])),
            "tool_choice": body.get("tool_choice").cloned().unwrap_or(json!("auto")),
            "text": body.get("text").cloned().unwrap_or(json!({"format": {"type": "text"}})),
            "metadata": body.get("metadata").cloned().unwrap_or(json!({})),
        }),
        seq: 0,
        text: None,
        calls: Vec::new(),
        finish: None,
    };
    generate(st, job, Route::Chat, Box::new(d), t0).await
}

/// The text of a message item's content (a string or text parts).
fn text_of(content: &Value, what: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut t = String::new();
            for p in parts {
                match p["type"].as_str() {
                    Some("input_text" | "output_text" | "text") => {
                        t.push_str(p["text"].as_str().unwrap_or_default())
                    }
                    Some("refusal") => t.push_str(p["refusal"].as_str().unwrap_or_default()),
                    k => {
                        return Err(bad(
                            Some("input"),
                            format!("{what}: content part type {k:?} is not supported (text only)"),
                        ))
                    }
                }
            }
            Ok(t)
        }
        _ => Err(bad(
            Some("input"),
            format!("{what}: content must be a string or an array of parts"),
        )),
    }
}

/// A Responses request as the OpenAI chat body it asks for.
fn to_chat(st: &AppState, body: &Map<String, Value>) -> Result<Value, ApiError> {
    for (k, why) in [
        (
            "previous_response_id",
            "responses are not stored here: send the whole conversation as input",
        ),
        (
            "conversation",
            "conversations are not stored here: send the whole conversation as input",
        ),
        ("background", "background responses are not supported"),
        ("reasoning", "the served model does not reason"),
        ("prompt", "stored prompts are not supported"),
    ] {
        if body
            .get(k)
            .is_some_and(|v| !v.is_null() && *v != Value::Bool(false))
        {
            return Err(bad(Some(k), format!("{k}: {why}")));
        }
    }
    let mut msgs = Vec::new();
    if let Some(i) = body.get("instructions").filter(|v| !v.is_null()) {
        let t = i
            .as_str()
            .ok_or_else(|| bad(Some("instructions"), "instructions must be a string"))?;
        msgs.push(json!({"role": "system", "content": t}));
    }
    match body.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, it) in items.iter().enumerate() {
                let what = format!("input[{i}]");
                match it["type"].as_str() {
                    None | Some("message") => {
                        let role = match it["role"].as_str() {
                            Some(r @ ("user" | "assistant" | "system")) => r,
                            Some("developer") => "system",
                            _ => {
                                return Err(bad(
                                    Some("input"),
                                    format!(
                                        "{what}.role must be user, assistant, system or developer"
                                    ),
                                ))
                            }
                        };
                        msgs.push(
                            json!({"role": role, "content": text_of(&it["content"], &what)?}),
                        );
                    }
                    Some("function_call") => {
                        let call = json!({"id": it["call_id"], "type": "function",
                            "function": {"name": it["name"], "arguments": it["arguments"].as_str().unwrap_or("{}")}});
                        if it["name"].as_str().is_none_or(str::is_empty) {
                            return Err(bad(
                                Some("input"),
                                format!("{what}: a function_call needs a name"),
                            ));
                        }
                        // Consecutive calls are one assistant turn.
                        match msgs.last_mut() {
                            Some(m) if m["role"] == "assistant" && m["tool_calls"].is_array() => {
                                if let Some(a) = m["tool_calls"].as_array_mut() {
                                    a.push(call)
                                }
                            }
                            _ => msgs.push(
                                json!({"role": "assistant", "content": "", "tool_calls": [call]}),
                            ),
                        }
                    }
                    Some("function_call_output") => {
                        let out = match &it["output"] {
                            Value::String(s) => s.clone(),
                            o => text_of(o, &what)?,
                        };
                        msgs.push(
                            json!({"role": "tool", "tool_call_id": it["call_id"], "content": out}),
                        );
                    }
                    Some("reasoning") => {}
                    Some(k) => {
                        return Err(bad(
                            Some("input"),
                            format!("{what}: item type {k:?} is not supported"),
                        ))
                    }
                }
            }
        }
        None | Some(Value::Null) => return Err(bad(Some("input"), "input is required")),
        Some(_) => {
            return Err(bad(
                Some("input"),
                "input must be a string or an array of items",
            ))
        }
    }
    if !msgs.iter().any(|m| m["role"] != "system") {
        return Err(bad(Some("input"), "input holds no message"));
    }
    let mut chat = json!({
        "model": body.get("model").and_then(Value::as_str).filter(|m| !m.is_empty()).unwrap_or(&st.served_name),
        "messages": msgs,
    });
    if let Some(n) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat["max_tokens"] = n.clone();
    }
    for k in ["temperature", "top_p", "seed"] {
        if let Some(v) = body.get(k).filter(|v| !v.is_null()) {
            chat[k] = v.clone();
        }
    }
    if body.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(bad(
            Some("top_logprobs"),
            "top_logprobs is not supported on /v1/responses",
        ));
    }
    if body.get("stream") == Some(&Value::Bool(true)) {
        chat["stream"] = json!(true);
        chat["stream_options"] = json!({"include_usage": true});
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let tools = tools
            .as_array()
            .ok_or_else(|| bad(Some("tools"), "tools must be an array"))?;
        let mut list = Vec::new();
        for (i, t) in tools.iter().enumerate() {
            if t["type"] != "function" {
                return Err(bad(
                    Some("tools"),
                    format!(
                        "tools[{i}]: only function tools are supported, got type {}",
                        t["type"]
                    ),
                ));
            }
            let mut f = json!({"name": t["name"], "parameters": t.get("parameters").cloned().unwrap_or(json!({"type": "object"}))});
            if let Some(d) = t.get("description").filter(|d| d.is_string()) {
                f["description"] = d.clone();
            }
            list.push(json!({"type": "function", "function": f}));
        }
        chat["tools"] = Value::Array(list);
    }
    if let Some(c) = body.get("tool_choice").filter(|v| !v.is_null()) {
        chat["tool_choice"] = match c {
            Value::String(_) => c.clone(),
            _ if c["type"] == "function" => json!({"type": "function", "function": {"name": c["name"]}}),
            _ => {
                return Err(bad(
                    Some("tool_choice"),
                    "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}",
                ))
            }
        };
    }
    if let Some(f) = body
        .get("text")
        .and_then(|t| t.get("format"))
        .filter(|v| !v.is_null())
    {
        chat["response_format"] = match f["type"].as_str() {
            Some("text") => json!({"type": "text"}),
            Some("json_object") => json!({"type": "json_object"}),
            Some("json_schema") => {
                json!({"type": "json_schema", "json_schema": {"name": f["name"], "schema": f["schema"]}})
            }
            _ => {
                return Err(bad(
                    Some("text"),
                    "text.format.type must be text, json_object or json_schema",
                ))
            }
        };
    }
    Ok(chat)
}

/// The answer's shapes: a `response`, or its event stream.
struct Responses {
    id: String,
    msg_id: String,
    created: u64,
    model: String,
    /// What the response object echoes of the request.
    request: Value,
    /// Sequence number of the next event.
    seq: u64,
    /// The message item's text once it began (streaming).
    text: Option<String>,
    /// The calls' (item id, call id, name, arguments).
    calls: Vec<(String, String, String, String)>,
    finish: Option<String>,
}

impl Responses {
    fn event(&mut self, mut v: Value) -> Bytes {
        v["sequence_number"] = json!(self.seq);
        self.seq += 1;
        named_event(&v)
    }

    fn message_item(&self, text: &str, status: &str) -> Value {
        json!({"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
            "content": if status == "in_progress" { json!([]) } else {
                json!([{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]) }})
    }

    fn call_item(c: &(String, String, String, String), status: &str) -> Value {
        json!({"type": "function_call", "id": c.0, "call_id": c.1, "name": c.2,
            "arguments": if status == "in_progress" { "" } else { c.3.as_str() }, "status": status})
    }

    /// The response object: `usage` `None` while it runs.
    fn response(&self, usage: Option<&Value>) -> Value {
        let mut output = Vec::new();
        if let Some(t) = &self.text {
            output.push(self.message_item(t, "completed"));
        }
        output.extend(self.calls.iter().map(|c| Self::call_item(c, "completed")));
        let (status, incomplete) = match (usage, self.finish.as_deref()) {
            (None, _) => ("in_progress", Value::Null),
            (Some(_), Some("length")) => ("incomplete", json!({"reason": "max_output_tokens"})),
            _ => ("completed", Value::Null),
        };
        let mut r = json!({"id": self.id, "object": "response", "created_at": self.created,
            "status": status, "model": self.model, "output": output, "incomplete_details": incomplete,
            "error": null, "parallel_tool_calls": true, "store": false,
            "usage": usage.map(|u| json!({
                "input_tokens": u["prompt_tokens"], "output_tokens": u["completion_tokens"],
                "total_tokens": u["total_tokens"],
                "input_tokens_details": {"cached_tokens": u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)},
                "output_tokens_details": {"reasoning_tokens": 0}}))});
        for (k, v) in self.request.as_object().into_iter().flatten() {
            r[k] = v.clone();
        }
        r
    }

    /// The open message item's closing events.
    fn close_text(&mut self, out: &mut Vec<Bytes>) {
        let Some(text) = self.text.clone() else {
            return;
        };
        let part = json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []});
        let id = self.msg_id.clone();
        out.push(
            self.event(json!({"type": "response.output_text.done", "item_id": id,
            "output_index": 0, "content_index": 0, "text": text, "logprobs": []})),
        );
        out.push(
            self.event(json!({"type": "response.content_part.done", "item_id": id,
            "output_index": 0, "content_index": 0, "part": part})),
        );
        let item = self.message_item(&text, "completed");
        out.push(
            self.event(
                json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            ),
        );
    }
}

impl Dialect for Responses {
    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        let p = ChunkParts::of(chunk);
        let mut out = Vec::new();
        if p.start {
            let r = self.response(None);
            out.push(self.event(json!({"type": "response.created", "response": r})));
            out.push(self.event(json!({"type": "response.in_progress", "response": r})));
        }
        if !p.text.is_empty() {
            let id = self.msg_id.clone();
            if self.text.is_none() {
                self.text = Some(String::new());
                let item = self.message_item("", "in_progress");
                out.push(self.event(
                    json!({"type": "response.output_item.added", "output_index": 0, "item": item}),
                ));
                out.push(self.event(json!({"type": "response.content_part.added", "item_id": id,
                    "output_index": 0, "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}})));
            }
            if let Some(t) = self.text.as_mut() {
                t.push_str(&p.text);
            }
            out.push(
                self.event(json!({"type": "response.output_text.delta", "item_id": id,
                "output_index": 0, "content_index": 0, "delta": p.text, "logprobs": []})),
            );
        }
        if !p.calls.is_empty() {
            self.close_text(&mut out);
        }
        for (id, name, args) in p.calls {
            let c = (new_id("fc_"), id, name, args);
            let index = self.calls.len() + usize::from(self.text.is_some());
            out.push(self.event(
                json!({"type": "response.output_item.added", "output_index": index,
                "item": Self::call_item(&c, "in_progress")}),
            ));
            out.push(
                self.event(json!({"type": "response.function_call_arguments.delta",
                "item_id": c.0, "output_index": index, "delta": c.3})),
            );
            out.push(
                self.event(json!({"type": "response.function_call_arguments.done",
                "item_id": c.0, "output_index": index, "arguments": c.3})),
            );
            out.push(self.event(
                json!({"type": "response.output_item.done", "output_index": index,
                "item": Self::call_item(&c, "completed")}),
            ));
            self.calls.push(c);
        }
        if let Some(f) = p.finish {
            if self.calls.is_empty() {
                self.close_text(&mut out);
            }
            self.finish = Some(f);
        }
        if let Some(u) = p.usage {
            let r = self.response(Some(&u));
            let kind = if r["status"] == "incomplete" {
                "response.incomplete"
            } else {
                "response.completed"
            };
            out.push(self.event(json!({"type": kind, "response": r})));
        }
        out
    }

    fn done(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn stream_error(&mut self, e: &ApiError) -> Vec<Bytes> {
        let mut r = self.response(None);
        r["status"] = json!("failed");
        r["error"] = json!({"code": "server_error", "message": e.message});
        vec![self.event(json!({"type": "response.failed", "response": r}))]
    }

    fn whole(&self, a: Value) -> Value {
        let choice = &a["choices"][0];
        let msg = &choice["message"];
        let mut me = Responses {
            id: self.id.clone(),
            msg_id: self.msg_id.clone(),
            created: self.created,
            model: self.model.clone(),
            request: self.request.clone(),
            seq: 0,
            text: msg["content"]
                .as_str()
                .filter(|t| !t.is_empty())
                .map(String::from),
            calls: Vec::new(),
            finish: choice["finish_reason"].as_str().map(String::from),
        };
        me.calls = calls_of(&msg["tool_calls"])
            .into_iter()
            .map(|(id, name, args)| (new_id("fc_"), id, name, args))
            .collect();
        if me.text.is_none() && me.calls.is_empty() {
            me.text = Some(String::new());
        }
        me.response(Some(&a["usage"]))
    }
}
