//! `moonshine serve`'s llama-server surface on the real Qwen2.5-Coder model (issue 38): its
//! own routes (`/completion`, `/tokenize`, `/detokenize`, `/apply-template`, `/props`,
//! `/slots`, `/infill` with `input_extra` and `n_indent`), the OpenAI routes without `/v1`
//! and without `model`, and what llama.cpp's server tests found wrong, one regression each.

mod support;

use serde_json::{json, Value};
use support::*;

fn gateway(station: &str, extra: &[&str]) -> Proc {
    let mut a = vec!["serve", "--station", station];
    a.extend_from_slice(extra);
    spawn_listening(std::path::Path::new(env!("CARGO_BIN_EXE_moonshine")), &a)
}

/// The status and the JSON body (an error status included).
fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let r = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport: {e}"),
    };
    let s = r.status();
    let text = r.into_string().expect("body");
    (
        s,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")),
    )
}

fn post(url: &str, body: &Value) -> (u16, Value) {
    answer(ureq::post(url).send_string(&body.to_string()))
}

fn get(url: &str) -> (u16, Value) {
    answer(ureq::get(url).call())
}

/// A streamed answer's events (`data: JSON` lines), and whether it ended with `[DONE]`.
fn events(url: &str, body: &Value) -> (Vec<Value>, bool) {
    let r = ureq::post(url)
        .send_string(&body.to_string())
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let text = r.into_string().expect("body");
    let mut out = Vec::new();
    let mut done = false;
    for line in text.lines() {
        match line.strip_prefix("data: ") {
            Some("[DONE]") => done = true,
            Some(j) => out.push(serde_json::from_str(j).unwrap_or_else(|e| panic!("{e}: {j}"))),
            None => {}
        }
    }
    (out, done)
}

#[test]
fn openai_routes_answer_without_v1_and_without_model_with_cached_tokens() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &["--max-concurrent", "1"]);
    let url = |p: &str| format!("{}{p}", gw.url);

    // No `/v1`, no `model`: the served model answers (was 404, then 400 `model`).
    let chat = json!({"max_tokens": 4, "temperature": 0,
        "messages": [{"role": "system", "content": "You are a terse assistant who answers in one word."},
                     {"role": "user", "content": "Name the capital of France."}]});
    let (s, first) = post(&url("/chat/completions"), &chat);
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["model"], "qwen2.5-coder-0.5b-instruct", "{first}");
    assert!(
        first["system_fingerprint"]
            .as_str()
            .is_some_and(|f| f.starts_with('b')),
        "{first}"
    );
    // The same conversation again: its prompt is the session's cached prefix.
    let (s, again) = post(&url("/v1/chat/completions"), &chat);
    assert_eq!(s, 200, "{again}");
    let prompt = again["usage"]["prompt_tokens"]
        .as_u64()
        .expect("prompt_tokens");
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert_eq!(cached(&first), Some(0), "{first}");
    let reused = cached(&again).expect("cached_tokens");
    assert!(reused >= prompt / 2 && reused < prompt, "{again}");

    let (s, c) = post(
        &url("/completions"),
        &json!({"prompt": "def add(a, b):", "max_tokens": 3}),
    );
    assert_eq!(
        (s, c["object"].as_str()),
        (200, Some("text_completion")),
        "{c}"
    );
    let (s, m) = get(&url("/models"));
    assert_eq!(
        (s, m["data"][0]["id"].as_str()),
        (200, Some("qwen2.5-coder-0.5b-instruct"))
    );

    // A preflight from the OpenAI JS SDK: its x-stainless-* headers are allowed back.
    let gw2 = gateway(&st.url, &["--allowed-origins", "https://app.example"]);
    let r = ureq::request("OPTIONS", &format!("{}/v1/chat/completions", gw2.url))
        .set("Origin", "https://app.example")
        .set("Access-Control-Request-Method", "POST")
        .set(
            "Access-Control-Request-Headers",
            "authorization, content-type, x-stainless-os, x-stainless-retry-count",
        )
        .call()
        .expect("preflight");
    assert_eq!(r.status(), 200);
    let allowed = r.header("access-control-allow-headers").unwrap_or("");
    assert!(
        allowed.contains("x-stainless-os") && allowed.contains("x-stainless-retry-count"),
        "{allowed}"
    );
}

