//! The OpenAI-compatible API's requests, apart from the server: `/v1/chat/completions`,
//! `/v1/completions` and llama-server's `/infill` bodies parsed and validated into a [`Job`],
//! the OpenAI error shape, and the field rule: a field the gateway cannot honour is refused
//! with a 400 naming it, never ignored.
//!
//! The field rule, in [`unhonoured`]: every field OpenAI defines for these routes is either
//! honoured, or accepted only with the values that ask for nothing (`tools: []`,
//! `response_format: {"type": "text"}`, `n: 1`, ...), or refused. The llama-server and vLLM
//! extensions that change the output and are not built here (`grammar`, `json_schema`,
//! `guided_json`, `typical_p`, `mirostat`, `ignore_eos`, ...) are refused the same way. Any
//! other key is ignored, as llama-server ignores keys it does not know.

use std::collections::BTreeMap;

use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use crate::chat::Message;
use crate::sampling::{SamplingError, SamplingParams, TokenLogprob};

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    pub param: Option<&'static str>,
    pub message: String,
}

/// A 400 `invalid_request_error` naming `param`.
pub fn bad(param: Option<&'static str>, message: impl Into<String>) -> ApiError {
    ApiError {
        status: StatusCode::BAD_REQUEST,
        kind: "invalid_request_error",
        code: None,
        param,
        message: message.into(),
    }
}

/// What the gateway's flags and the model bound a request by.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_limit: usize,
    /// The model's vocabulary size (token ids in `logit_bias` and prompts must be below it).
    pub vocab: Option<u32>,
    /// The seed of a request that gives none (`--seed`); `None`: a fresh one each time.
    pub seed: Option<u64>,
}

/// What a generation continues.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptSpec {
    /// A conversation, rendered with the model's chat template.
    Chat(Vec<Message>),
    /// Raw text (special-token text in it is parsed, as llama-server's `/completion` does).
    Text(String),
    /// Token ids as given.
    Ids(Vec<u32>),
    /// llama-server's mixed prompt: text (special-token text parsed) and ids, in order.
    Mixed(Vec<MixedPart>),
    /// Fill-in-the-middle: the code before and after the hole, and the start of the middle.
    Fim {
        prefix: String,
        suffix: String,
        middle: String,
        /// llama-server's `input_extra`: other files of the project as (filename, text),
        /// rendered before the prefix in the model's repository format.
        extra: Vec<(String, String)>,
    },
}

/// One piece of a [`PromptSpec::Mixed`] prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum MixedPart {
    Text(String),
    Ids(Vec<u32>),
}

/// A validated request.
#[derive(Clone, Debug)]
pub struct Job {
    pub prompt: PromptSpec,
    pub stream: bool,
    pub include_usage: bool,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    /// Alternatives per token in the logprobs (`Some(0)`: the chosen token's only); `None`:
    /// no logprobs.
    pub logprobs: Option<usize>,
    /// Completions: the answer starts with the prompt's text.
    pub echo: bool,
    /// Structured output: the JSON schema every answer must match, and the field that
    /// asked for it (`response_format`, llama-server's `json_schema`, vLLM's
    /// `guided_json`); `json_object` is `{"type": "object"}`.
    pub format: Option<(&'static str, Value)>,
    /// Chat with `tools` (and `tool_choice` not `none`): what the template renders and
    /// whether a call is forced.
    pub tools: Option<Tools>,
    /// llama-server's `/completion` and `/infill` answer shape: what it asks beyond the
    /// OpenAI fields (`None` for the OpenAI routes).
    pub llama: Option<LlamaOpts>,
}

/// What llama-server's `/completion` and `/infill` bodies ask beyond the OpenAI fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LlamaOpts {
    /// `n_probs`: alternatives per token in `completion_probabilities` (0: none shown).
    pub n_probs: usize,
    /// `return_tokens`: the answer lists the generated ids.
    pub return_tokens: bool,
    /// `n_indent`: stop at the first line indented less than this many whitespace characters.
    pub n_indent: usize,
}

impl Job {
    /// Whether the answer shows log-probabilities (the llama-server routes ask the sampler
    /// for them always, to know each streamed piece's token ids).
    pub fn shows_logprobs(&self) -> bool {
        match &self.llama {
            Some(l) => l.n_probs > 0,
            None => self.logprobs.is_some(),
        }
    }
}

/// A JSON schema the output must match and the field that asked for it ([`Job::format`]).
pub type Format = (&'static str, Value);

/// A chat request's tools.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// OpenAI's list of `{"type": "function", "function": {"name", "description",
    /// "parameters"}}`, as the chat template reads it.
    pub list: Value,
    /// `tool_choice` is `required` or names a function: the answer is one call, decoded
    /// under [`crate::tools::call_schema`] (the job's `format`) after a `<tool_call>` that
    /// the prompt already ends with.
    pub forced: bool,
}

/// Most alternatives per token `top_logprobs` (chat) and `logprobs` (completions) may ask.
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// The sampling fields the three routes share (OpenAI's, llama.cpp's `top_k`, `min_p`,
/// `repeat_penalty`).
#[derive(Deserialize, Debug, Default)]
struct SamplingFields {
    temperature: Option<f32>,
    top_p: Option<f32>,
    /// Extension (llama.cpp, vLLM): top-k sampling.
    top_k: Option<i64>,
    /// Extension (llama.cpp, vLLM): min-p sampling.
    min_p: Option<f32>,
    /// Extension (llama.cpp): repetition penalty.
    repeat_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Stop>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    /// Token id (as a string) -> bias in -100..=100.
    logit_bias: Option<BTreeMap<String, f32>>,
    /// `{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema", ...}}`.
    response_format: Option<Value>,
    /// Extension (llama-server): a JSON schema the output must match.
    json_schema: Option<Value>,
    /// Extension (vLLM): a JSON schema the output must match.
    guided_json: Option<Value>,
}

/// `POST /v1/chat/completions` body.
#[derive(Deserialize, Debug)]
struct ChatRequest {
    // `model` is not read: the served model answers whatever a request names, or when it
    // names none (llama-server does the same; there is one model behind a gateway).
    messages: Option<Vec<ApiMessage>>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    n: Option<i64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    #[serde(flatten)]
    sampling: SamplingFields,
}

/// `POST /v1/completions` body.
#[derive(Deserialize, Debug)]
struct CompletionRequest {
    prompt: Option<Prompt>,
    suffix: Option<String>,
    echo: Option<bool>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    n: Option<i64>,
    /// Completions' form: how many alternatives per token (0..=20).
    logprobs: Option<i64>,
    #[serde(flatten)]
    sampling: SamplingFields,
}

/// llama-server's `POST /infill` body.
#[derive(Deserialize, Debug)]
struct InfillRequest {
    input_prefix: Option<String>,
    input_suffix: Option<String>,
    input_extra: Option<Vec<Value>>,
    /// Added after the middle marker: the start of the code to fill.
    prompt: Option<String>,
    n_indent: Option<i64>,
    #[serde(flatten)]
    generation: LlamaGeneration,
}

