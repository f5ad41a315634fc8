//! Tool calls in Hermes / Qwen2.5 form: the model's chat template renders the `tools` (in a
//! `<tools>` block of the system turn) and asks for calls as
//! `<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>`; this module turns such
//! output into OpenAI `tool_calls`, holds the call text back from a stream of content, and
//! builds the schema a forced call (`tool_choice: "required"` or a named function) is
//! decoded under. A small model (Qwen2.5-Coder-0.5B) often answers with the call's JSON
//! alone, without the tags: an answer that is exactly one `{"name", "arguments"}` object
//! naming one of the request's functions is taken as that call.

use serde_json::{json, Value};

/// The tag that opens a call in the output.
pub const OPEN: &str = "<tool_call>";
/// The tag that closes it.
pub const CLOSE: &str = "</tool_call>";

/// One function call the model made.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's `function.arguments` is a string).
    pub arguments: String,
}

impl ToolCall {
    /// The call as OpenAI's `tool_calls[i]` (with `index` for a streamed delta).
    pub fn to_json(&self, id: &str, index: Option<usize>) -> Value {
        let mut v = json!({"id": id, "type": "function",
            "function": {"name": self.name, "arguments": self.arguments}});
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }
}

/// Reads one call's JSON body (`{"name": ..., "arguments": {...}}`); `None` when it is not
/// one.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments") {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// The call an answer is when it is nothing but one call's JSON naming one of `names`.
pub fn bare_call(text: &str, names: &[String]) -> Option<ToolCall> {
    let t = text.trim();
    if !t.starts_with('{') {
        return None;
    }
    parse_call(t).filter(|c| names.contains(&c.name))
}

/// Splits a whole answer into its content (text outside the calls, trimmed; `None` when
/// empty) and its calls. A block that does not hold a call stays content; an unclosed last
/// block (the answer was cut) is a call when its body parses; an answer that is only a
/// call's JSON naming one of `names` is that call ([`bare_call`]).
pub fn split(text: &str, names: &[String]) -> (Option<String>, Vec<ToolCall>) {
    if let Some(c) = bare_call(text, names) {
        return (None, vec![c]);
    }
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(OPEN) {
        let after = &rest[open + OPEN.len()..];
        let (body, next) = match after.find(CLOSE) {
            Some(c) => (&after[..c], &after[c + CLOSE.len()..]),
            None => (after, ""),
        };
        match parse_call(body) {
            Some(c) => {
                content.push_str(&rest[..open]);
                calls.push(c);
            }
            None => content.push_str(&rest[..open + OPEN.len() + body.len()]),
        }
        rest = next;
    }
    content.push_str(rest);
    let content = content.trim();
    ((!content.is_empty()).then(|| content.to_string()), calls)
}

/// Streams content while holding back everything from the first `<tool_call>` on (and any
/// tail that may be the start of one), so a client sees the calls only as `tool_calls`; an
/// answer that opens with `{` is held whole (it may be a bare call, [`bare_call`]).
#[derive(Debug, Default)]
pub struct CallFilter {
    /// Text not yet released: a possible prefix of [`OPEN`], or a possible bare call.
    pending: String,
    /// A call has started: nothing more is content.
    held: bool,
    /// The answer opened with `{`: held until the end.
    bare: bool,
    /// Some content was released (a bare call is no longer possible).
    released: bool,
}

impl CallFilter {
    /// The part of `text` that is safe to stream as content now.
    pub fn push(&mut self, text: &str) -> String {
        if self.held {
            return String::new();
        }
        self.pending.push_str(text);
        if !self.released && !self.bare {
            match self.pending.trim_start().chars().next() {
                None => return String::new(),
                Some('{') => self.bare = true,
                Some(_) => {}
            }
        }
        if self.bare {
            return String::new();
        }
        if let Some(i) = self.pending.find(OPEN) {
            self.held = true;
            let out = self.pending[..i].to_string();
            self.pending.clear();
            return out;
        }
        // Keep the longest tail that is a proper prefix of OPEN.
        let keep = (1..OPEN.len())
            .rev()
            .find(|&k| {
                self.pending.len() >= k
                    && self.pending.is_char_boundary(self.pending.len() - k)
                    && OPEN.starts_with(&self.pending[self.pending.len() - k..])
            })
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        self.released |= !out.is_empty();
        out
    }

