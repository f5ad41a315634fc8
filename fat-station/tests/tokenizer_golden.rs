//! The tokenizer on the real models' vocabularies, against known ids and against golden ids
//! from an independent reference (Hugging Face `tokenizers` built from the same vocabulary and
//! merges; `scripts/tokenizer/make_golden.py` wrote `tests/golden/tokenizer/*.json`).
//!
//! The tokenizer metadata is read from the models' KNOT files (`scripts/fetch-model.sh` writes
//! them); the golden files were made from the GGUF files they were imported from, so this also
//! checks that the import carries the tokenizer faithfully. Models dir: `AEON_MODELS_DIR`, else
//! `~/.cache/aeon-shell/models`. A missing model skips the test with a message, or fails it
//! when `AEON_REQUIRE_MODELS=1`.
//! Run in release mode: `cargo test --release -p fat-station --test tokenizer_golden`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use fat_station::engine::tokenizer::{StreamDecoder, Tokenizer};
use knot_format::{Knot, TokenizerData};
use serde::Deserialize;

const QWEN: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m";
const SMOLLM2: &str = "smollm2-135m-instruct-q4_1";
const GEMMA: &str = "gemma-3-270m-q4_k_m";

fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("AEON_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache/aeon-shell/models")
}

/// Skips (returns `None`) with a message, or panics when models are required.
fn unavailable<T>(why: String) -> Option<T> {
    if std::env::var("AEON_REQUIRE_MODELS").as_deref() == Ok("1") {
        panic!("AEON_REQUIRE_MODELS=1 but {why}");
    }
    eprintln!("skipping: {why}");
    None
}