/// llama-server's `POST /completion` body.
#[derive(Deserialize, Debug)]
struct LlamaCompletionRequest {
    prompt: Option<Value>,
    #[serde(flatten)]
    generation: LlamaGeneration,
}

/// What llama-server's own generating routes (`/completion`, `/infill`) share besides the
/// prompt.
#[derive(Deserialize, Debug)]
struct LlamaGeneration {
    n_predict: Option<i64>,
    max_tokens: Option<i64>,
    stream: Option<bool>,
    n_probs: Option<i64>,
    return_tokens: Option<bool>,
    #[serde(flatten)]
    sampling: SamplingFields,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<i64>),
    IdLists(Vec<Vec<i64>>),
}

#[derive(Deserialize, Debug)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize, Debug)]
struct ApiMessage {
    role: String,
    content: Option<Content>,
    /// An assistant turn's calls: `[{"id", "type": "function", "function": {"name",
    /// "arguments": JSON text}}]`.
    tool_calls: Option<Vec<Value>>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
enum Stop {
    One(String),
    Many(Vec<String>),
}

/// The routes whose bodies [`parse`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    Chat,
    Completions,
    Infill,
    /// llama-server's `POST /completion`.
    Completion,
}

/// Parses and validates a body for `route`.
pub fn parse(route: Route, body: &[u8], limits: &Limits) -> Result<Job, ApiError> {
    let map: Map<String, Value> =
        serde_json::from_slice(body).map_err(|e| bad(None, format!("invalid JSON body: {e}")))?;
    for (k, v) in &map {
        if let Some(field) = unhonoured(route, k, v) {
            return Err(bad(
                Some(field),
                format!("`{field}` = {v} is not supported by this gateway (it refuses what it cannot honour)"),
            ));
        }
    }
    let v = Value::Object(map);
    let typed = |e: serde_json::Error| bad(None, format!("invalid request: {e}"));
    match route {
        Route::Chat => validate_chat(serde_json::from_value(v).map_err(typed)?, limits),
        Route::Completions => {
            validate_completion(serde_json::from_value(v).map_err(typed)?, limits)
        }
        Route::Infill => validate_infill(serde_json::from_value(v).map_err(typed)?, limits),
        Route::Completion => {
            validate_llama_completion(serde_json::from_value(v).map_err(typed)?, limits)
        }
    }
}

/// The JSON schema a request's output must match, from `response_format` or the
/// llama-server / vLLM extensions (at most one of them).
fn format(s: &SamplingFields) -> Result<Option<(&'static str, Value)>, ApiError> {
    let mut found = Vec::new();
    if let Some(rf) = &s.response_format {
        let what = "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {...}}}";
        match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            // llama-server's form: `{"type": "json_object", "schema": {...}}`.
            Some("json_object") => match rf.get("schema") {
                None | Some(Value::Null) => {
                    found.push(("response_format", json!({"type": "object"})))
                }
                Some(s) if s.is_object() || s.is_boolean() => {
                    found.push(("response_format", s.clone()))
                }
                Some(s) => {
                    return Err(bad(
                        Some("response_format"),
                        format!("response_format.schema must be a JSON schema object, got {s}"),
                    ))
                }
            },
            Some("json_schema") => {
                let schema = rf
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .filter(|v| v.is_object() || v.is_boolean())
                    .ok_or_else(|| bad(Some("response_format"), format!("response_format.json_schema.schema is required (a JSON schema object); {what}")))?;
                found.push(("response_format", schema.clone()));
            }
            _ => return Err(bad(Some("response_format"), what)),
        }
    }
    for (field, v) in [
        ("json_schema", &s.json_schema),
        ("guided_json", &s.guided_json),
    ] {
        match v {
            None => {}
            Some(v) if v.is_object() || v.is_boolean() => found.push((field, v.clone())),
            Some(_) => {
                return Err(bad(
                    Some(field),
                    format!("{field} must be a JSON schema object"),
                ))
            }
        }
    }
    if found.len() > 1 {
        return Err(bad(
            Some(found[1].0),
            format!(
                "{} and {} both ask for a format: give one",
                found[0].0, found[1].0
            ),
        ));
    }
    Ok(found.pop())
}

/// The field `key` names when `route` cannot honour it with value `v` (`None`: honoured,
/// asks for nothing, or a key neither OpenAI nor the listed extensions define).
pub fn unhonoured(route: Route, key: &str, v: &Value) -> Option<&'static str> {
    let none = v.is_null();
    let empty = none || v.as_array().is_some_and(|a| a.is_empty());
    let off = none || *v == Value::Bool(false);
    let is = |vals: &[&str]| v.as_str().is_some_and(|s| vals.contains(&s));
    let num = |n: f64| none || v.as_f64() == Some(n);
    let llama = matches!(route, Route::Infill | Route::Completion);
    let (field, ok): (&'static str, bool) = match key {
        // OpenAI chat fields not built here, with the values that ask for nothing.
        "tools" if route != Route::Chat => ("tools", empty),
        "tool_choice" if route != Route::Chat => ("tool_choice", none || is(&["none", "auto"])),
        "functions" => ("functions", empty),
        "function_call" => ("function_call", none || is(&["none", "auto"])),
        "response_format" => (
            "response_format",
            none || v
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| ["text", "json_object", "json_schema"].contains(&t)),
        ),
        "audio" => ("audio", none),
        "modalities" => (
            "modalities",
            none || v
                .as_array()
                .is_some_and(|a| a.iter().all(|m| m.as_str() == Some("text"))),
        ),
        "prediction" => ("prediction", none),
        "store" => ("store", off),
        "service_tier" => ("service_tier", none || is(&["auto", "default"])),
        "reasoning_effort" => ("reasoning_effort", none),
        "verbosity" => ("verbosity", none),
        "web_search_options" => ("web_search_options", none),
        // Completions: more than one candidate.
        "best_of" => ("best_of", num(1.0)),
        // The chat route has no `suffix` or `echo` (vLLM's chat `echo` included).
        "suffix" if route != Route::Completions => ("suffix", none),
        "echo" if route != Route::Completions => ("echo", off),
        // llama-server and vLLM extensions that change the output and are not built here.
        "grammar" => ("grammar", none || v.as_str() == Some("")),
        "guided_regex" => ("guided_regex", none),
        "guided_choice" => ("guided_choice", none),
        "guided_grammar" => ("guided_grammar", none),
        "structured_outputs" => ("structured_outputs", none),
        "typical_p" => ("typical_p", num(1.0)),
        "tfs_z" => ("tfs_z", num(1.0)),
        "mirostat" => ("mirostat", num(0.0)),
        "dynatemp_range" => ("dynatemp_range", num(0.0)),
        "xtc_probability" => ("xtc_probability", num(0.0)),
        "dry_multiplier" => ("dry_multiplier", num(0.0)),
        "top_n_sigma" => ("top_n_sigma", num(-1.0)),
        "ignore_eos" => ("ignore_eos", off),
        "min_tokens" => ("min_tokens", num(0.0)),
        "repetition_penalty" => ("repetition_penalty", num(1.0)),
        "n_probs" if !llama => ("n_probs", num(0.0)),
        "n_indent" if route != Route::Infill => ("n_indent", num(0.0)),
        "continue_final_message" => ("continue_final_message", off),
        "add_generation_prompt" => ("add_generation_prompt", none || *v == Value::Bool(true)),
        "chat_template_kwargs" => ("chat_template_kwargs", none),
        _ => return None,
    };
    (!ok).then_some(field)
}