    /// What is left at the end: a held-back tail that turned out not to open a call, or a
    /// held answer that is not a bare call (`bare_call`: it was one).
    pub fn finish(&mut self, bare_call: bool) -> String {
        if self.held || (self.bare && bare_call) {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }
}

/// The schema of one call to any of `functions` (`{"name", "parameters"}` objects): what
/// a forced call is decoded under, in the body of a `<tool_call>` block.
pub fn call_schema(functions: &[&Value]) -> Value {
    let one = |f: &Value| {
        let params = f
            .get("parameters")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        json!({"type": "object", "properties": {"name": {"const": f.get("name").cloned().unwrap_or(Value::Null)},
            "arguments": params}, "required": ["name", "arguments"], "additionalProperties": false})
    };
    match functions {
        [f] => one(f),
        fs => json!({"anyOf": fs.iter().map(|f| one(f)).collect::<Vec<_>>()}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_split_from_content() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let names = ["get_weather".to_string(), "now".to_string()];
        let (content, calls) = split(text, &names);
        assert_eq!(content.as_deref(), Some("Let me look."));
        assert_eq!(
            calls,
            vec![
                ToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\":\"Paris\"}".into()
                },
                ToolCall {
                    name: "now".into(),
                    arguments: "{}".into()
                }
            ]
        );
        assert_eq!(split("plain", &names), (Some("plain".into()), vec![]));
        // A bare call naming a known function; not one naming another.
        let bare = "{\"name\": \"now\", \"arguments\": {}}";
        assert_eq!(split(bare, &names).1[0].name, "now");
        assert_eq!(split(&bare.replace("now", "other"), &names).1, vec![]);
        // Not a call: stays content.
        assert_eq!(
            split("a <tool_call>oops</tool_call>", &names).1,
            Vec::<ToolCall>::new()
        );
        // Cut before the closing tag.
        assert_eq!(
            split(
                "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
                &names
            )
            .1[0]
                .name,
            "f"
        );
    }

    #[test]
    fn the_filter_holds_back_calls_and_partial_tags() {
        let mut f = CallFilter::default();
        let mut out = String::new();
        for piece in [
            "Sure",
            ". <",
            "tool",
            "_call>\n{\"name\"",
            ": \"f\"}",
            "</tool_call>",
        ] {
            out.push_str(&f.push(piece));
        }
        out.push_str(&f.finish(false));
        assert_eq!(out, "Sure. ");
        let mut f = CallFilter::default();
        let mut out = f.push("a <b");
        out.push_str(&f.push("> c <tool"));
        out.push_str(&f.finish(false));
        assert_eq!(out, "a <b> c <tool");
        // An answer opening with `{` is held: released when it is not a call.
        let mut f = CallFilter::default();
        assert_eq!(f.push(" {\"a\""), "");
        assert_eq!(f.push(": 1}"), "");
        assert_eq!(f.finish(false), " {\"a\": 1}");
        let mut f = CallFilter::default();
        f.push("{\"name\": \"now\"}");
        assert_eq!(f.finish(true), "");
    }

    #[test]
    fn a_forced_call_schema_names_the_functions() {
        let f = json!({"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}});
        let g = json!({"name": "g"});
        let s = call_schema(&[&f]);
        assert_eq!(s["properties"]["name"]["const"], "f");
        assert_eq!(
            s["properties"]["arguments"]["properties"]["x"]["type"],
            "integer"
        );
        let s = call_schema(&[&f, &g]);
        assert_eq!(
            s["anyOf"][1]["properties"]["arguments"],
            json!({"type": "object"})
        );
    }
}