#[test]
fn llama_server_tokenize_detokenize_template_props_and_slots() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &["--max-concurrent", "2"]);
    let url = |p: &str| format!("{}{p}", gw.url);

    let text = "Hello world, 媽 and 🤗";
    let (s, t) = post(&url("/tokenize"), &json!({ "content": text }));
    assert_eq!(s, 200, "{t}");
    let ids = t["tokens"].as_array().expect("tokens").clone();
    assert!(ids.len() > 4 && ids.iter().all(Value::is_u64), "{t}");
    let (s, d) = post(&url("/detokenize"), &json!({ "tokens": ids }));
    assert_eq!((s, d["content"].as_str()), (200, Some(text)), "{d}");
    // Pieces: each a string, or the bytes of part of a character.
    let (s, p) = post(
        &url("/tokenize"),
        &json!({"content": text, "with_pieces": true}),
    );
    assert_eq!(s, 200, "{p}");
    let pieces = p["tokens"].as_array().expect("tokens");
    assert_eq!(pieces.len(), ids.len());
    let mut bytes = Vec::new();
    for (piece, id) in pieces.iter().zip(&ids) {
        assert_eq!(&piece["id"], id);
        match &piece["piece"] {
            Value::String(s) => bytes.extend(s.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|x| x.as_u64().expect("byte") as u8)),
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).expect("utf-8"), text);
    // Special-token text is parsed unless asked not to.
    let one = |parse: bool| {
        let (_, v) = post(
            &url("/tokenize"),
            &json!({"content": "<|im_start|>", "parse_special": parse}),
        );
        v["tokens"].as_array().map(Vec::len)
    };
    assert_eq!(one(true), Some(1));
    assert!(one(false).is_some_and(|n| n > 1));
    let (s, e) = post(&url("/detokenize"), &json!({"tokens": [1, 99999999]}));
    assert_eq!(
        (s, e["error"]["param"].as_str()),
        (400, Some("tokens")),
        "{e}"
    );

    let (s, a) = post(
        &url("/apply-template"),
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(s, 200, "{a}");
    let prompt = a["prompt"].as_str().expect("prompt");
    assert!(
        prompt.contains("<|im_start|>user\nhi<|im_end|>")
            && prompt.ends_with("<|im_start|>assistant\n"),
        "{prompt}"
    );

    let (s, props) = get(&url("/props"));
    assert_eq!(s, 200, "{props}");
    assert_eq!(props["total_slots"], 2, "{props}");
    assert!(props["default_generation_settings"]["n_ctx"].as_u64() > Some(0));
    assert!(props["chat_template"]
        .as_str()
        .is_some_and(|t| t.contains("im_start")));
    let (s, slots) = get(&url("/slots"));
    assert_eq!(s, 200, "{slots}");
    let slots = slots.as_array().expect("a list");
    assert_eq!(slots.len(), 2);
    assert!(slots.iter().all(|s| s["is_processing"] == false));
    let quiet = gateway(&st.url, &["--no-slots"]);
    assert_eq!(get(&format!("{}/slots", quiet.url)).0, 501);
}

#[test]
fn llama_server_completion_whole_streamed_and_mixed_prompts() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &[]);
    let url = format!("{}/completion", gw.url);
    let body = json!({"prompt": "def fibonacci(n):", "n_predict": 6, "temperature": 0,
        "return_tokens": true, "n_probs": 2});
    let (s, whole) = post(&url, &body);
    assert_eq!(s, 200, "{whole}");
    let content = whole["content"].as_str().expect("content");
    assert!(!content.is_empty());
    assert_eq!(
        (
            whole["stop"].as_bool(),
            whole["stop_type"].as_str(),
            whole["timings"]["predicted_n"].as_u64()
        ),
        (Some(true), Some("limit"), Some(6)),
        "{whole}"
    );
    assert_eq!(whole["tokens"].as_array().map(Vec::len), Some(6));
    assert_eq!(whole["generation_settings"]["n_predict"], 6);
    let probs = whole["completion_probabilities"].as_array().expect("probs");
    assert_eq!(probs.len(), 6);
    for p in probs {
        assert!(p["logprob"].as_f64() <= Some(0.0), "{p}");
        assert_eq!(p["top_logprobs"].as_array().map(Vec::len), Some(2), "{p}");
    }

    // Streamed: llama-server's events (`stop` false with the piece's ids, then one `stop`
    // true with the timings), no `[DONE]`; the same text as the whole answer.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (evs, done) = events(&url, &streamed);
    assert!(
        !done,
        "llama-server's /completion stream ends without [DONE]"
    );
    let (last, pieces) = evs.split_last().expect("events");
    let mut text = String::new();
    for e in pieces {
        assert_eq!(e["stop"], false, "{e}");
        assert!(e["tokens"].as_array().is_some_and(|t| !t.is_empty()), "{e}");
        text.push_str(e["content"].as_str().expect("content"));
    }
    assert_eq!(text, content);
    assert_eq!(
        (last["stop"].as_bool(), last["stop_type"].as_str()),
        (Some(true), Some("limit")),
        "{last}"
    );
    assert_eq!(last["timings"]["predicted_n"], 6, "{last}");

    // Token ids, and ids mixed with text, are prompts too.
    let (_, t) = post(
        &format!("{}/tokenize", gw.url),
        &json!({"content": "def fibonacci(n):"}),
    );
    let (s, by_ids) = post(
        &url,
        &json!({"prompt": t["tokens"], "n_predict": 6, "temperature": 0}),
    );
    assert_eq!(
        (s, by_ids["content"].as_str()),
        (200, Some(content)),
        "{by_ids}"
    );
    let mut mixed: Vec<Value> = t["tokens"].as_array().expect("ids").clone();
    mixed.push(json!("\n"));
    let (s, m) = post(&url, &json!({"prompt": mixed, "n_predict": 2}));
    assert_eq!(s, 200, "{m}");
    let (s, e) = post(&url, &json!({"prompt": [[1, 2], [3, 4]]}));
    assert_eq!(
        (s, e["error"]["param"].as_str()),
        (400, Some("prompt")),
        "{e}"
    );
}