fn validate_chat(r: ChatRequest, limits: &Limits) -> Result<Job, ApiError> {
    let fmt = format(&r.sampling)?;
    let msgs = r
        .messages
        .ok_or_else(|| bad(Some("messages"), "messages is required"))?;
    if msgs.is_empty() {
        return Err(bad(
            Some("messages"),
            "messages must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => return Err(bad(Some("messages"), format!("messages[{i}].role {other:?} is not one of system, developer, user, assistant, tool"))),
        };
        let content = match m.content {
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut t = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(s)) => t.push_str(&s),
                        (k, _) => return Err(bad(Some("messages"), format!("messages[{i}]: content part type {k:?} is not supported (text only)"))),
                    }
                }
                t
            }
            None if role == "assistant" && m.tool_calls.as_ref().is_some_and(|c| !c.is_empty()) => {
                String::new()
            }
            None => {
                return Err(bad(
                    Some("messages"),
                    format!("messages[{i}].content is required"),
                ))
            }
        };
        let mut msg = Message::new(role, content);
        if let Some(calls) = m.tool_calls.filter(|c| !c.is_empty()) {
            if role != "assistant" {
                return Err(bad(
                    Some("messages"),
                    format!("messages[{i}]: only an assistant message has tool_calls"),
                ));
            }
            msg.tool_calls = Some(template_calls(&calls).map_err(|why| {
                bad(Some("messages"), format!("messages[{i}].tool_calls: {why}"))
            })?);
        }
        messages.push(msg);
    }
    let (tools, tool_format) = tools(r.tools, r.tool_choice)?;
    let format = match (fmt, tool_format) {
        (Some((f, _)), Some(_)) => {
            return Err(bad(
                Some(f),
                format!("{f} and a forced tool call (tool_choice) do not go together"),
            ))
        }
        (f, t) => f.or(t),
    };
    one_choice(r.n, "n")?;
    let logprobs = match (r.logprobs, r.top_logprobs) {
        (Some(true), n) => Some(top_n(n.unwrap_or(0), "top_logprobs")?),
        (_, None) => None,
        (_, Some(_)) => {
            return Err(bad(
                Some("top_logprobs"),
                "top_logprobs needs logprobs: true",
            ))
        }
    };
    let stream = r.stream.unwrap_or(false);
    Ok(Job {
        prompt: PromptSpec::Chat(messages),
        stream,
        include_usage: stream && r.stream_options.is_some_and(|o| o.include_usage),
        max_tokens: max_tokens(r.max_completion_tokens.or(r.max_tokens), limits)?,
        sampling: sampling(&r.sampling, limits)?,
        stops: stops(r.sampling.stop)?,
        logprobs,
        echo: false,
        format,
        tools,
        llama: None,
    })
}

fn validate_completion(r: CompletionRequest, limits: &Limits) -> Result<Job, ApiError> {
    let fmt = format(&r.sampling)?;
    one_choice(r.n, "n")?;
    let one = "one prompt per request (an array of one string or of one token list)";
    let prompt = match r
        .prompt
        .ok_or_else(|| bad(Some("prompt"), "prompt is required"))?
    {
        Prompt::Text(t) => PromptSpec::Text(t),
        Prompt::Texts(mut v) if v.len() == 1 => PromptSpec::Text(v.remove(0)),
        Prompt::Ids(ids) if !ids.is_empty() => PromptSpec::Ids(token_ids(&ids, limits)?),
        Prompt::IdLists(v) if v.len() == 1 => PromptSpec::Ids(token_ids(&v[0], limits)?),
        _ => return Err(bad(Some("prompt"), one)),
    };
    let echo = r.echo.unwrap_or(false);
    let logprobs = match r.logprobs {
        None => None,
        Some(n) => Some(top_n(n, "logprobs")?),
    };
    if echo && logprobs.is_some() {
        // The stations return the last position's logits only: no prompt logprobs.
        return Err(bad(
            Some("echo"),
            "echo with logprobs is not supported: the prompt's own log-probabilities are not computed",
        ));
    }
    let prompt = match (r.suffix, prompt) {
        (None, p) => p,
        (Some(_), _) if echo => {
            return Err(bad(Some("suffix"), "suffix and echo do not go together"))
        }
        (Some(suffix), PromptSpec::Text(prefix)) => PromptSpec::Fim {
            prefix,
            suffix,
            middle: String::new(),
            extra: Vec::new(),
        },
        (Some(_), _) => {
            return Err(bad(
                Some("suffix"),
                "suffix needs the prompt as text, not token ids",
            ))
        }
    };
    let stream = r.stream.unwrap_or(false);
    Ok(Job {
        prompt,
        stream,
        include_usage: stream && r.stream_options.is_some_and(|o| o.include_usage),
        max_tokens: max_tokens(r.max_tokens, limits)?,
        sampling: sampling(&r.sampling, limits)?,
        stops: stops(r.sampling.stop)?,
        logprobs,
        echo,
        format: fmt,
        tools: None,
        llama: None,
    })
}

fn validate_infill(r: InfillRequest, limits: &Limits) -> Result<Job, ApiError> {
    let fmt = format(&r.generation.sampling)?;
    let mut extra = Vec::new();
    for (i, chunk) in r.input_extra.iter().flatten().enumerate() {
        // llama-server's rule: each chunk is {"text": string, "filename": string (optional)}.
        let text = chunk.get("text").and_then(Value::as_str);
        let filename = match chunk.get("filename") {
            None | Some(Value::Null) => Some("tmp"),
            Some(f) => f.as_str(),
        };
        let (Some(text), Some(filename)) = (text, filename) else {
            return Err(bad(
                Some("input_extra"),
                format!("input_extra[{i}] must be {{\"text\": string, \"filename\": string}}, got {chunk}"),
            ));
        };
        extra.push((filename.to_string(), text.to_string()));
    }
    let (prefix, suffix) = (
        r.input_prefix.unwrap_or_default(),
        r.input_suffix.unwrap_or_default(),
    );
    let n_indent = match r.n_indent {
        None => 0,
        Some(n) if n >= 0 => n as usize,
        Some(n) => {
            return Err(bad(
                Some("n_indent"),
                format!("n_indent must be >= 0, got {n}"),
            ))
        }
    };
    let prompt = PromptSpec::Fim {
        prefix,
        suffix,
        middle: r.prompt.unwrap_or_default(),
        extra,
    };
    llama_job(prompt, r.generation, fmt, n_indent, limits)
}

/// llama-server's `n_predict`: -1 is "no limit" (the gateway's default here).
fn n_predict(n: Option<i64>) -> Option<i64> {
    n.filter(|&n| n != -1)
}

