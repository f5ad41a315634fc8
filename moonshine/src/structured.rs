//! Structured output by constrained decoding: `response_format` `json_object` and
//! `json_schema` (and llama-server's `json_schema`, vLLM's `guided_json`).
//!
//! At every decoding step a token mask, computed from the schema's grammar over the model's
//! vocabulary, sets the logits of the tokens that cannot continue a valid document to -inf
//! before the sampler sees them, so whatever the sampler picks keeps the output a prefix of a
//! document that parses and matches the schema. End-of-generation tokens are allowed only
//! where the document is complete; where nothing but the end can follow, they are all that
//! is left. The engine is llguidance (the one llama.cpp and vLLM use): it compiles a JSON
//! schema to a grammar and computes the mask with a walk over a byte trie of the vocabulary
//! (built once per gateway from the station's `/vocab`), not one parse per token.
//!
//! Output is compact: `", "` between items, `": "` after keys, no other whitespace (a small
//! model given free whitespace may spend its tokens on newlines). A schema keyword the engine
//! does not implement is refused, naming it ([`Vocab::grammar`]).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

/// Why a grammar could not be built or followed.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The vocabulary is unusable (empty, or end-of-generation ids outside it).
    #[error("vocabulary: {0}")]
    Vocab(String),
    /// The schema does not compile (an unimplemented keyword, a malformed value, ...).
    #[error("{0}")]
    Schema(String),
    /// The matcher failed while decoding (a token it had allowed was refused).
    #[error("constrained decoding: {0}")]
    Decode(String),
}

/// One token of the vocabulary: its bytes, and whether it is a control token (which no
/// grammar produces).
#[derive(Clone, Debug)]
pub struct VocabToken {
    pub special: bool,
    pub bytes: Vec<u8>,
}

/// The model's vocabulary as llguidance needs it: a trie of every token's bytes and the
/// parser factory over it. Built once, shared by every constrained generation.
pub struct Vocab {
    factory: ParserFactory,
    /// Ids that end generation (sorted).
    eog: Arc<Vec<u32>>,
}

impl Vocab {
    /// Builds the trie from `tokens` (id order) and `eog`, the ids that end generation.
    pub fn new(tokens: &[VocabToken], eog: &[u32]) -> Result<Vocab, GrammarError> {
        let n = tokens.len();
        let mut eog: Vec<u32> = eog.to_vec();
        eog.sort_unstable();
        eog.dedup();
        if n == 0 || eog.is_empty() || eog.iter().any(|&e| e as usize >= n) {
            return Err(GrammarError::Vocab(format!(
                "{n} tokens, end-of-generation ids {eog:?}"
            )));
        }
        // toktrie's convention: a special token is 0xFF followed by its name, so no
        // grammar over text reaches it.
        let words: Vec<Vec<u8>> = tokens
            .iter()
            .map(|t| match t.special {
                true => [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &t.bytes].concat(),
                false => t.bytes.clone(),
            })
            .collect();
        let info = TokRxInfo::new(n as u32, eog[0]);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocab(e.to_string()))?;
        factory.quiet();
        // Errors name the problem, never dump the grammar and parser state to the client.
        factory.limits_mut().verbose_errors = false;
        Ok(Vocab {
            factory,
            eog: Arc::new(eog),
        })
    }

    /// The vocabulary's size.
    pub fn len(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// Whether the vocabulary is empty (never, once built).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A fresh grammar state for documents matching `schema` (a JSON schema; `json_object`
    /// is `{"type": "object"}`), or why the schema is refused: over the bounds of
    /// [`check_schema`], or not compiling (a `$ref` cycle that never produces a character
    /// included: the first mask is computed here, so it fails now and not while decoding).
    /// llguidance compiles recursively, so the compilation runs on its own thread with a
    /// [`COMPILE_STACK`] stack, not on the caller's.
    pub fn grammar(&self, schema: &Value) -> Result<Grammar, GrammarError> {
        check_schema(schema)?;
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("schema-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || self.compile(schema))
                .map_err(|e| GrammarError::Schema(format!("cannot start its compiler: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(GrammarError::Schema("the compiler failed".into())))
        })
    }

    fn compile(&self, schema: &Value) -> Result<Grammar, GrammarError> {
        let mut schema = schema.clone();
        if let Some(m) = schema.as_object_mut() {
            m.entry("x-guidance").or_insert_with(|| {
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
            });
        }
        let parser = self
            .factory
            .create_parser(TopLevelGrammar::from_json_schema(schema))
            .map_err(|e| GrammarError::Schema(short(&e.to_string())))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Schema(short(&e)));
        }
        // The first mask walks the grammar from its start: a schema that cannot produce a
        // document fails here.
        let first = matcher
            .compute_mask()
            .map_err(|e| GrammarError::Schema(short(&e.to_string())))?;
        let accepting = matcher.is_accepting().unwrap_or(false);
        if first.is_zero() && !accepting {
            // `{"$ref": "#"}` and its kin: rules that only refer to each other.
            return Err(GrammarError::Schema(
                "the schema admits no document (a $ref cycle that never reaches a value?)".into(),
            ));
        }
        Ok(Grammar {
            matcher,
            eog: self.eog.clone(),
            done: false,
        })
    }
}

