//! Ollama's API: `POST /api/chat`, `POST /api/generate` (NDJSON streaming by default,
//! `stream: false` for one object), `GET /api/tags`, `POST /api/show`, `GET /api/version`,
//! translated onto the one request model (an OpenAI chat or completions body) and back.
//!
//! `options` map onto the sampler: `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`,
//! `num_predict` (-1: the gateway's default), `repeat_penalty`, `presence_penalty`,
//! `frequency_penalty`; sampling options the gateway cannot honour (`mirostat`,
//! `typical_p`, ...) are refused as on the OpenAI routes; options about the runner
//! (`num_ctx`, `num_thread`, `num_gpu`, ...) and `keep_alive` do not change the answer and are
//! ignored. `format` (`"json"` or a schema) is structured output; `tools` are OpenAI's list.
//! `/api/generate` with `raw` or `suffix` continues the text (fill-in-the-middle with a
//! suffix); otherwise the prompt (and `system`) is one chat turn. Errors: `{"error": "..."}`.

use super::dialect::*;
use super::*;
use serde_json::Map;

/// The Ollama version `/api/version` reports (the API generation these routes follow).
const VERSION: &str = "0.12.0";

/// `POST /api/chat`.
pub(super) async fn chat(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    run(st, req, false).await
}

/// `POST /api/generate`.
pub(super) async fn generate_route(
    st: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Resp, ApiError> {
    run(st, req, true).await
}

async fn run(st: &Arc<AppState>, req: Request<Incoming>, gen: bool) -> Result<Resp, ApiError> {
    let t0 = Instant::now();
    let answer = async {
        let body = json_body(st, req).await?;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .filter(|m| !m.is_empty())
            .ok_or_else(|| bad(Some("model"), "model is required"))?
            .to_string();
        if gen && body.get("prompt").is_none_or(|p| p.as_str() == Some("")) {
            // Ollama's "load the model": no prompt, nothing generated.
            return Ok(json_resp(
                StatusCode::OK,
                &json!({"model": model, "created_at": created_at(), "response": "", "done": true, "done_reason": "load"}),
            ));
        }
        let (openai, route) = to_openai(st, &body, gen)?;
        let job = api::parse(route, openai.to_string().as_bytes(), &request_limits(st))?;
        check_model(st, route, &job)?;
        let d = Ollama {
            model,
            generate: gen,
            t0,
            prompt_tokens: 0,
            finish: None,
        };
        super::generate(st, job, route, Box::new(d), t0).await
    }
    .await;
    Ok(answer.unwrap_or_else(|e| error(&e)))
}

/// An error in Ollama's shape: `{"error": "..."}`.
pub(super) fn error(e: &ApiError) -> Resp {
    json_resp(e.status, &json!({"error": e.message}))
}

/// Ollama's `options` (and `format`) on an OpenAI body.
fn options(body: &Map<String, Value>, out: &mut Value) -> Result<(), ApiError> {
    let opts = match body.get("options") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(o)) => o.clone(),
        Some(_) => return Err(bad(Some("options"), "options must be an object")),
    };
    for (k, v) in &opts {
        match k.as_str() {
            "temperature" | "top_p" | "top_k" | "min_p" | "seed" | "stop" | "repeat_penalty"
            | "presence_penalty" | "frequency_penalty" => out[k] = v.clone(),
            "num_predict" => match v {
                Value::Null => {}
                v => match v.as_i64() {
                    // -1: until the end (the gateway's default bound); -2: fill the context.
                    Some(n) if n < 0 => {}
                    Some(n) => out["max_tokens"] = json!(n),
                    None => {
                        return Err(bad(
                            Some("options"),
                            "options.num_predict must be an integer",
                        ))
                    }
                },
            },
            // Sampling the gateway does not do: refused unless it asks for nothing.
            "mirostat" | "mirostat_eta" | "mirostat_tau" | "typical_p" | "tfs_z" => {
                out[k] = v.clone()
            }
            // The runner's settings (context size, threads, batch, memory): no effect on
            // the answer here.
            _ => {}
        }
    }
    // Ollama's own defaults where the request gives none.
    if out.get("temperature").is_none() {
        out["temperature"] = json!(0.8);
    }
    match body.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "json" => {
            out["response_format"] = json!({"type": "json_object"})
        }
        Some(Value::String(s)) if s.is_empty() => {}
        Some(s @ Value::Object(_)) => {
            out["response_format"] =
                json!({"type": "json_schema", "json_schema": {"name": "format", "schema": s}})
        }
        Some(_) => {
            return Err(bad(
                Some("format"),
                "format must be \"json\" or a JSON schema object",
            ))
        }
    }
    Ok(())
}