/// The model's tokenizer metadata, from the tokenizer section of its KNOT file.
fn load_data(stem: &str) -> Option<TokenizerData> {
    let path = models_dir().join(format!("{stem}.knot"));
    if !path.is_file() {
        return unavailable(format!(
            "{} is missing (run scripts/fetch-model.sh)",
            path.display()
        ));
    }
    let knot = Knot::open(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let data = knot
        .tokenizer()
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    Some(data.unwrap_or_else(|| panic!("{} has no tokenizer section", path.display())))
}

/// One tokenizer per model for the whole test binary (built once, timed once).
fn tokenizer(stem: &'static str) -> Option<&'static Tokenizer> {
    static QWEN_TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    static SMOLLM2_TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    static GEMMA_TOK: OnceLock<Option<Tokenizer>> = OnceLock::new();
    let cell = match stem {
        QWEN => &QWEN_TOK,
        GEMMA => &GEMMA_TOK,
        _ => &SMOLLM2_TOK,
    };
    cell.get_or_init(|| {
        let data = load_data(stem)?;
        let t0 = Instant::now();
        let tok = Tokenizer::from_data(&data).expect("tokenizer builds from the model's metadata");
        eprintln!(
            "timing: {stem}: built tokenizer ({} tokens, {} merges) in {:.1} ms",
            data.tokens.len(),
            data.merges.len(),
            t0.elapsed().as_secs_f64() * 1e3
        );
        Some(tok)
    })
    .as_ref()
}

#[derive(Deserialize)]
struct Golden {
    pre: String,
    vocab_size: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    /// False where the reference drops a byte the vocabulary has no token for.
    round_trip: bool,
}

fn golden(name: &str) -> Golden {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/tokenizer/{name}.json"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The token texts of `text`'s encoding.
fn pieces(tok: &Tokenizer, text: &str) -> Vec<String> {
    tok.encode(text, false)
        .iter()
        .map(|&id| String::from_utf8_lossy(tok.token_bytes(id).expect("id in vocab")).into_owned())
        .collect()
}

#[test]
fn tokenizer_qwen_known_ids() {
    let Some(tok) = tokenizer(QWEN) else { return };
    assert_eq!(
        tok.encode("The capital of France is", false),
        [785, 6722, 315, 9625, 374]
    );
    assert_eq!(tok.encode(" Paris", false), [12095]);
    assert_eq!(tok.decode(&[12095]), " Paris");
    assert_eq!(tok.token_id(" Paris"), Some(12095));
    assert_eq!(pieces(tok, "144"), ["1", "4", "4"]);
    assert_eq!(pieces(tok, "Romeo"), ["R", "ome", "o"]);
    let im_end = tok.token_id("<|im_end|>").expect("Qwen has <|im_end|>");
    let eot = tok
        .token_id("<|endoftext|>")
        .expect("Qwen has <|endoftext|>");
    assert!(tok.is_eog(im_end) && tok.is_eog(eot));
    assert!(!tok.is_eog(tok.token_id("<|im_start|>").expect("Qwen has <|im_start|>")));
    assert!(!tok.is_eog(12095));
    assert!(!tok.add_bos_default(), "Qwen does not ask for a bos token");
}

#[test]
fn tokenizer_smollm2_known_ids() {
    let Some(tok) = tokenizer(SMOLLM2) else {
        return;
    };
    assert_eq!(
        tok.encode("The capital of France is", false),
        [504, 3575, 282, 4649, 314]
    );
    assert_eq!(tok.encode(" Paris", false), [7042]);
    assert_eq!(tok.decode(&[7042]), " Paris");
    assert_eq!(pieces(tok, "144"), ["1", "4", "4"]);
    assert_eq!(pieces(tok, "Romeo"), ["Rome", "o"]);
    assert_eq!(tok.eos_id(), tok.token_id("<|im_end|>"));
    assert!(tok.is_eog(
        tok.token_id("<|endoftext|>")
            .expect("SmolLM2 has <|endoftext|>")
    ));
    // bos is honoured on request, since the model has one.
    let bos = tok.bos_id().expect("SmolLM2 has a bos id");
    assert_eq!(tok.encode(" Paris", true), [bos, 7042]);
}

/// Every corpus string encodes to exactly the reference ids, and decodes back to itself
/// (except where the reference, too, drops a byte that has no token).
fn check_golden(stem: &'static str, name: &str) {
    let Some(tok) = tokenizer(stem) else { return };
    let g = golden(name);
    assert_eq!(
        g.vocab_size,
        tok.vocab_size(),
        "golden {name} was made from another vocabulary"
    );
    assert!(g.cases.len() >= 300, "golden {name} has too few cases");
    assert!(g.cases.iter().filter(|c| c.round_trip).count() >= 300);
    let mut failures = Vec::new();
    for case in &g.cases {
        let ids = tok.encode(&case.text, false);
        if ids != case.ids {
            failures.push(format!(
                "{:?}\n   ours: {ids:?} {:?}\n    ref: {:?} {:?}",
                case.text,
                pieces(tok, &case.text),
                case.ids,
                case.ids
                    .iter()
                    .map(|&id| tok.decode(&[id]))
                    .collect::<Vec<_>>(),
            ));
        }
        let back = tok.decode(&ids);
        assert_eq!(
            back == case.text,
            case.round_trip,
            "round trip of {:?} gave {back:?}",
            case.text
        );
    }
    assert!(
        failures.is_empty(),
        "{name} (pre={}): {} of {} cases differ from the reference:\n{}",
        g.pre,
        failures.len(),
        g.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_qwen_matches_reference_golden() {
    check_golden(QWEN, "qwen");
}

#[test]
fn tokenizer_smollm2_matches_reference_golden() {
    check_golden(SMOLLM2, "smollm2");
}

/// Streaming decode over real tokens that cut emoji in pieces.
fn check_stream(stem: &'static str) {
    let Some(tok) = tokenizer(stem) else { return };
    let text = "Emoji: 😀😃😄 👋🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨ 🤖 and 你好";
    let ids = tok.encode(text, false);
    let partial = ids
        .iter()
        .filter(|&&id| std::str::from_utf8(tok.token_bytes(id).expect("in vocab")).is_err())
        .count();
    assert!(
        partial > 0,
        "{stem}: no token splits a character, so this test would prove nothing"
    );
    let mut sd = StreamDecoder::new();
    let mut out = String::new();
    let mut held_back = 0;
    for &id in &ids {
        match sd.push(tok, id) {
            Some(s) => out.push_str(&s),
            None => held_back += 1,
        }
    }
    assert!(held_back > 0, "{stem}: a split character must be held back");
    assert!(!sd.has_pending());
    out.push_str(&sd.finish());
    assert_eq!(out, text);
    assert!(!out.contains('\u{FFFD}'));
}

#[test]
fn tokenizer_qwen_stream_decoder_joins_split_characters() {
    check_stream(QWEN);
}

#[test]
fn tokenizer_smollm2_stream_decoder_joins_split_characters() {
    check_stream(SMOLLM2);
}

/// Not an assertion on speed: prints how long a 10 kB prompt takes, and checks it round-trips.
fn time_encode(stem: &'static str) {
    let Some(tok) = tokenizer(stem) else { return };
    let g = golden(if stem == QWEN { "qwen" } else { "smollm2" });
    let mut text = String::new();
    let mut i = 0;
    while text.len() < 10_000 {
        let case = &g.cases[i % g.cases.len()];
        if case.round_trip {
            text.push_str(&case.text);
        }
        text.push(' ');
        i += 1;
    }
    let _ = tok.encode(&text, false); // warm up
    let runs = 5;
    let t0 = Instant::now();
    let mut n = 0;
    for _ in 0..runs {
        n = tok.encode(&text, false).len();
    }
    let ms = t0.elapsed().as_secs_f64() * 1e3 / f64::from(runs);
    eprintln!(
        "timing: {stem}: encoded {} bytes -> {n} tokens in {ms:.2} ms",
        text.len()
    );
    assert_eq!(tok.decode(&tok.encode(&text, false)), text);
}

#[test]
fn tokenizer_qwen_encode_10kb_timing() {
    time_encode(QWEN);
}

#[test]
fn tokenizer_smollm2_encode_10kb_timing() {
    time_encode(SMOLLM2);
}

/// llama.cpp's SentencePiece ids for Gemma 3 (`scripts/tokenizer/make_gemma_golden.py`, PyPI
/// llama-cpp-python, vocab only): special-token text parsed (`ids`) and, where that differs,
/// not parsed (`ids_plain`: a user's text, where `<start_of_turn>` must stay characters).
#[derive(Deserialize)]
struct SpmGolden {
    vocab_size: usize,
    /// The GGUF the ids came from, for a synthetic vocabulary (made again by the test).
    gguf_sha256: Option<String>,
    cases: Vec<SpmCase>,
}

#[derive(Deserialize)]
struct SpmCase {
    text: String,
    ids: Vec<u32>,
    ids_plain: Option<Vec<u32>>,
    round_trip: bool,
}

fn spm_golden(name: &str) -> SpmGolden {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/tokenizer/{name}.json"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn tokenizer_gemma_matches_llamacpp_golden() {
    let Some(tok) = tokenizer(GEMMA) else { return };
    assert_spm_golden("gemma", tok, &spm_golden("gemma"));
}

/// Mistral v0.3's vocabulary layout (Llama 2's 32000 SentencePiece pieces with v0.3's 768
/// control tokens after `</s>`, in the synthetic `mistral-v3-tiny` file): llama.cpp's ids on
/// 392 strings (`scripts/tokenizer/make_spm_golden.py`), `[INST]` and kin parsed only where
/// special parsing is on.
#[test]
fn tokenizer_mistral_v3_matches_llamacpp_golden() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some((gguf, knot)) =
        test_support::synthetic_model(dir.path(), "mistral-v3-tiny", &["--type", "f16"])
    else {
        return;
    };
    let g = spm_golden("mistral_v3");
    let sha = test_support::sha256_file(&gguf);
    if Some(sha.as_str()) != g.gguf_sha256.as_deref() {
        assert!(
            !test_support::required(),
            "mistral-v3-tiny's sha256 {sha} is not the golden's"
        );
        eprintln!("skipping: mistral-v3-tiny's sha256 {sha} is not the golden's; not compared");
        return;
    }
    let knot = Knot::open(&knot).expect("open");
    let data = knot.tokenizer().expect("tokenizer").expect("a vocabulary");
    let tok = Tokenizer::from_data(&data).expect("tokenizer builds");
    assert_eq!(tok.encode("[INST]", false), [3]);
    assert_spm_golden("mistral_v3", &tok, &g);
}

/// Every case of `g`: our ids with special parsing on and off, and the round trip.
fn assert_spm_golden(name: &str, tok: &Tokenizer, g: &SpmGolden) {
    assert_eq!(g.vocab_size, tok.vocab_size());
    assert!(g.cases.len() >= 300, "golden {name} has too few cases");
    let mut failures = Vec::new();
    for case in &g.cases {
        let ids = tok.encode(&case.text, false);
        if ids != case.ids {
            failures.push(format!(
                "{:?}\n   ours: {ids:?}\n    ref: {:?}",
                case.text, case.ids
            ));
        }
        let want_plain = case.ids_plain.as_ref().unwrap_or(&case.ids);
        let plain = tok.encode_parts(&[(&case.text, false)], false);
        if &plain != want_plain {
            failures.push(format!(
                "{:?} (special parsing off)\n   ours: {plain:?}\n    ref: {want_plain:?}",
                case.text
            ));
        }
        if case.round_trip {
            assert_eq!(tok.decode(&ids), case.text, "round trip");
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} encodings differ from llama.cpp:\n{}",
        failures.len(),
        2 * g.cases.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_gemma_known_ids_and_plain_text_never_becomes_control_tokens() {
    let Some(tok) = tokenizer(GEMMA) else { return };
    assert_eq!(
        tok.encode("The capital of France is", true),
        [2, 818, 5279, 529, 7001, 563]
    );
    assert_eq!(tok.encode(" Paris", false), [9079]);
    assert_eq!(tok.decode(&[9079]), " Paris");
    assert!(tok.add_bos_default(), "Gemma asks for <bos>");
    let eot = tok
        .token_id("<end_of_turn>")
        .expect("Gemma has <end_of_turn>");
    assert!(tok.is_eog(eot) && tok.is_eog(1));
    let sot = tok
        .token_id("<start_of_turn>")
        .expect("Gemma has <start_of_turn>");
    assert_eq!(tok.encode("<start_of_turn>", false), [sot]);
    let plain = tok.encode_parts(&[("<start_of_turn>user", false)], false);
    assert!(!plain.contains(&sot), "{plain:?}");
    assert_eq!(tok.decode(&plain), "<start_of_turn>user");
}

/// llama.cpp's token-attribute override: Gemma 3's file types `</s>` (id 212) user-defined,
/// which would be matched whole even in a user's plain text; llama.cpp forces it (and every
/// end-of-generation text) to a control token, so plain text keeps `</s>` as characters and
/// only special parsing finds it. (Before the override: `[212]` with parsing off.)
#[test]
fn tokenizer_gemma_keeps_end_of_sequence_text_in_plain_text_as_llama_cpp_does() {
    let Some(tok) = tokenizer(GEMMA) else { return };
    let s = tok.token_id("</s>").expect("Gemma has </s>");
    assert_eq!(s, 212);
    let plain = tok.encode_parts(&[("</s>", false)], false);
    assert!(!plain.contains(&s), "{plain:?}");
    assert_eq!(tok.decode(&plain), "</s>");
    assert_eq!(tok.encode_parts(&[("</s>", true)], false), [s]);
    assert!(tok.is_eog(s), "llama.cpp ends generation at </s>");
}
