//! llama-server's own routes, for its clients (editor plugins, its web UI, scripts written
//! for it): `POST /tokenize`, `/detokenize`, `/apply-template`, `GET /props`, `/slots`.
//! `/completion` and `/infill` run the gateway's one generation path
//! ([`super::completion`]) and answer in llama-server's shape ([`crate::api::Answer`]).
//! Contract: specs/openai-api.md, "llama-server routes".

use super::*;

/// The routes this module answers (for 405 and the request metrics' labels).
pub(super) const ROUTES: &[&str] = &[
    "/completion",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/props",
    "/slots",
];

/// `(method, path)` -> this module's handler, or `None` when the route is not one of its own.
pub(super) async fn route(
    st: &Arc<AppState>,
    req: Request<Incoming>,
) -> Result<Result<Resp, ApiError>, Request<Incoming>> {
    let r = match (req.method(), req.uri().path()) {
        (&Method::POST, "/completion") => completion(st, req, Route::Completion).await,
        (&Method::POST, "/tokenize") => tokenize(st, req).await,
        (&Method::POST, "/detokenize") => detokenize(st, req).await,
        (&Method::POST, "/apply-template") => apply_template(st, req).await,
        (&Method::GET, "/props") => Ok(props(st)),
        (&Method::GET, "/slots") => slots(st),
        _ => return Err(req),
    };
    Ok(r)
}

/// The body as a JSON object, or a 400.
async fn body_object(st: &AppState, req: Request<Incoming>) -> Result<Value, ApiError> {
    let body = read_body(st, req).await?;
    let v: Value =
        serde_json::from_slice(&body).map_err(|e| bad(None, format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(bad(None, "the body must be a JSON object"));
    }
    Ok(v)
}

/// A boolean field (absent: `default`), or a 400 naming it.
fn flag(v: &Value, field: &'static str, default: bool) -> Result<bool, ApiError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(x) => Err(bad(
            Some(field),
            format!("{field} must be true or false, got {x}"),
        )),
    }
}

/// Runs station calls on the blocking pool, mapping their errors as the API answers them.
async fn blocking<T: Send + 'static>(
    st: &Arc<AppState>,
    param: &'static str,
    f: impl FnOnce(&AppState) -> Result<T, GenError> + Send + 'static,
) -> Result<T, ApiError> {
    let st = st.clone();
    tokio::task::spawn_blocking(move || f(&st))
        .await
        .map_err(|e| internal(format!("tokenizer task: {e}")))?
        .map_err(|e| api_error(e, param))
}

/// `POST /tokenize {"content", "add_special" (false), "parse_special" (true),
/// "with_pieces" (false)}` -> `{"tokens": [id...]}`, or with pieces
/// `{"tokens": [{"id", "piece"}...]}` where a piece that is not whole UTF-8 is its bytes.
async fn tokenize(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let v = body_object(st, req).await?;
    let content = match v.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(bad(Some("content"), "content (a string) is required")),
    };
    // llama-server's add_special adds what the model's own rule adds (BOS when it wants one).
    let add = if flag(&v, "add_special", false)? {
        None
    } else {
        Some(false)
    };
    let parse_special = flag(&v, "parse_special", true)?;
    let pieces = flag(&v, "with_pieces", false)?;
    let tokens = blocking(st, "content", move |st| {
        let b = &st.backend;
        let ids = if content.is_empty() {
            Vec::new()
        } else {
            b.tokenizer()?
                .tokenize_parts(&[(content.as_str(), parse_special)], add)?
        };
        if !pieces {
            return Ok(json!(ids));
        }
        let vocab = b.vocab_bytes()?;
        Ok(ids
            .iter()
            .map(|&id| {
                let bytes = vocab.get(id as usize).map_or(&[][..], |t| &t.bytes[..]);
                let piece = match std::str::from_utf8(bytes) {
                    Ok(s) => json!(s),
                    Err(_) => json!(bytes),
                };
                json!({"id": id, "piece": piece})
            })
            .collect::<Value>())
    })
    .await?;
    Ok(json_resp(StatusCode::OK, &json!({ "tokens": tokens })))
}