/// Largest schema, in bytes of its JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 << 10;
/// Deepest nesting of objects and arrays in a schema.
pub const MAX_SCHEMA_DEPTH: usize = 32;
/// Most values (objects, arrays, strings, numbers...) in a schema: bounds the properties,
/// `required` names and alternatives all together.
pub const MAX_SCHEMA_NODES: usize = 4096;
/// Stack of the thread that compiles a schema (reserved address space, touched only as
/// deep as the compilation recurses).
const COMPILE_STACK: usize = 64 << 20;
/// Longest error message a schema's refusal carries.
const MAX_MESSAGE: usize = 300;

/// Checks `schema` against [`MAX_SCHEMA_BYTES`], [`MAX_SCHEMA_DEPTH`] and
/// [`MAX_SCHEMA_NODES`] with a walk that keeps its own stack (a deep schema cannot overflow
/// the caller's).
pub fn check_schema(schema: &Value) -> Result<(), GrammarError> {
    let bytes = serde_json::to_vec(schema).map_or(usize::MAX, |v| v.len());
    if bytes > MAX_SCHEMA_BYTES {
        return Err(GrammarError::Schema(format!(
            "the schema is {bytes} bytes; at most {MAX_SCHEMA_BYTES} are accepted"
        )));
    }
    let mut stack = vec![(schema, 1usize)];
    let mut nodes = 0usize;
    while let Some((v, depth)) = stack.pop() {
        nodes += 1;
        if nodes > MAX_SCHEMA_NODES {
            return Err(GrammarError::Schema(format!(
                "the schema has more than {MAX_SCHEMA_NODES} values"
            )));
        }
        if depth > MAX_SCHEMA_DEPTH {
            return Err(GrammarError::Schema(format!(
                "the schema nests deeper than {MAX_SCHEMA_DEPTH} levels"
            )));
        }
        match v {
            Value::Object(m) => stack.extend(m.values().map(|c| (c, depth + 1))),
            Value::Array(a) => stack.extend(a.iter().map(|c| (c, depth + 1))),
            _ => {}
        }
    }
    Ok(())
}

/// The first line of an engine error, cut to [`MAX_MESSAGE`] characters.
fn short(e: &str) -> String {
    let line = e.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(MAX_MESSAGE) {
        Some((i, _)) => format!("{}...", &line[..i]),
        None => line.to_string(),
    }
}

/// One generation's place in its grammar.
#[derive(Clone)]
pub struct Grammar {
    matcher: Matcher,
    eog: Arc<Vec<u32>>,
    /// The document is complete and nothing may follow it.
    done: bool,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("done", &self.done).finish()
    }
}