/// llama-server's `/completion`: `prompt` is a string, token ids, or one list mixing both
/// (ids and strings in order); several prompts in one request are refused.
fn validate_llama_completion(r: LlamaCompletionRequest, limits: &Limits) -> Result<Job, ApiError> {
    let fmt = format(&r.generation.sampling)?;
    let one = "prompt must be a string, a list of token ids, or one list mixing ids and strings (one prompt per request)";
    let prompt = match r.prompt {
        Some(Value::String(t)) => PromptSpec::Text(t),
        // llama-server's JSON prompt: `{"prompt_string"}` (with `multimodal_data`: media,
        // which no model here reads).
        Some(Value::Object(o)) => match (o.get("prompt_string"), o.get("multimodal_data")) {
            (Some(Value::String(t)), None) => PromptSpec::Text(t.clone()),
            (_, Some(_)) => {
                return Err(bad(
                    Some("prompt"),
                    "multimodal_data: this model reads text only",
                ))
            }
            _ => return Err(bad(Some("prompt"), one)),
        },
        Some(Value::Array(items)) if !items.is_empty() => {
            if items.iter().all(|i| i.is_i64() || i.is_u64()) {
                let ids: Vec<i64> = items.iter().filter_map(Value::as_i64).collect();
                if ids.len() != items.len() {
                    return Err(bad(Some("prompt"), one));
                }
                PromptSpec::Ids(token_ids(&ids, limits)?)
            } else if items.iter().all(|i| i.is_string() || i.is_i64()) {
                let mut parts = Vec::new();
                for i in &items {
                    match i {
                        Value::String(t) => parts.push(MixedPart::Text(t.clone())),
                        v => parts.push(MixedPart::Ids(token_ids(
                            &[v.as_i64().unwrap_or(-1)],
                            limits,
                        )?)),
                    }
                }
                PromptSpec::Mixed(parts)
            } else {
                return Err(bad(Some("prompt"), one));
            }
        }
        None => return Err(bad(Some("prompt"), "prompt is required")),
        Some(_) => return Err(bad(Some("prompt"), one)),
    };
    llama_job(prompt, r.generation, fmt, 0, limits)
}

/// The job of one of llama-server's own routes: its prompt, then what they share.
fn llama_job(
    prompt: PromptSpec,
    g: LlamaGeneration,
    format: Option<(&'static str, Value)>,
    n_indent: usize,
    limits: &Limits,
) -> Result<Job, ApiError> {
    let n_probs = top_n(g.n_probs.unwrap_or(0), "n_probs")?;
    Ok(Job {
        prompt,
        stream: g.stream.unwrap_or(false),
        include_usage: false,
        max_tokens: max_tokens(n_predict(g.n_predict.or(g.max_tokens)), limits)?,
        sampling: sampling(&g.sampling, limits)?,
        stops: stops(g.sampling.stop)?,
        logprobs: Some(n_probs),
        echo: false,
        format,
        tools: None,
        llama: Some(LlamaOpts {
            n_probs,
            return_tokens: g.return_tokens.unwrap_or(false),
            n_indent,
        }),
    })
}

/// An assistant turn's OpenAI `tool_calls` in the form chat templates read: `arguments` as
/// an object (OpenAI sends a JSON text), `type` and `id` kept.
fn template_calls(calls: &[Value]) -> Result<Value, String> {
    let mut out = Vec::with_capacity(calls.len());
    for c in calls {
        let f = c.get("function").ok_or("a call without function")?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .ok_or("a call without function.name")?;
        let arguments = match f.get("arguments") {
            Some(Value::String(t)) => {
                serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.clone()))
            }
            Some(v) => v.clone(),
            None => json!({}),
        };
        out.push(json!({"id": c.get("id"), "type": "function", "function": {"name": name, "arguments": arguments}}));
    }
    Ok(Value::Array(out))
}

/// A chat request's `tools` and `tool_choice`: what the template renders, and for a forced
/// call the schema it is decoded under (`none`, or no tools: nothing).
fn tools(
    list: Option<Vec<Value>>,
    choice: Option<Value>,
) -> Result<(Option<Tools>, Option<Format>), ApiError> {
    let list = list.unwrap_or_default();
    for (i, t) in list.iter().enumerate() {
        let ok = t.get("type").and_then(Value::as_str) == Some("function")
            && t.get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty())
            && t.get("function")
                .and_then(|f| f.get("parameters"))
                .is_none_or(|p| p.is_object() || p.is_boolean());
        if !ok {
            return Err(bad(Some("tools"), format!("tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": {{...}}}}}}")));
        }
    }
    let function = |t: &Value| t.get("function").cloned().unwrap_or(Value::Null);
    let named = |name: &str| list.iter().find(|t| t["function"]["name"] == name);
    let forced: Option<Vec<Value>> = match &choice {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) if c == "none" => return Ok((None, None)),
        Some(Value::String(c)) if c == "auto" => None,
        Some(Value::String(c)) if c == "required" => Some(list.iter().map(function).collect()),
        Some(c) => match c.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(n) if c.get("type").and_then(Value::as_str) == Some("function") => {
                let t = named(n).ok_or_else(|| bad(Some("tool_choice"), format!("tool_choice names {n:?}, which is not in tools")))?;
                Some(vec![function(t)])
            }
            _ => return Err(bad(Some("tool_choice"), "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")),
        },
    };
    if list.is_empty() {
        return match forced {
            Some(_) => Err(bad(
                Some("tool_choice"),
                "tool_choice asks for a call but tools is empty",
            )),
            None => Ok((None, None)),
        };
    }
    let format = forced.as_ref().map(|fs| {
        let refs: Vec<&Value> = fs.iter().collect();
        ("tool_choice", crate::tools::call_schema(&refs))
    });
    Ok((
        Some(Tools {
            list: Value::Array(list),
            forced: forced.is_some(),
        }),
        format,
    ))
}

fn one_choice(n: Option<i64>, field: &'static str) -> Result<(), ApiError> {
    if n.is_some_and(|n| n != 1) {
        return Err(bad(Some(field), format!("only {field} = 1 is supported")));
    }
    Ok(())
}