/// `POST /detokenize {"tokens": [id...]}` -> `{"content": text}`; an id outside the
/// vocabulary is a 400.
async fn detokenize(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let v = body_object(st, req).await?;
    let vocab = st.backend.vocab_size as u64;
    let want = "tokens must be a list of token ids";
    let ids: Vec<u32> = match v.get("tokens") {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x.as_u64() {
                Some(id) if id < vocab => Ok(id as u32),
                _ => Err(bad(
                    Some("tokens"),
                    format!("{want}; {x} is not one of this model (0..{vocab})"),
                )),
            })
            .collect::<Result<_, _>>()?,
        None | Some(Value::Null) => Vec::new(),
        Some(_) => return Err(bad(Some("tokens"), want)),
    };
    let content = blocking(st, "tokens", move |st| st.backend.detokenize(&ids)).await?;
    Ok(json_resp(StatusCode::OK, &json!({ "content": content })))
}

/// `POST /apply-template {"messages": [...]}` -> `{"prompt": text}`: the conversation
/// rendered with the model's chat template and the assistant's turn opened, as a chat
/// completion would send it.
async fn apply_template(st: &Arc<AppState>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let body = read_body(st, req).await?;
    let limits = Limits {
        default_max_tokens: 1,
        max_tokens_limit: usize::MAX,
        vocab: st.backend.info.as_ref().map(|i| i.vocab),
        seed: st.args.seed,
    };
    let job = api::parse(Route::Chat, &body, &limits)?;
    let PromptSpec::Chat(messages) = job.prompt else {
        return Err(internal("a chat body without messages".into()));
    };
    let template = st
        .template
        .as_ref()
        .ok_or_else(|| api_error(GenError::NoTokenizer, "messages"))?;
    let tools = job.tools.as_ref().map(|t| &t.list);
    let parts = template
        .render_parts_with_tools(&messages, tools, true)
        .map_err(|e| api_error(GenError::Template(e), "messages"))?;
    let prompt: String = parts.into_iter().map(|(t, _)| t).collect();
    Ok(json_resp(StatusCode::OK, &json!({ "prompt": prompt })))
}

/// `GET /props`: the served model, its context per slot and the slots, the chat template.
fn props(st: &AppState) -> Resp {
    let b = &st.backend;
    let text = |id: Option<u32>| id.and_then(|i| b.token_text(i).ok()).unwrap_or_default();
    let info = b.info.as_ref();
    json_resp(
        StatusCode::OK,
        &json!({
            "default_generation_settings": {
                "n_ctx": b.context,
                "params": {"n_predict": st.args.default_max_tokens},
            },
            "total_slots": st.args.max_concurrent,
            "model_alias": st.served_name,
            "model_path": b.model_id,
            "chat_template": info.and_then(|i| i.chat_template.clone()),
            "bos_token": text(info.and_then(|i| i.bos_id)),
            "eos_token": text(info.and_then(|i| i.eos_id)),
            "modalities": {"vision": false, "audio": false},
            "build_info": api::SYSTEM_FINGERPRINT,
            "is_sleeping": false,
        }),
    )
}

/// `GET /slots` (read only): one entry per generation slot (`--max-concurrent`), with its
/// context and whether a generation holds it. `--no-slots` answers 501, as llama-server's
/// `--no-slots` does.
fn slots(st: &AppState) -> Result<Resp, ApiError> {
    if st.args.no_slots {
        return Err(ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            kind: "not_supported_error",
            code: Some("not_supported"),
            param: None,
            message: "this server does not list its slots (--no-slots)".into(),
        });
    }
    let total = st.args.max_concurrent;
    let free = st.pool.lock().map(|p| p.len()).unwrap_or(total);
    let busy = total.saturating_sub(free);
    let list: Vec<Value> = (0..total)
        .map(|i| json!({"id": i, "n_ctx": st.backend.context, "is_processing": i < busy}))
        .collect();
    Ok(json_resp(StatusCode::OK, &Value::Array(list)))
}
