//! Pre-tokenization: cutting text into the words BPE merges within.
//!
//! The patterns are chosen by GGUF's `tokenizer.ggml.pre` name. Some models split in several
//! passes (SmolLM2 first isolates every digit, then applies GPT-2's pattern to the rest), so a
//! pre-tokenizer is a list of patterns applied one after the other, each to the pieces the
//! previous one left. Text between two matches is kept as a piece of its own, never dropped.
//!
//! Trap: every pattern ends in `\s+(?!\S)`, which needs lookahead; that is why this module
//! uses `fancy-regex` rather than `regex`. Without the lookahead a run of spaces before a word
//! would swallow the space that belongs to the word (`"a  b"` must give `"a"`, `" "`, `" b"`).

use fancy_regex::Regex;

use super::TokenizerError;

/// GPT-2's pattern, as llama.cpp uses it (its trailing `|\s+` is implied: the text a pattern
/// leaves between two matches is kept as a piece, which is what `\s+` would have matched).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Qwen2's pattern (its tokenizer.json): contractions case-insensitive, a letter run may take one
/// leading non-letter non-digit (not a newline), every digit alone, newlines grouped.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Llama 3's pattern: as Qwen2's but digits in runs of up to three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tekken's pattern (Mistral NeMo and later), as llama.cpp 0.3.36 writes it: the
/// tokenizer.json's "upper-case letters then lower-case" classes as `[^a-z]` / `[^A-Z]`
/// over letters, every digit alone, `/` kept after punctuation.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Isolates every digit (a first pass for SmolLM2, StarCoder and kin).
const DIGITS: &str = r"\p{N}";

/// The pre-tokenizer families this module knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PreKind {
    /// GPT-2's pattern (`gpt-2`, and a file that names none).
    Gpt2,
    /// Single digits, then GPT-2's pattern (`smollm`, `starcoder`, `refact`, ...).
    DigitsGpt2,
    /// Qwen2's pattern (`qwen2`, `stablelm2`).
    Qwen2,
    /// Llama 3's pattern, and whole-word vocabulary hits skip the merges (`llama-bpe`,
    /// `llama3`; `glm4`, whose pattern and merge rule llama.cpp gives as the same).
    Llama3,
    /// Tekken's pattern, whole-word vocabulary hits skip the merges (`tekken`).
    Tekken,
}

impl PreKind {
    /// The family for a GGUF `tokenizer.ggml.pre` name; `None` if the name is unknown.
    pub(crate) fn from_name(name: &str) -> Option<PreKind> {
        Some(match name {
            "" | "gpt-2" | "gpt2" | "default" | "mpt" | "olmo" | "jais" => PreKind::Gpt2,
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" => {
                PreKind::DigitsGpt2
            }
            "qwen2" | "stablelm2" => PreKind::Qwen2,
            "llama-bpe" | "llama3" | "llama-v3" | "glm4" | "glm5" => PreKind::Llama3,
            "tekken" => PreKind::Tekken,
            _ => return None,
        })
    }

    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreKind::Gpt2 => &[GPT2],
            PreKind::DigitsGpt2 => &[DIGITS, GPT2],
            PreKind::Qwen2 => &[QWEN2],
            PreKind::Llama3 => &[LLAMA3],
            PreKind::Tekken => &[TEKKEN],
        }
    }
}

/// A compiled pre-tokenizer: patterns applied in order.
pub(crate) struct PreTokenizer {
    kind: PreKind,
    passes: Vec<Regex>,
}