fn top_n(n: i64, field: &'static str) -> Result<usize, ApiError> {
    if !(0..=MAX_TOP_LOGPROBS).contains(&n) {
        return Err(bad(
            Some(field),
            format!("{field} must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
        ));
    }
    Ok(n as usize)
}

fn token_ids(ids: &[i64], limits: &Limits) -> Result<Vec<u32>, ApiError> {
    let vocab = limits.vocab.map_or(u32::MAX as i64, i64::from);
    ids.iter()
        .map(|&i| {
            if (0..vocab).contains(&i) {
                Ok(i as u32)
            } else {
                Err(bad(
                    Some("prompt"),
                    format!("token id {i} is outside the vocabulary (0..{vocab})"),
                ))
            }
        })
        .collect()
}

fn max_tokens(n: Option<i64>, limits: &Limits) -> Result<usize, ApiError> {
    match n {
        None => Ok(limits.default_max_tokens.min(limits.max_tokens_limit)),
        Some(n) if n >= 1 && (n as u64) <= limits.max_tokens_limit as u64 => Ok(n as usize),
        Some(n) => Err(bad(
            Some("max_tokens"),
            format!(
                "max_tokens must be between 1 and {}, got {n}",
                limits.max_tokens_limit
            ),
        )),
    }
}

fn stops(stop: Option<Stop>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => vec![],
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    if stops.len() > 4 {
        return Err(bad(Some("stop"), "at most 4 stop sequences"));
    }
    Ok(stops)
}

fn sampling(f: &SamplingFields, limits: &Limits) -> Result<SamplingParams, ApiError> {
    let temperature = f.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad(
            Some("temperature"),
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_k = match f.top_k {
        None => 0,
        Some(k) if k >= 0 => k as usize,
        Some(k) => return Err(bad(Some("top_k"), format!("top_k must be >= 0, got {k}"))),
    };
    let mut logit_bias = Vec::new();
    for (k, &b) in f.logit_bias.iter().flatten() {
        let id = k
            .parse::<u32>()
            .ok()
            .filter(|&id| limits.vocab.is_none_or(|v| id < v))
            .ok_or_else(|| {
                bad(
                    Some("logit_bias"),
                    format!("logit_bias key {k:?} is not a token id of this model"),
                )
            })?;
        logit_bias.push((id, b));
    }
    let p = SamplingParams {
        temperature,
        top_k,
        top_p: f.top_p.unwrap_or(1.0),
        repeat_penalty: f.repeat_penalty.unwrap_or(1.0),
        repeat_last_n: 64,
        seed: f.seed.map(|s| s as u64).or(limits.seed).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0)
        }),
        min_p: f.min_p.unwrap_or(0.0),
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        logit_bias,
    };
    p.validate().map_err(|e| {
        let param = match e {
            SamplingError::Temperature(_) => "temperature",
            SamplingError::TopP(_) => "top_p",
            SamplingError::RepeatPenalty(_) => "repeat_penalty",
            SamplingError::MinP(_) => "min_p",
            SamplingError::PresencePenalty(_) => "presence_penalty",
            SamplingError::FrequencyPenalty(_) => "frequency_penalty",
            SamplingError::LogitBias(..) => "logit_bias",
        };
        bad(Some(param), e.to_string())
    })?;
    Ok(p)
}

/// What JSON can carry for a log-probability: OpenAI's -9999 for a banned token's -inf.
fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

/// The answer's JSON in a route's shapes: chat (`chat.completion`, `chat.completion.chunk`),
/// completions (`text_completion`) and llama-server's infill (`content`). `text_of` gives a
/// token's text for the logprobs.
pub struct Answer<'a> {
    pub route: Route,
    pub id: String,
    pub created: u64,
    pub model: String,
    /// Completions with `echo`: the prompt's text, which the answer starts with.
    pub echo: Option<String>,
    /// Logprobs were asked for.
    pub logprobs: bool,
    pub text_of: &'a dyn Fn(u32) -> String,
    /// Completions' `text_offset`: characters of the answer before the next token.
    offset: usize,
    /// Chat with tools: whether the call is forced (the whole answer is its JSON), and the
    /// filter that keeps call text out of streamed content.
    tools: Option<(bool, crate::tools::CallFilter)>,
    /// The request's function names (a bare call must name one).
    tool_names: Vec<String>,
    /// llama-server's routes: what the request asked and its `generation_settings`.
    llama: Option<(LlamaOpts, Value)>,
    /// llama-server's routes, set when the generation ends: `{"stop_type", "usage",
    /// "timings", "tokens"}` for the last chunk or the whole answer.
    pub llama_done: Option<Value>,
}

/// What `system_fingerprint` says: this gateway's build (llama-server's is `b<build>-<commit>`,
/// which clients and its tests read as starting with `b`).
pub const SYSTEM_FINGERPRINT: &str = concat!("b", env!("CARGO_PKG_VERSION"), "-moonshine");

/// Where `text` (generated after the prompt's line) first has a line that starts less
/// indented than `n` whitespace characters (llama-server's `n_indent`): the byte offset of
/// that line's start. A line is judged at its first character that is not a space or a tab.
pub fn indent_cut(text: &str, n: usize) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let mut start = text.find('\n')? + 1;
    loop {
        let line = &text[start..];
        let indent = line.chars().take_while(|c| *c == ' ' || *c == '\t').count();
        match line[indent..].chars().next() {
            // Not judged yet: an empty line, or one whose first character has not come.
            Some('\n') => {}
            None => return None,
            Some(_) if indent < n => return Some(start),
            Some(_) => {}
        }
        start += line.find('\n')? + 1;
    }
}