#[test]
fn infill_takes_input_extra_and_n_indent() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &[]);
    let url = format!("{}/infill", gw.url);
    let base = json!({"input_prefix": "#include \"mathx.h\"\n\nint main() {\n",
        "prompt": "    int r = mathx_", "input_suffix": "}\n", "n_predict": 12, "temperature": 0});
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    // Another file of the project goes into the prompt and steers the completion to it.
    let (s, alone) = post(&url, &base);
    assert_eq!(s, 200, "{alone}");
    let extra =
        json!([{"filename": "mathx.h", "text": "int mathx_triple_sum(int a, int b, int c);\n"}]);
    let (s, v) = post(&url, &with("input_extra", extra));
    assert_eq!(s, 200, "{v}");
    let n = |v: &Value| v["tokens_evaluated"].as_u64().expect("tokens_evaluated");
    assert!(n(&v) >= n(&alone) + 15, "{alone} {v}");
    let content = v["content"].as_str().expect("content");
    assert!(content.contains("sum("), "{content}");
    for bad in [
        json!({}),
        json!({"filename": "ok"}),
        json!({"filename": 123, "text": "abc"}),
        json!({"text": 456}),
    ] {
        let (s, e) = post(&url, &with("input_extra", json!([bad])));
        assert_eq!(
            (s, e["error"]["param"].as_str()),
            (400, Some("input_extra")),
            "{bad}: {e}"
        );
    }
    // n_indent: no line after the first starts less indented than asked.
    let (s, v) = post(
        &url,
        &json!({"input_prefix": "def total(xs):\n", "prompt": "    s = 0\n",
            "input_suffix": "\n\nprint(total([1, 2]))\n", "n_predict": 40, "temperature": 0, "n_indent": 4}),
    );
    assert_eq!(s, 200, "{v}");
    let content = v["content"].as_str().expect("content");
    for line in content.split('\n').skip(1) {
        let indent = line.chars().take_while(|c| *c == ' ' || *c == '\t').count();
        assert!(line.trim().is_empty() || indent >= 4, "{content:?}");
    }
}

#[test]
fn json_object_schema_is_honoured_and_tool_streams_carry_no_empty_content() {
    let Some((knot, bin)) = setup() else { return };
    let st = station(&bin, &knot, &[]);
    let gw = gateway(&st.url, &[]);
    let url = format!("{}/v1/chat/completions", gw.url);
    let ask = |rf: Value| {
        post(
            &url,
            &json!({"max_tokens": 8, "temperature": 0, "response_format": rf,
                "messages": [{"role": "user", "content": "Write an example"}]}),
        )
    };
    // llama-server's form: the schema inside json_object (was ignored: any object passed).
    let (s, v) = ask(json!({"type": "json_object", "schema": {"const": "42"}}));
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "\"42\"", "{v}");
    for schema in [json!(123), json!("x")] {
        let (s, e) = ask(json!({"type": "json_object", "schema": schema}));
        assert_eq!(
            (s, e["error"]["param"].as_str()),
            (400, Some("response_format")),
            "{e}"
        );
    }

    // A streamed forced tool call: no `{"delta": {"content": ""}}` chunks (there were one
    // per token of the call); the role chunk's content is null.
    let (evs, done) = events(
        &url,
        &json!({"max_tokens": 40, "temperature": 0, "stream": true, "tool_choice": "required",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}),
    );
    assert!(done);
    let first = &evs[0]["choices"][0]["delta"];
    assert_eq!(
        (first["role"].as_str(), first.get("content")),
        (Some("assistant"), Some(&Value::Null)),
        "{first}"
    );
    for e in &evs[1..] {
        if let Some(c) = e["choices"][0]["delta"].get("content") {
            assert!(c.as_str().is_some_and(|c| !c.is_empty()), "{e}");
        }
    }
    let calls: Vec<&Value> = evs
        .iter()
        .filter(|e| e["choices"][0]["delta"].get("tool_calls").is_some())
        .collect();
    assert_eq!(calls.len(), 1, "{evs:?}");
    assert_eq!(
        calls[0]["choices"][0]["delta"]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
}