impl PreTokenizer {
    /// Compiles the patterns of `kind`.
    pub(crate) fn new(kind: PreKind) -> Result<PreTokenizer, TokenizerError> {
        let passes = kind
            .patterns()
            .iter()
            .map(|p| {
                Regex::new(p).map_err(|source| TokenizerError::Pattern {
                    pattern: (*p).to_string(),
                    source: Box::new(source),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(PreTokenizer { kind, passes })
    }

    /// The family this pre-tokenizer implements.
    pub(crate) fn kind(&self) -> PreKind {
        self.kind
    }

    /// Cuts `text` into pieces, appended to `out` in order; their concatenation is `text`.
    /// `scratch` is a buffer reused between passes.
    pub(crate) fn split<'t>(
        &self,
        text: &'t str,
        out: &mut Vec<&'t str>,
        scratch: &mut Vec<&'t str>,
    ) {
        if text.is_empty() {
            return;
        }
        let base = out.len();
        out.push(text);
        for re in &self.passes {
            scratch.clear();
            scratch.extend(out.drain(base..));
            for &piece in scratch.iter() {
                split_one(re, piece, out);
            }
        }
    }
}

/// Appends the matches of `re` in `piece`, and the text between them, to `out`.
fn split_one<'t>(re: &Regex, piece: &'t str, out: &mut Vec<&'t str>) {
    let mut last = 0;
    for m in re.find_iter(piece) {
        let m = match m {
            Ok(m) => m,
            Err(err) => {
                // Only a runaway backtrack can fail here; keep the rest whole rather than lose it.
                tracing::warn!(%err, "pre-tokenizer pattern failed; keeping the rest as one piece");
                break;
            }
        };
        if m.start() == m.end() {
            continue;
        }
        if m.start() > last {
            out.push(&piece[last..m.start()]);
        }
        out.push(m.as_str());
        last = m.end();
    }
    if last < piece.len() {
        out.push(&piece[last..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(kind: PreKind, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(kind).expect("patterns compile");
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        pre.split(text, &mut out, &mut scratch);
        assert_eq!(out.concat(), text, "pieces must cover the text");
        out.into_iter().map(String::from).collect()
    }

    #[test]
    fn gpt2_keeps_the_space_with_the_word() {
        assert_eq!(pieces(PreKind::Gpt2, "a  b"), ["a", " ", " b"]);
        assert_eq!(pieces(PreKind::Gpt2, "I'm 42!"), ["I", "'m", " 42", "!"]);
        assert_eq!(pieces(PreKind::Gpt2, "end  "), ["end", "  "]);
    }

    #[test]
    fn unmatched_text_is_kept() {
        // A lone newline before punctuation matches no GPT-2 alternative; it must survive.
        assert_eq!(pieces(PreKind::Gpt2, "x\n!"), ["x", "\n", "!"]);
    }

    #[test]
    fn digits_pass_isolates_each_digit() {
        assert_eq!(
            pieces(PreKind::DigitsGpt2, "a 144b"),
            ["a", " ", "1", "4", "4", "b"]
        );
    }

    #[test]
    fn qwen2_and_llama3_digit_grouping() {
        assert_eq!(pieces(PreKind::Qwen2, "12345"), ["1", "2", "3", "4", "5"]);
        assert_eq!(pieces(PreKind::Llama3, "12345"), ["123", "45"]);
        assert_eq!(
            pieces(PreKind::Qwen2, "DON'T\n\n  x"),
            ["DON", "'T", "\n\n", " ", " x"]
        );
    }

    #[test]
    fn known_names() {
        assert_eq!(PreKind::from_name("qwen2"), Some(PreKind::Qwen2));
        assert_eq!(PreKind::from_name("smollm"), Some(PreKind::DigitsGpt2));
        assert_eq!(PreKind::from_name("llama-bpe"), Some(PreKind::Llama3));
        assert_eq!(PreKind::from_name("glm4"), Some(PreKind::Llama3));
        assert_eq!(PreKind::from_name("tekken"), Some(PreKind::Tekken));
        assert_eq!(PreKind::from_name("no-such-pre"), None);
        // Llama 4's (llama.cpp's GPT-4o pattern) is not implemented: refused by name.
        assert_eq!(PreKind::from_name("llama4"), None);
    }

    #[test]
    fn tekken_splits_case_runs_and_keeps_a_slash_after_punctuation() {
        // Capitals then lower case are one word, with one leading non-letter (a space, a dot,
        // a slash); digits alone.
        let want = ["Hello", " WORLDwide", " ", "4", "2", " a", ".b", "/c"];
        assert_eq!(pieces(PreKind::Tekken, "Hello WORLDwide 42 a.b/c"), want);
        assert_eq!(pieces(PreKind::Tekken, "x?/\n"), ["x", "?/\n"]);
    }
}