/// An Ollama message's text and images check.
fn content(m: &Value, what: &str) -> Result<String, ApiError> {
    if m.get("images")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
    {
        return Err(bad(
            Some("messages"),
            format!("{what}: image input is not supported by this text-only gateway"),
        ));
    }
    match &m["content"] {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        _ => Err(bad(
            Some("messages"),
            format!("{what}.content must be a string"),
        )),
    }
}

/// An Ollama request as the OpenAI body and route it asks for.
fn to_openai(
    st: &AppState,
    body: &Map<String, Value>,
    gen: bool,
) -> Result<(Value, Route), ApiError> {
    let mut out = json!({"model": st.served_name});
    // Ollama streams unless told not to.
    let stream = body.get("stream") != Some(&Value::Bool(false));
    if stream {
        out["stream"] = json!(true);
        out["stream_options"] = json!({"include_usage": true});
    }
    options(body, &mut out)?;
    if gen {
        if body
            .get("images")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty())
        {
            return Err(bad(
                Some("images"),
                "image input is not supported by this text-only gateway",
            ));
        }
        if body.get("context").is_some_and(|c| !c.is_null()) {
            return Err(bad(Some("context"), "context (the deprecated token history) is not supported: send the conversation to /api/chat"));
        }
        let prompt = match body.get("prompt") {
            Some(Value::String(s)) => s.clone(),
            None | Some(Value::Null) => String::new(),
            Some(_) => return Err(bad(Some("prompt"), "prompt must be a string")),
        };
        let raw = body.get("raw") == Some(&Value::Bool(true));
        let suffix = body
            .get("suffix")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        if raw || suffix.is_some() {
            out["prompt"] = json!(prompt);
            if let Some(s) = suffix {
                out["suffix"] = json!(s);
            }
            return Ok((out, Route::Completions));
        }
        let mut msgs = Vec::new();
        if let Some(s) = body.get("system").and_then(Value::as_str) {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.push(json!({"role": "user", "content": prompt}));
        out["messages"] = Value::Array(msgs);
        return Ok((out, Route::Chat));
    }
    let list = match body.get("messages") {
        Some(Value::Array(l)) => l,
        None | Some(Value::Null) => return Err(bad(Some("messages"), "messages is required")),
        Some(_) => return Err(bad(Some("messages"), "messages must be an array")),
    };
    let mut msgs = Vec::new();
    for (i, m) in list.iter().enumerate() {
        let what = format!("messages[{i}]");
        let role = m["role"].as_str().unwrap_or_default();
        let text = content(m, &what)?;
        let mut msg = json!({"role": role, "content": text});
        if let Some(calls) = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
        {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(j, c)| {
                    let f = &c["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => "{}".into(),
                        a => a.to_string(),
                    };
                    json!({"id": format!("call_{i}_{j}"), "type": "function",
                        "function": {"name": f["name"], "arguments": args}})
                })
                .collect();
            msg["tool_calls"] = Value::Array(calls);
        }
        msgs.push(msg);
    }
    out["messages"] = Value::Array(msgs);
    if let Some(t) = body.get("tools").filter(|t| !t.is_null()) {
        out["tools"] = t.clone();
    }
    Ok((out, Route::Chat))
}

/// RFC 3339 UTC time of now, as Ollama's `created_at`.
fn created_at() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Ollama's answers: NDJSON objects (one per piece, then the `done` one) or one object.
struct Ollama {
    model: String,
    /// `/api/generate` (`response`) rather than `/api/chat` (`message`).
    generate: bool,
    t0: Instant,
    prompt_tokens: usize,
    finish: Option<String>,
}

impl Ollama {
    fn line(v: &Value) -> Bytes {
        Bytes::from(format!("{v}\n"))
    }

    /// One answer object with `text` (and `calls`, chat only).
    fn object(&self, text: &str, calls: &[(String, String, String)], done: bool) -> Value {
        let mut v = json!({"model": self.model, "created_at": created_at(), "done": done});
        if self.generate {
            v["response"] = json!(text);
        } else {
            v["message"] = json!({"role": "assistant", "content": text});
            if !calls.is_empty() {
                v["message"]["tool_calls"] = calls
                    .iter()
                    .map(|(_, name, args)| json!({"function": {"name": name, "arguments": args_object(args)}}))
                    .collect();
            }
        }
        v
    }