impl Grammar {
    /// Sets the logit of every token that cannot come next to -inf. End-of-generation ids
    /// stay only where the document is complete.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let accepting = self.done
            || self.matcher.is_stopped()
            || self
                .matcher
                .is_accepting()
                .map_err(|e| GrammarError::Decode(e.to_string()))?;
        if self.done || self.matcher.is_stopped() {
            for (i, l) in logits.iter_mut().enumerate() {
                if self.eog.binary_search(&(i as u32)).is_err() {
                    *l = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        }
        let allowed = self
            .matcher
            .compute_mask()
            .map_err(|e| GrammarError::Decode(e.to_string()))?;
        for (i, l) in logits.iter_mut().enumerate() {
            let ok = if self.eog.binary_search(&(i as u32)).is_ok() {
                accepting
            } else {
                allowed.is_allowed(i as u32)
            };
            if !ok {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past `id`, a token the last [`Grammar::mask`] allowed (an end-of-generation
    /// id ends the document).
    pub fn consume(&mut self, id: u32) -> Result<(), GrammarError> {
        if self.eog.binary_search(&id).is_ok() {
            self.done = true;
            return Ok(());
        }
        self.matcher
            .consume_token(id)
            .map_err(|e| GrammarError::Decode(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny vocabulary: single bytes for JSON's punctuation, digits and a few letters,
    /// some multi-byte words, a control token and an end-of-generation token.
    fn vocab() -> (Vocab, Vec<String>) {
        let mut words: Vec<String> = "{}[]\":, -.0123456789abcdefghijklmnopqrstuvwxyz\\\n"
            .chars()
            .map(String::from)
            .collect();
        for w in [
            "\"name\"", "\"age\"", ": ", ", ", "true", "false", "null", "{\"", "\":", "\"}", "Bob",
            "\\n", "\\\"", "é",
        ] {
            words.push(w.to_string());
        }
        let mut tokens: Vec<VocabToken> = words
            .iter()
            .map(|w| VocabToken {
                special: false,
                bytes: w.as_bytes().to_vec(),
            })
            .collect();
        words.push("<|ctl|>".into());
        tokens.push(VocabToken {
            special: true,
            bytes: b"<|ctl|>".to_vec(),
        });
        words.push("<|end|>".into());
        tokens.push(VocabToken {
            special: true,
            bytes: b"<|end|>".to_vec(),
        });
        let eog = (tokens.len() - 1) as u32;
        (Vocab::new(&tokens, &[eog]).unwrap(), words)
    }

    fn id(words: &[String], w: &str) -> u32 {
        words.iter().position(|x| x == w).expect(w) as u32
    }

    /// Tokens the grammar allows now, as text.
    fn allowed(g: &mut Grammar, words: &[String]) -> Vec<String> {
        let mut logits = vec![0.0; words.len()];
        g.mask(&mut logits).unwrap();
        (0..words.len())
            .filter(|&i| logits[i].is_finite())
            .map(|i| words[i].clone())
            .collect()
    }

    /// Greedy decoding where the "model" prefers `wanted` tokens in order; returns the text.
    fn follow(g: &mut Grammar, words: &[String], script: &[&str]) -> String {
        let mut out = String::new();
        for w in script {
            let a = allowed(g, words);
            assert!(
                a.contains(&w.to_string()),
                "{w:?} not allowed after {out:?}: {a:?}"
            );
            g.consume(id(words, w)).unwrap();
            if *w != "<|end|>" {
                out.push_str(w);
            }
        }
        out
    }

    #[test]
    fn an_object_schema_forces_its_keys_and_types() {
        let (v, words) = vocab();
        let schema = json!({"type": "object", "properties": {"name": {"type": "string"},
            "age": {"type": "integer"}}, "required": ["name", "age"], "additionalProperties": false});
        let mut g = v.grammar(&schema).unwrap();
        let a = allowed(&mut g, &words);
        assert!(
            a.contains(&"{".to_string()) && !a.contains(&"[".to_string()),
            "{a:?}"
        );
        assert!(
            !a.contains(&"<|end|>".to_string()),
            "end before the document"
        );
        assert!(
            !a.contains(&"<|ctl|>".to_string()),
            "a control token is never text"
        );
        let text = follow(
            &mut g,
            &words,
            &[
                "{", "\"name\"", ": ", "\"", "Bob", "\\\"", "\"", ", ", "\"age\"", ": ", "4", "2",
                "}", "<|end|>",
            ],
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v, json!({"name": "Bob\"", "age": 42}));
    }

    #[test]
    fn a_number_field_refuses_letters_and_the_end_waits_for_the_closing_brace() {
        let (v, words) = vocab();
        let schema = json!({"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]});
        let mut g = v.grammar(&schema).unwrap();
        follow(&mut g, &words, &["{", "\"age\"", ": "]);
        let a = allowed(&mut g, &words);
        assert!(a.contains(&"7".to_string()) && a.contains(&"-".to_string()));
        assert!(
            !a.contains(&"a".to_string()) && !a.contains(&"\"".to_string()),
            "{a:?}"
        );
        follow(&mut g, &words, &["7"]);
        assert!(!allowed(&mut g, &words).contains(&"<|end|>".to_string()));
        follow(&mut g, &words, &["}"]);
        // Complete: only the end is left.
        assert_eq!(allowed(&mut g, &words), vec!["<|end|>".to_string()]);
    }

    #[test]
    fn enums_arrays_and_any_object() {
        let (v, words) = vocab();
        let mut g = v.grammar(&json!({"enum": ["ab", "c"]})).unwrap();
        follow(&mut g, &words, &["\""]);
        let a = allowed(&mut g, &words);
        assert!(a.contains(&"a".to_string()) && a.contains(&"c".to_string()));
        assert!(!a.contains(&"b".to_string()), "{a:?}");
        let mut g = v
            .grammar(&json!({"type": "array", "items": {"type": "boolean"}, "minItems": 1}))
            .unwrap();
        let t = follow(
            &mut g,
            &words,
            &["[", "true", ", ", "false", "]", "<|end|>"],
        );
        assert_eq!(
            serde_json::from_str::<Value>(&t).unwrap(),
            json!([true, false])
        );
        // json_object: any object, nothing else.
        let mut g = v.grammar(&json!({"type": "object"})).unwrap();
        assert_eq!(
            allowed(&mut g, &words),
            vec!["{".to_string(), "{\"".to_string()]
        );
    }

    /// Issue 32 item 9: a schema too large, too deep or with a cycle that produces nothing
    /// is refused (a short message), and a large one never overflows the caller's stack.
    #[test]
    fn oversized_deep_and_cyclic_schemas_are_refused_briefly() {
        let (v, _) = vocab();
        let names: Vec<String> = (0..5000).map(|i| format!("property_number_{i}")).collect();
        let props: serde_json::Map<String, Value> = names
            .iter()
            .map(|n| (n.clone(), json!({"type": "string"})))
            .collect();
        let wide = json!({"type": "object", "properties": props, "required": names});
        // On a 256 KiB stack, as small as any caller's: the checks keep their own.
        let r = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || v.grammar(&wide).map(|_| ()))
            .unwrap()
            .join()
            .unwrap();
        let e = r.unwrap_err().to_string();
        assert!(e.contains("bytes") || e.contains("values"), "{e}");
        let (v, _) = vocab();
        let mut deep = json!({"type": "string"});
        for _ in 0..100 {
            deep = json!({"type": "array", "items": deep});
        }
        let Err(e) = v.grammar(&deep) else {
            panic!("a 100-deep schema is refused")
        };
        assert!(e.to_string().contains("deeper"), "{e}");
        for cyclic in [
            json!({"$ref": "#"}),
            json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}),
        ] {
            let Err(e) = v.grammar(&cyclic) else {
                panic!("{cyclic} is refused")
            };
            let m = e.to_string();
            assert!(matches!(e, GrammarError::Schema(_)), "{m}");
            assert!(m.len() <= MAX_MESSAGE + 3 && !m.contains('\n'), "{m}");
        }
        // A recursive schema that does produce documents still compiles.
        let tree = json!({"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}});
        assert!(v.grammar(&tree).is_ok());
    }

    #[test]
    fn an_unimplemented_keyword_is_refused_by_name() {
        let (v, _) = vocab();
        // (A Grammar is not Debug, so no expect_err.)
        let Err(e) = v.grammar(&json!({"type": "object", "if": {"required": ["a"]}, "then": {}}))
        else {
            panic!("refused")
        };
        assert!(e.to_string().contains("if"), "{e}");
    }
}