impl<'a> Answer<'a> {
    pub fn new(
        route: Route,
        id: String,
        created: u64,
        model: String,
        echo: Option<String>,
        logprobs: bool,
        text_of: &'a dyn Fn(u32) -> String,
    ) -> Answer<'a> {
        let offset = echo.as_deref().map_or(0, |e| e.chars().count());
        Answer {
            route,
            id,
            created,
            model,
            echo,
            logprobs,
            text_of,
            offset,
            tools: None,
            tool_names: Vec::new(),
            llama: None,
            llama_done: None,
        }
    }

    /// llama-server's `/completion` and `/infill` shapes, with the request's
    /// `generation_settings`.
    pub fn with_llama(mut self, opts: LlamaOpts, settings: Value) -> Self {
        self.llama = Some((opts, settings));
        self
    }

    /// llama-server's last event or whole answer: `content` shown (the whole text, or empty
    /// in a stream's last event), `full` the whole generated text.
    fn llama_final(&mut self, content: &str, full: &str, lps: &[TokenLogprob]) -> Value {
        let done = self.llama_done.clone().unwrap_or(Value::Null);
        let (opts, settings) = self.llama.clone().unwrap_or_default();
        let usage = &done["usage"];
        let tokens = if opts.return_tokens {
            done["tokens"].clone()
        } else {
            json!([])
        };
        let mut v = json!({"index": 0, "content": content, "tokens": tokens, "id_slot": -1,
            "stop": true, "model": self.model, "tokens_predicted": usage["completion_tokens"],
            "tokens_evaluated": usage["prompt_tokens"], "generation_settings": settings,
            "has_new_line": full.contains('\n'), "truncated": false,
            "stop_type": done["stop_type"], "stopping_word": "",
            "tokens_cached": usage["prompt_tokens_details"]["cached_tokens"], "timings": done["timings"]});
        if opts.n_probs > 0 {
            v["completion_probabilities"] = self.llama_probs(lps);
        }
        v
    }

    /// llama-server's `completion_probabilities`: per token its id, text, bytes, log-probability
    /// and the `n_probs` most likely alternatives.
    fn llama_probs(&self, lps: &[TokenLogprob]) -> Value {
        let text_of = self.text_of;
        let entry = |id: u32, lp: f32| {
            let t = text_of(id);
            json!({"id": id, "token": t, "logprob": finite(lp), "bytes": t.as_bytes()})
        };
        lps.iter()
            .map(|t| {
                let mut e = entry(t.id, t.logprob);
                e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                e
            })
            .collect()
    }

    /// Chat with tools: calls in the output become `tool_calls`; `forced`: the whole output
    /// is one call's JSON.
    pub fn with_tools(mut self, t: &Tools) -> Self {
        self.tools = Some((t.forced, Default::default()));
        self.tool_names = t
            .list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["function"]["name"].as_str().map(String::from))
            .collect();
        self
    }

    /// The calls in a whole chat answer and the content around them.
    fn calls(&self, text: &str) -> (Option<String>, Vec<crate::tools::ToolCall>) {
        match &self.tools {
            Some((true, _)) => (None, crate::tools::parse_call(text).into_iter().collect()),
            Some((false, _)) => crate::tools::split(text, &self.tool_names),
            None => (Some(text.to_string()), Vec::new()),
        }
    }

    /// OpenAI's `tool_calls` for `calls`, with ids from the answer's.
    fn calls_json(&self, calls: &[crate::tools::ToolCall], stream: bool) -> Value {
        let tail = self.id.rsplit('-').next().unwrap_or("0");
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| c.to_json(&format!("call_{tail}_{i}"), stream.then_some(i)))
            .collect()
    }

    /// A stream's closing chunks for the whole text `full`: with tools, the held-back
    /// content and the calls as `tool_calls` deltas, then the one carrying `finish`
    /// (`tool_calls` when there were calls) and the logprobs `lps` not sent yet.
    pub fn last_chunks(&mut self, full: &str, lps: &[TokenLogprob], finish: &str) -> Vec<Value> {
        let mut out = Vec::new();
        let mut finish = finish;
        if self.route == Route::Chat && self.tools.is_some() {
            let bare = crate::tools::bare_call(full, &self.tool_names).is_some();
            let rest = self
                .tools
                .as_mut()
                .map(|t| t.1.finish(bare))
                .unwrap_or_default();
            if !rest.is_empty() {
                out.push(self.chunk_json(
                    json!({"index": 0, "delta": {"content": rest}, "logprobs": null, "finish_reason": null}),
                ));
            }
            let (_, calls) = self.calls(full);
            if !calls.is_empty() {
                out.push(self.chunk_json(
                    json!({"index": 0, "delta": {"tool_calls": self.calls_json(&calls, true)}, "logprobs": null, "finish_reason": null}),
                ));
                if finish == "stop" {
                    finish = "tool_calls";
                }
            }
        }
        if self.llama.is_some() {
            out.push(self.llama_final("", full, lps));
            return out;
        }
        out.extend(self.chunk("", lps, Some(finish)));
        out
    }

    /// `chatcmpl-` or `cmpl-`.
    pub fn id_prefix(route: Route) -> &'static str {
        match route {
            Route::Chat => "chatcmpl-",
            Route::Completions | Route::Infill | Route::Completion => "cmpl-",
        }
    }

    fn logprobs_json(&mut self, lps: &[TokenLogprob]) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let text_of = self.text_of;
        match self.route {
            Route::Chat => {
                let entry = |id: u32, lp: f32| {
                    let t = text_of(id);
                    json!({"token": t, "logprob": finite(lp), "bytes": t.as_bytes()})
                };
                let content: Vec<Value> = lps
                    .iter()
                    .map(|t| {
                        let mut e = entry(t.id, t.logprob);
                        e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Route::Infill | Route::Completion => self.llama_probs(lps),
            Route::Completions => {
                let (mut tokens, mut lp, mut top, mut offs) = (vec![], vec![], vec![], vec![]);
                for t in lps {
                    let text = text_of(t.id);
                    offs.push(self.offset);
                    self.offset += text.chars().count();
                    tokens.push(text);
                    lp.push(finite(t.logprob));
                    let alts: Map<String, Value> = t
                        .top
                        .iter()
                        .map(|&(id, l)| (text_of(id), json!(finite(l))))
                        .collect();
                    top.push(alts);
                }
                json!({"tokens": tokens, "token_logprobs": lp, "top_logprobs": top, "text_offset": offs})
            }
        }
    }

    fn chunk_json(&self, choice: Value) -> Value {
        let object = match self.route {
            Route::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT, "choices": [choice]})
    }

    /// The stream's opening chunk: chat's role, or completions' echoed prompt.
    pub fn first_chunk(&self) -> Option<Value> {
        match (self.route, &self.echo) {
            // `content: null`, not "": no client is to see an empty piece of text.
            (Route::Chat, _) => Some(self.chunk_json(
                json!({"index": 0, "delta": {"role": "assistant", "content": null}, "logprobs": null, "finish_reason": null}),
            )),
            (_, Some(e)) => Some(self.chunk_json(
                json!({"index": 0, "text": e, "logprobs": null, "finish_reason": null}),
            )),
            _ => None,
        }
    }

    /// A chunk of text with the logprobs of the tokens behind it; with `finish`, the last.
    /// `None` when it would carry nothing (a chat piece whose text is held back, as a tool
    /// call's, with no logprobs): no `{"delta": {"content": ""}}` chunks.
    pub fn chunk(
        &mut self,
        text: &str,
        lps: &[TokenLogprob],
        finish: Option<&str>,
    ) -> Option<Value> {
        if self.llama.is_some() && finish.is_none() {
            let shown = if self.logprobs {
                Some(self.llama_probs(lps))
            } else {
                None
            };
            if text.is_empty() && lps.is_empty() {
                return None;
            }
            let ids: Vec<u32> = lps.iter().map(|t| t.id).collect();
            let mut v =
                json!({"index": 0, "content": text, "tokens": ids, "stop": false, "id_slot": -1});
            if let Some(p) = shown {
                v["completion_probabilities"] = p;
            }
            return Some(v);
        }
        let logprobs = self.logprobs_json(lps);
        let choice = match (self.route, finish) {
            (Route::Chat, None) => {
                let text = match self.tools.as_mut() {
                    Some((true, _)) => String::new(),
                    Some((false, f)) => f.push(text),
                    None => text.to_string(),
                };
                if text.is_empty() && logprobs.is_null() {
                    return None;
                }
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": null})
            }
            (Route::Chat, Some(f)) => {
                json!({"index": 0, "delta": {}, "logprobs": logprobs, "finish_reason": f})
            }
            (_, f) => json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": f}),
        };
        Some(self.chunk_json(choice))
    }

    /// The stream's usage chunk (no choices).
    pub fn usage_chunk(&self, usage: &Value) -> Value {
        let mut v = self.chunk_json(Value::Null);
        v["choices"] = json!([]);
        v["usage"] = usage.clone();
        v
    }

    /// The whole answer, not streamed. `stop_type` is llama-server's (`eos`, `word`,
    /// `limit`) for `/infill`.
    pub fn whole(
        &mut self,
        text: &str,
        lps: &[TokenLogprob],
        finish: &str,
        usage: &Value,
    ) -> Value {
        let logprobs = self.logprobs_json(lps);
        let head = json!({"id": self.id, "created": self.created, "model": self.model,
            "system_fingerprint": SYSTEM_FINGERPRINT, "usage": usage});
        let mut v = match self.route {
            Route::Chat => {
                let (content, calls) = self.calls(text);
                let mut message = json!({"role": "assistant", "content": content});
                let mut finish = finish;
                if !calls.is_empty() {
                    message["tool_calls"] = self.calls_json(&calls, false);
                    if finish == "stop" {
                        finish = "tool_calls";
                    }
                }
                json!({"object": "chat.completion",
                "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}]})
            }
            Route::Completions => {
                let full = format!("{}{text}", self.echo.as_deref().unwrap_or(""));
                json!({"object": "text_completion",
                    "choices": [{"index": 0, "text": full, "logprobs": logprobs, "finish_reason": finish}]})
            }
            Route::Infill | Route::Completion => {
                return self.llama_final(text, text, lps);
            }
        };
        for (k, x) in head.as_object().into_iter().flatten() {
            v[k] = x.clone();
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: Limits = Limits {
        default_max_tokens: 16,
        max_tokens_limit: 100,
        vocab: Some(1000),
        seed: None,
    };

    fn chat(v: Value) -> Result<Job, ApiError> {
        parse(Route::Chat, v.to_string().as_bytes(), &LIMITS)
    }

    fn completion(v: Value) -> Result<Job, ApiError> {
        parse(Route::Completions, v.to_string().as_bytes(), &LIMITS)
    }

    fn refused<T>(r: Result<T, ApiError>) -> (StatusCode, Option<&'static str>) {
        let e = r.err().expect("refused");
        (e.status, e.param)
    }

    #[test]
    fn a_plain_request_validates_with_openai_defaults() {
        let j =
            chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_eq!(j.prompt, PromptSpec::Chat(vec![Message::new("user", "hi")]));
        assert_eq!(
            (
                j.stream,
                j.max_tokens,
                j.sampling.temperature,
                j.sampling.top_p,
                j.logprobs
            ),
            (false, 16, 1.0, 1.0, None)
        );
        let j = chat(json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "stop": "x", "seed": 5, "temperature": 0,
            "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}))
        .unwrap();
        assert_eq!(
            j.prompt,
            PromptSpec::Chat(vec![Message::new("system", "ab")])
        );
        assert!(j.stream && j.include_usage);
        assert_eq!(
            (j.stops, j.sampling.seed, j.sampling.temperature),
            (vec!["x".to_string()], 5, 0.0)
        );
    }

    #[test]
    fn bad_requests_name_the_parameter() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let cases = [
            (json!({"model": "m"}), "messages"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}),
                "messages",
            ),
            (
                json!({"model": "m", "messages": hi, "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": hi, "max_tokens": 101}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": hi, "temperature": 3}),
                "temperature",
            ),
            (json!({"model": "m", "messages": hi, "top_p": 0}), "top_p"),
            (json!({"model": "m", "messages": hi, "n": 2}), "n"),
            (
                json!({"model": "m", "messages": hi, "stop": ["a", "b", "c", "d", "e"]}),
                "stop",
            ),
            (
                json!({"model": "m", "messages": hi, "presence_penalty": 2.5}),
                "presence_penalty",
            ),
            (
                json!({"model": "m", "messages": hi, "frequency_penalty": -3}),
                "frequency_penalty",
            ),
            (json!({"model": "m", "messages": hi, "min_p": 2}), "min_p"),
            (
                json!({"model": "m", "messages": hi, "logit_bias": {"x": 1}}),
                "logit_bias",
            ),
            (
                json!({"model": "m", "messages": hi, "logit_bias": {"1000": 1}}),
                "logit_bias",
            ),
            (
                json!({"model": "m", "messages": hi, "logit_bias": {"5": 101}}),
                "logit_bias",
            ),
            (
                json!({"model": "m", "messages": hi, "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                json!({"model": "m", "messages": hi, "logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(
                refused(chat(body.clone())),
                (StatusCode::BAD_REQUEST, Some(param)),
                "{body}"
            );
        }
        // Wrong types: a 400 too.
        assert_eq!(
            refused(chat(json!({"model": "m", "messages": "hi"}))).0,
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn a_request_without_model_is_served() {
        let j = chat(json!({"messages": [{"role": "user", "content": "hi"}]}));
        assert!(j.is_ok(), "{:?}", j.err());
        let j = completion(json!({"prompt": "a"}));
        assert!(j.is_ok(), "{:?}", j.err());
    }

    #[test]
    fn n_indent_cuts_at_the_first_line_indented_less() {
        // The first line continues the prompt's: never judged.
        assert_eq!(indent_cut("x = 1\n    y = 2\n", 4), None);
        assert_eq!(indent_cut("x\n    y\nz = 3\n", 4), Some(8));
        // Blank lines and lines whose first character has not come are not judged.
        assert_eq!(indent_cut("x\n\n   ", 4), None);
        assert_eq!(indent_cut("x\n\t\ty\n  }", 2), None);
        assert_eq!(indent_cut("x\n\t\ty\n }", 2), Some(6));
        assert_eq!(indent_cut("x\n}", 0), None);
    }

    #[test]
    fn llama_completion_prompts_and_infill_extra_validate() {
        let p = |v: Value| parse(Route::Completion, v.to_string().as_bytes(), &LIMITS);
        assert_eq!(
            p(json!({"prompt": [1, "a", 2]})).unwrap().prompt,
            PromptSpec::Mixed(vec![
                MixedPart::Ids(vec![1]),
                MixedPart::Text("a".into()),
                MixedPart::Ids(vec![2])
            ])
        );
        let j = p(json!({"prompt": [5, 6], "n_predict": -1, "n_probs": 3})).unwrap();
        assert_eq!(
            (j.prompt, j.max_tokens, j.logprobs),
            (PromptSpec::Ids(vec![5, 6]), 16, Some(3))
        );
        for bad in [json!([[1], [2]]), json!({}), json!([1.5]), json!([5000])] {
            assert_eq!(
                refused(p(json!({ "prompt": bad }))).1,
                Some("prompt"),
                "{bad}"
            );
        }
        let infill = |extra: Value| {
            parse(
                Route::Infill,
                json!({"input_prefix": "a", "input_extra": extra})
                    .to_string()
                    .as_bytes(),
                &LIMITS,
            )
        };
        match infill(json!([{"filename": "f.h", "text": "int x;"}, {"text": "y"}]))
            .unwrap()
            .prompt
        {
            PromptSpec::Fim { extra, .. } => assert_eq!(
                extra,
                vec![("f.h".into(), "int x;".into()), ("tmp".into(), "y".into())]
            ),
            p => panic!("{p:?}"),
        }
        for bad in [
            json!({}),
            json!({"filename": "ok"}),
            json!({"filename": 1, "text": "a"}),
            json!({"text": 4}),
        ] {
            assert_eq!(
                refused(infill(json!([bad]))).1,
                Some("input_extra"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_field_the_gateway_cannot_honour_is_refused_by_name() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        for (field, value) in [
            (
                "response_format",
                json!({"type": "grammar", "grammar": "x"}),
            ),
            ("tools", json!([{"type": "function"}])),
            ("tool_choice", json!("required")),
            ("functions", json!([{"name": "f"}])),
            ("audio", json!({"voice": "alloy", "format": "wav"})),
            ("modalities", json!(["text", "audio"])),
            ("prediction", json!({"type": "content", "content": "x"})),
            ("store", json!(true)),
            ("service_tier", json!("flex")),
            ("reasoning_effort", json!("low")),
            ("web_search_options", json!({})),
            ("grammar", json!("root ::= \"a\"")),
            ("typical_p", json!(0.5)),
            ("mirostat", json!(2)),
            ("ignore_eos", json!(true)),
            ("repetition_penalty", json!(1.3)),
            ("echo", json!(true)),
            ("suffix", json!("x")),
        ] {
            let mut body = json!({"model": "m", "messages": hi});
            body[field] = value.clone();
            let e = chat(body)
                .err()
                .unwrap_or_else(|| panic!("{field} = {value} accepted"));
            assert_eq!(
                (e.status, e.param, e.kind),
                (
                    StatusCode::BAD_REQUEST,
                    Some(field),
                    "invalid_request_error"
                ),
                "{field}"
            );
            assert!(e.message.contains(field), "{}", e.message);
        }
        // The values that ask for nothing pass, and so do keys no one defines.
        let j = chat(
            json!({"model": "m", "messages": hi, "tools": [], "tool_choice": "none",
            "response_format": {"type": "text"}, "n": 1, "store": false, "service_tier": "auto",
            "modalities": ["text"], "logprobs": false, "user": "u", "metadata": {"a": "b"},
            "parallel_tool_calls": true, "typical_p": 1.0, "cache_prompt": true, "x_vendor": 3}),
        );
        assert!(j.is_ok(), "{:?}", j.err());
    }

    #[test]
    fn structured_output_formats_become_one_schema() {
        let hi = json!([{"role": "user", "content": "hi"}]);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let f = |extra: Value| {
            let mut body = json!({"model": "m", "messages": hi});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            chat(body).map(|j| j.format)
        };
        assert_eq!(
            f(json!({"response_format": {"type": "json_object"}})).unwrap(),
            Some(("response_format", json!({"type": "object"})))
        );
        assert_eq!(
            f(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}}}))
                .unwrap(),
            Some(("response_format", schema.clone()))
        );
        assert_eq!(
            f(json!({"response_format": {"type": "text"}})).unwrap(),
            None
        );
        // llama-server's form: the schema inside json_object.
        assert_eq!(
            f(json!({"response_format": {"type": "json_object", "schema": schema}})).unwrap(),
            Some(("response_format", schema.clone()))
        );
        assert_eq!(
            refused(f(
                json!({"response_format": {"type": "json_object", "schema": 123}})
            )),
            (StatusCode::BAD_REQUEST, Some("response_format"))
        );
        assert_eq!(
            f(json!({"guided_json": schema})).unwrap(),
            Some(("guided_json", schema.clone()))
        );
        assert_eq!(
            f(json!({"json_schema": schema})).unwrap(),
            Some(("json_schema", schema.clone()))
        );
        for (extra, param) in [
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": "x"}}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_object"}, "guided_json": schema}),
                "guided_json",
            ),
            (json!({"json_schema": 3}), "json_schema"),
        ] {
            assert_eq!(
                refused(f(extra.clone())),
                (StatusCode::BAD_REQUEST, Some(param)),
                "{extra}"
            );
        }
        let j = completion(
            json!({"model": "m", "prompt": "a", "response_format": {"type": "json_object"}}),
        )
        .unwrap();
        assert_eq!(
            j.format,
            Some(("response_format", json!({"type": "object"})))
        );
    }

    #[test]
    fn sampling_fields_reach_the_sampler() {
        let j = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "logit_bias": {"7": -100, "9": 2.5}, "presence_penalty": 0.5, "frequency_penalty": -0.25,
            "min_p": 0.05, "seed": 42, "logprobs": true, "top_logprobs": 3}))
        .unwrap();
        let s = &j.sampling;
        assert_eq!(s.logit_bias, vec![(7, -100.0), (9, 2.5)]);
        assert_eq!(
            (s.presence_penalty, s.frequency_penalty, s.min_p, s.seed),
            (0.5, -0.25, 0.05, 42)
        );
        assert_eq!(j.logprobs, Some(3));
        let j = chat(json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": true}))
            .unwrap();
        assert_eq!(j.logprobs, Some(0));
    }

    #[test]
    fn completions_take_text_ids_and_arrays_of_one() {
        let p = |v: Value| completion(json!({"model": "m", "prompt": v})).map(|j| j.prompt);
        assert_eq!(p(json!("def f")).unwrap(), PromptSpec::Text("def f".into()));
        assert_eq!(
            p(json!(["def f"])).unwrap(),
            PromptSpec::Text("def f".into())
        );
        assert_eq!(p(json!([1, 2, 3])).unwrap(), PromptSpec::Ids(vec![1, 2, 3]));
        assert_eq!(p(json!([[4, 5]])).unwrap(), PromptSpec::Ids(vec![4, 5]));
        for bad in [
            json!(["a", "b"]),
            json!([[1], [2]]),
            json!([]),
            json!([1000]),
            json!([-1]),
        ] {
            assert_eq!(
                refused(p(bad.clone())),
                (StatusCode::BAD_REQUEST, Some("prompt")),
                "{bad}"
            );
        }
        let j =
            completion(json!({"model": "m", "prompt": "a", "suffix": "b", "logprobs": 2})).unwrap();
        assert_eq!(
            (j.prompt, j.logprobs),
            (
                PromptSpec::Fim {
                    prefix: "a".into(),
                    suffix: "b".into(),
                    middle: String::new(),
                    extra: vec![],
                },
                Some(2)
            )
        );
        for (body, param) in [
            (
                json!({"model": "m", "prompt": "a", "echo": true, "logprobs": 1}),
                "echo",
            ),
            (
                json!({"model": "m", "prompt": [1], "suffix": "b"}),
                "suffix",
            ),
            (
                json!({"model": "m", "prompt": "a", "logprobs": 21}),
                "logprobs",
            ),
            (
                json!({"model": "m", "prompt": "a", "best_of": 2}),
                "best_of",
            ),
            (json!({"model": "m"}), "prompt"),
        ] {
            assert_eq!(
                refused(completion(body.clone())),
                (StatusCode::BAD_REQUEST, Some(param)),
                "{body}"
            );
        }
    }

    #[test]
    fn infill_reads_llama_server_fields() {
        let j = parse(
            Route::Infill,
            json!({"input_prefix": "p", "input_suffix": "s", "prompt": "m", "n_predict": 7})
                .to_string()
                .as_bytes(),
            &LIMITS,
        )
        .unwrap();
        assert_eq!(
            (j.prompt, j.max_tokens),
            (
                PromptSpec::Fim {
                    prefix: "p".into(),
                    suffix: "s".into(),
                    middle: "m".into(),
                    extra: vec![],
                },
                7
            )
        );
    }
}