    /// The `done` fields: reason and counts (durations in nanoseconds).
    fn stats(&self, v: &mut Value, finish: &str, usage: &Value) {
        let total = self.t0.elapsed().as_nanos() as u64;
        v["done_reason"] = json!(if finish == "length" { "length" } else { "stop" });
        v["total_duration"] = json!(total);
        v["load_duration"] = json!(0);
        v["prompt_eval_count"] = json!(usage["prompt_tokens"]
            .as_u64()
            .unwrap_or(self.prompt_tokens as u64));
        v["eval_count"] = json!(usage["completion_tokens"].as_u64().unwrap_or(0));
    }
}

impl Dialect for Ollama {
    fn prompt(&mut self, tokens: usize) {
        self.prompt_tokens = tokens;
    }

    fn stream_type(&self) -> &'static str {
        "application/x-ndjson"
    }

    fn chunk(&mut self, chunk: &Value) -> Vec<Bytes> {
        let mut p = ChunkParts::of(chunk);
        if let Some(t) = chunk["choices"][0]["text"].as_str() {
            // The completions route (raw, suffix) streams `text`.
            p.text = t.to_string();
        }
        if let Some(f) = p.finish.take() {
            self.finish = Some(f);
        }
        let mut out = Vec::new();
        if !p.text.is_empty() || !p.calls.is_empty() {
            out.push(Self::line(&self.object(&p.text, &p.calls, false)));
        }
        if let Some(u) = p.usage {
            let mut v = self.object("", &[], true);
            let finish = self.finish.clone().unwrap_or_else(|| "stop".into());
            self.stats(&mut v, &finish, &u);
            out.push(Self::line(&v));
        }
        out
    }

    fn done(&mut self) -> Vec<Bytes> {
        Vec::new()
    }

    fn stream_error(&mut self, e: &ApiError) -> Vec<Bytes> {
        vec![Self::line(&json!({"error": e.message}))]
    }

    fn whole(&self, a: Value) -> Value {
        let choice = &a["choices"][0];
        let text = choice["message"]["content"]
            .as_str()
            .or(choice["text"].as_str())
            .unwrap_or_default();
        let calls = calls_of(&choice["message"]["tool_calls"]);
        let mut v = self.object(text, &calls, true);
        self.stats(
            &mut v,
            choice["finish_reason"].as_str().unwrap_or("stop"),
            &a["usage"],
        );
        v
    }
}

/// The model's entry in `/api/tags` and `/api/show`'s details.
fn details(st: &AppState) -> Value {
    json!({"format": "knot", "family": st.backend.model_id, "families": [st.backend.model_id],
        "parameter_size": "", "quantization_level": ""})
}

/// `GET /api/tags`: the served model.
pub(super) fn tags(st: &AppState) -> Resp {
    json_resp(
        StatusCode::OK,
        &json!({"models": [{"name": st.served_name, "model": st.served_name,
            "modified_at": created_at(), "size": 0, "digest": "", "details": details(st)}]}),
    )
}

/// `POST /api/show`: the served model's template and details (any `model` name is the
/// served one, as on the other routes).
pub(super) async fn show(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let answer = async {
        let body = json_body(st, req).await?;
        if body
            .get("model")
            .or(body.get("name"))
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(bad(Some("model"), "model is required"));
        }
        let template = st
            .backend
            .info
            .as_ref()
            .and_then(|i| i.chat_template.clone())
            .unwrap_or_default();
        let mut caps = vec!["completion"];
        if template.contains("tools") {
            caps.push("tools");
        }
        if st.fim.is_some() {
            caps.push("insert");
        }
        let mut info = json!({"general.name": st.backend.model_id, "general.vocab_size": st.backend.vocab_size});
        if let Some(c) = st.backend.context {
            info["general.context_length"] = json!(c);
        }
        Ok(json_resp(
            StatusCode::OK,
            &json!({"modelfile": "", "parameters": "", "template": template,
                "details": details(st), "model_info": info, "capabilities": caps,
                "modified_at": created_at()}),
        ))
    }
    .await;
    Ok(answer.unwrap_or_else(|e| error(&e)))
}

/// `GET /api/version`.
pub(super) fn version() -> Resp {
    json_resp(StatusCode::OK, &json!({"version": VERSION}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_at_is_rfc3339_utc() {
        let t = created_at();
        assert_eq!(t.len(), 30, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
            "{t}"
        );
    }
}
