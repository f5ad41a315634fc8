//! Tokenizers built from the model's own metadata: byte-level BPE (GGUF `tokenizer.ggml.model`
//! `gpt2`: Qwen, SmolLM2, Llama 3) and SentencePiece (`llama`: Gemma), behind one [`Tokenizer`].
//!
//! Everything comes from [`TokenizerData`] (GGUF's `tokenizer.ggml.*` as the KNOT header carries
//! it): the vocabulary, the merge list or piece scores, token types, the pre-tokenizer name and
//! the special ids. Nothing is fetched and no vocabulary is hard-coded.
//!
//! SentencePiece ([`spm`]) follows llama.cpp: user-defined tokens (Gemma's `\n`, whitespace
//! runs, HTML tags) are matched whole in all text, control tokens only where special parsing
//! is on; each fragment between them is merged by piece score, with `<0xNN>` byte fallback.
//! Decoding turns `▁` back into spaces and byte tokens into their bytes.
//!
//! Byte-level BPE encoding, in order:
//! 1. Special tokens (GGUF types 3 control and 4 user-defined, e.g. `<|im_start|>`) are found
//!    whole, leftmost-longest, and emitted as their ids; the text between them goes on. Only
//!    text the caller marks `parse_special` is searched ([`Tokenizer::encode_parts`]): text from
//!    a user (chat message content) is encoded as plain bytes, so `<|im_end|>` typed by a user
//!    never becomes a control token (llama.cpp's `parse_special` discipline).
//! 2. The pre-tokenizer named by `pre` cuts that text into words ([`pretokenize`]).
//! 3. Each word's UTF-8 bytes start as one-byte tokens and are merged by rank ([`bpe`]).
//!
//! Decoding joins the tokens' bytes. Vocabulary strings are stored in GPT-2's byte-to-unicode
//! alphabet ([`byte_level`]), so `" Paris"` is the string `"ĠParis"`; they are turned back into
//! bytes once, when the tokenizer is built.
//!
//! No normalization (NFC or other) is applied, as in llama.cpp: `decode(encode(s)) == s` byte
//! for byte. Hugging Face's Qwen2 tokenizer.json applies NFC, so on decomposed input
//! (`e` + U+0301) the two can differ; the GGUF behaviour is the one followed here.

mod bpe;
mod byte_level;
mod index;
mod pretokenize;
mod spm;
mod stream;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use knot_format::TokenizerData;

use bpe::{MergeMap, Scratch, NONE};
use byte_level::ByteLevel;
use index::{Arena, VocabIndex};
use pretokenize::{PreKind, PreTokenizer};
use spm::{Spm, SpmScratch};

pub use stream::StreamDecoder;

/// GGUF token type of an ordinary vocabulary token.
const TYPE_NORMAL: i32 = 1;
/// GGUF token type of the unknown token (`<unk>`).
const TYPE_UNKNOWN: i32 = 2;
/// GGUF token type of a control token (`<|im_start|>`, `<|endoftext|>`).
const TYPE_CONTROL: i32 = 3;
/// GGUF token type of a user-defined token (Qwen's `<tool_call>`, Gemma's `\n`).
const TYPE_USER_DEFINED: i32 = 4;
/// GGUF token type of a byte-fallback token (`<0x0A>`).
const TYPE_BYTE: i32 = 6;

/// Texts of tokens that end generation besides the model's eos: llama.cpp 0.3.36's list
/// (`llama_vocab::impl::load`). As there, a token with one of these texts is a control
/// token whatever its type in the file: Gemma 3 types `</s>` (id 212) user-defined, which
/// would match in a user's plain text; llama.cpp forces it to control, so there it is only
/// found where special parsing is on.
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "[e~[",
];

/// With one of these also in the vocabulary, `</s>` is an ordinary token (gemma4, plamo; as
/// llama.cpp decides).
const NORMAL_S_MARKERS: &[&str] = &["<|tool_response>", "<|plamo:eos|>"];

/// Largest vocabulary accepted (ids must fit in u32 with room for the `NONE` sentinel).
const MAX_VOCAB: usize = 1 << 24;

/// Why a tokenizer could not be built from its metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// `tokenizer.ggml.model` is neither `gpt2` (byte-level BPE) nor `llama` (SentencePiece).
    #[error(
        "unsupported tokenizer model {model:?}: byte-level BPE (\"gpt2\") and SentencePiece (\"llama\") are implemented"
    )]
    UnsupportedModel { model: String },
    /// SentencePiece scores are neither empty nor as long as `tokens`.
    #[error("{scores} piece scores for {tokens} tokens")]
    Scores { tokens: usize, scores: usize },
    /// The vocabulary is empty or larger than [`MAX_VOCAB`].
    #[error("vocabulary size {size} is out of range (1..={MAX_VOCAB})")]
    VocabSize { size: usize },
    /// `token_types` is neither empty nor as long as `tokens`.
    #[error("{types} token types for {tokens} tokens")]
    TokenTypes { tokens: usize, types: usize },
    /// A merge is not two vocabulary tokens separated by one space, or its result is missing.
    #[error("merge #{rank} {merge:?}: {reason}")]
    BadMerge {
        rank: usize,
        merge: String,
        reason: &'static str,
    },
    /// A special id (bos, eos, ...) is not a vocabulary index.
    #[error("{which} id {id} is outside the vocabulary of {vocab}")]
    SpecialId {
        which: &'static str,
        id: u32,
        vocab: usize,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer this module does not implement.
    #[error(
        "unknown pre-tokenizer {name:?} (tokenizer.ggml.pre); implemented: gpt-2, smollm, starcoder, qwen2, llama-bpe, glm4, tekken and their aliases"
    )]
    UnknownPre { name: String },
    /// A built-in pre-tokenizer pattern failed to compile (a bug, not bad input).
    #[error("pre-tokenizer pattern {pattern:?} does not compile")]
    Pattern {
        pattern: String,
        #[source]
        source: Box<fancy_regex::Error>,
    },
}

/// How plain text (no special tokens) becomes ids.
enum Model {
    /// Byte-level BPE (`gpt2`).
    Bpe {
        /// Id of the single-byte token for each byte. (256,)
        byte_ids: [u32; 256],
        /// `(left, right) -> (rank, merged)`.
        merges: MergeMap,
        /// Splits text into words.
        pre: PreTokenizer,
    },
    /// SentencePiece (`llama`).
    Spm(Spm),
}

/// A tokenizer (byte-level BPE or SentencePiece). Cheap to share (`Arc<Tokenizer>`);
/// `encode` takes `&self`.
pub struct Tokenizer {
    /// All tokens' bytes (what each decodes to), concatenated in id order.
    bytes: Vec<u8>,
    /// Token `i` is `bytes[offsets[i]..offsets[i + 1]]`. (vocab + 1,)
    offsets: Vec<u32>,
    /// Token bytes -> id; the lowest id wins when two tokens share their bytes (SentencePiece
    /// byte tokens are left out: `token_id("A")` is the piece `A`, not `<0x41>`).
    index: VocabIndex,
    model: Model,
    /// Control and user-defined tokens, matched whole where special parsing is on.
    specials: SpecialMatcher,
    /// Tokens matched whole even where special parsing is off: SentencePiece's user-defined
    /// tokens (llama.cpp does so); empty for BPE.
    always: SpecialMatcher,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    /// Sorted ids that end generation (eos and the control tokens in `END_OF_GENERATION`).
    eog: Vec<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (model, merges) = match &self.model {
            Model::Bpe { merges, pre, .. } => (format!("bpe {:?}", pre.kind()), merges.len()),
            Model::Spm(_) => ("sentencepiece".to_string(), 0),
        };
        f.debug_struct("Tokenizer")
            .field("vocab", &self.vocab_size())
            .field("model", &model)
            .field("merges", &merges)
            .field("specials", &self.specials.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a model's metadata.
    ///
    /// Fails on a model other than byte-level BPE or SentencePiece, a malformed merge, scores
    /// or token types that do not match the vocabulary, or out-of-range special ids. An
    /// unknown pre-tokenizer name only warns and falls back to GPT-2's pattern.
    pub fn from_data(data: &TokenizerData) -> Result<Tokenizer, TokenizerError> {
        let spm = match data.model.as_str() {
            "gpt2" => false,
            "llama" => true,
            _ => {
                return Err(TokenizerError::UnsupportedModel {
                    model: data.model.clone(),
                })
            }
        };
        let n = data.tokens.len();
        if n == 0 || n > MAX_VOCAB {
            return Err(TokenizerError::VocabSize { size: n });
        }
        if !data.token_types.is_empty() && data.token_types.len() != n {
            return Err(TokenizerError::TokenTypes {
                tokens: n,
                types: data.token_types.len(),
            });
        }
        if !data.scores.is_empty() && data.scores.len() != n {
            return Err(TokenizerError::Scores {
                tokens: n,
                scores: data.scores.len(),
            });
        }
        let file_type = |id: usize| data.token_types.get(id).copied().unwrap_or(TYPE_NORMAL);
        // llama.cpp's attribute override: END_OF_GENERATION's texts are control tokens.
        let s_is_normal = NORMAL_S_MARKERS
            .iter()
            .any(|m| data.tokens.iter().any(|t| t == m));
        let forced: Vec<bool> = data
            .tokens
            .iter()
            .map(|t| END_OF_GENERATION.contains(&t.as_str()) && !(s_is_normal && t == "</s>"))
            .collect();
        let token_type = |id: usize| match forced[id] {
            true => TYPE_CONTROL,
            false => file_type(id),
        };
        let is_special = |id: usize| matches!(token_type(id), TYPE_CONTROL | TYPE_USER_DEFINED);
        // SentencePiece byte-fallback tokens and the byte each stands for.
        let spm_byte = |id: usize| {
            (spm && token_type(id) == TYPE_BYTE)
                .then(|| spm::byte_token(&data.tokens[id]))
                .flatten()
        };

        // Token bytes. BPE: special tokens are raw text, the rest are in GPT-2's alphabet,
        // except the odd token that is not (kept as its raw UTF-8). SentencePiece: `▁` is a
        // space in normal pieces, `<0xNN>` is its byte, other types are their text.
        let bl = ByteLevel::new();
        let total: usize = data.tokens.iter().map(String::len).sum();
        let mut bytes = Vec::with_capacity(total);
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0u32);
        for (id, tok) in data.tokens.iter().enumerate() {
            if spm {
                match (spm_byte(id), token_type(id)) {
                    (Some(b), _) => bytes.push(b),
                    (None, TYPE_NORMAL) => {
                        bytes.extend_from_slice(tok.replace(spm::SPACE, " ").as_bytes())
                    }
                    _ => bytes.extend_from_slice(tok.as_bytes()),
                }
            } else if is_special(id) || !bl.decode_into(tok, &mut bytes) {
                bytes.extend_from_slice(tok.as_bytes());
            }
            offsets.push(
                u32::try_from(bytes.len()).map_err(|_| TokenizerError::VocabSize { size: n })?,
            );
        }
        let arena = Arena {
            bytes: &bytes,
            offsets: &offsets,
        };
        let index = VocabIndex::new_filtered(arena, |id| spm_byte(id as usize).is_none());

        let model = if spm {
            let mut byte_ids = [NONE; 256];
            for id in 0..n {
                if let Some(b) = spm_byte(id) {
                    if byte_ids[usize::from(b)] == NONE {
                        byte_ids[usize::from(b)] = id as u32;
                    }
                }
            }
            // Like llama.cpp, a byte without a `<0xNN>` token falls back to a piece that is
            // that single byte.
            for (b, slot) in byte_ids.iter_mut().enumerate() {
                if *slot == NONE && b < 0x80 {
                    *slot = index.get(arena, &[b as u8]).unwrap_or(NONE);
                }
            }
            Model::Spm(Spm::new(
                &data.tokens,
                &data.scores,
                byte_ids,
                // llama.cpp's default for SentencePiece when the file does not say (Llama 2
                // and Mistral GGUFs carry no key; Gemma's says false).
                data.add_space_prefix.unwrap_or(true),
            ))
        } else {
            Self::bpe_model(data, &bl, arena, &index, &is_special)?
        };

        let check = |which, id: Option<u32>| match id {
            Some(id) if id as usize >= n => Err(TokenizerError::SpecialId {
                which,
                id,
                vocab: n,
            }),
            _ => Ok(id),
        };
        let bos = check("bos", data.bos_id)?;
        let eos = check("eos", data.eos_id)?;
        check("pad", data.pad_id)?;
        check("unk", data.unk_id)?;

        let special_ids: Vec<u32> = (0..n)
            .filter(|&id| is_special(id) || (spm && token_type(id) == TYPE_UNKNOWN))
            .map(|id| id as u32)
            .collect();
        let mut eog: Vec<u32> = special_ids
            .iter()
            .copied()
            .filter(|&id| {
                token_type(id as usize) == TYPE_CONTROL
                    || token_type(id as usize) == TYPE_USER_DEFINED
            })
            .filter(|&id| {
                END_OF_GENERATION
                    .iter()
                    .any(|t| t.as_bytes() == arena.token(id))
            })
            .chain(eos)
            .collect();
        eog.sort_unstable();
        eog.dedup();

        let specials = SpecialMatcher::new(special_ids.iter().map(|&id| (arena.token(id), id)));
        let always = SpecialMatcher::new(
            special_ids
                .iter()
                .filter(|&&id| spm && token_type(id as usize) == TYPE_USER_DEFINED)
                .map(|&id| (arena.token(id), id)),
        );
        Ok(Tokenizer {
            bytes,
            offsets,
            index,
            model,
            specials,
            always,
            bos,
            eos,
            add_bos: data.add_bos,
            eog,
        })
    }

    /// The byte-level BPE parts: single-byte tokens and the merge table.
    fn bpe_model(
        data: &TokenizerData,
        bl: &ByteLevel,
        arena: Arena<'_>,
        index: &VocabIndex,
        is_special: &dyn Fn(usize) -> bool,
    ) -> Result<Model, TokenizerError> {
        // An unknown name is refused: another split gives other ids with no error anywhere.
        let pre_kind = PreKind::from_name(&data.pre).ok_or_else(|| TokenizerError::UnknownPre {
            name: data.pre.clone(),
        })?;
        let pre = PreTokenizer::new(pre_kind)?;
        let n = data.tokens.len();
        let mut byte_ids = [NONE; 256];
        for id in 0..n {
            if let ([b], false) = (arena.token(id as u32), is_special(id)) {
                if byte_ids[usize::from(*b)] == NONE {
                    byte_ids[usize::from(*b)] = id as u32;
                }
            }
        }
        let missing = byte_ids.iter().filter(|&&id| id == NONE).count();
        if missing > 0 {
            // SmolLM2 lacks a few control bytes; like llama.cpp and HF, such bytes are dropped.
            tracing::warn!(
                missing,
                "some bytes have no single-byte token and cannot be encoded"
            );
        }

        // Merges are written in vocabulary strings ("Ġ t" makes "Ġt"); decode both parts to
        // bytes, then the pair and its concatenation are found in the index.
        let mut merges = MergeMap::with_capacity_and_hasher(data.merges.len(), Default::default());
        let mut buf = Vec::new();
        for (rank, merge) in data.merges.iter().enumerate() {
            let bad = |reason| TokenizerError::BadMerge {
                rank,
                merge: merge.clone(),
                reason,
            };
            let (a, b) = merge
                .split_once(' ')
                .ok_or_else(|| bad("no space separator"))?;
            buf.clear();
            if !bl.decode_into(a, &mut buf) {
                buf.extend_from_slice(a.as_bytes());
            }
            let split = buf.len();
            if !bl.decode_into(b, &mut buf) {
                buf.extend_from_slice(b.as_bytes());
            }
            let lookup = |key: &[u8], reason| index.get(arena, key).ok_or_else(|| bad(reason));
            let ia = lookup(&buf[..split], "left part is not a token")?;
            let ib = lookup(&buf[split..], "right part is not a token")?;
            let iab = lookup(&buf, "merged token is not in the vocabulary")?;
            // A pair listed twice keeps its first (best) rank.
            merges.entry((ia, ib)).or_insert((rank as u32, iab));
        }
        Ok(Model::Bpe {
            byte_ids,
            merges,
            pre,
        })
    }

    /// Encodes `text` to token ids. Special-token text (`<|im_start|>`) becomes its id.
    /// `add_bos` prepends the bos token, and is ignored if the model has none.
    pub fn encode(&self, text: &str, add_bos: bool) -> Vec<u32> {
        self.encode_parts(&[(text, true)], add_bos)
    }

    /// Encodes the concatenation of `parts`, each `(text, parse_special)`: special tokens are
    /// found only inside parts with `parse_special` (a match never spans two parts); every
    /// other byte is plain text (SentencePiece's user-defined tokens excepted, which
    /// llama.cpp matches everywhere). Plain text is pre-tokenized across part boundaries, so
    /// the ids equal [`Tokenizer::encode`]'s on the joined text whenever the plain parts hold
    /// no special-token text.
    pub fn encode_parts(&self, parts: &[(&str, bool)], add_bos: bool) -> Vec<u32> {
        let text: String = parts.iter().map(|p| p.0).collect();
        let mut specials = Vec::new();
        let mut at = 0;
        for &(part, parse_special) in parts {
            let matcher = if parse_special {
                &self.specials
            } else {
                &self.always
            };
            specials.extend(
                matcher
                    .find_all(part.as_bytes())
                    .map(|(start, len, id)| (at + start, len, id)),
            );
            at += part.len();
        }
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_bos {
            out.extend(self.bos);
        }
        let mut scratch = PlainScratch::default();
        let mut rest = 0;
        // SentencePiece's space prefix goes on text at the start or after a special token.
        let mut after_special = true;
        for (start, len, id) in specials {
            if start > rest {
                self.encode_plain(&text[rest..start], after_special, &mut out, &mut scratch);
            }
            out.push(id);
            after_special = true;
            rest = start + len;
        }
        if rest < text.len() {
            self.encode_plain(&text[rest..], after_special, &mut out, &mut scratch);
        }
        out
    }

    /// Encodes text that holds no special token (`after_special`: it starts the text or
    /// follows a special token).
    fn encode_plain(
        &self,
        text: &str,
        after_special: bool,
        out: &mut Vec<u32>,
        scratch: &mut PlainScratch,
    ) {
        match &self.model {
            Model::Bpe {
                byte_ids,
                merges,
                pre,
            } => {
                let mut words = Vec::new();
                let mut pass = Vec::new();
                pre.split(text, &mut words, &mut pass);
                let whole_words = matches!(pre.kind(), PreKind::Llama3 | PreKind::Tekken);
                for word in words.iter() {
                    // Llama 3 takes a word the vocabulary holds whole as it is, without merging.
                    if whole_words {
                        if let Some(id) = self.lookup(word.as_bytes()) {
                            out.push(id);
                            continue;
                        }
                    }
                    bpe::merge_word(word.as_bytes(), byte_ids, merges, &mut scratch.bpe, out);
                }
            }
            Model::Spm(spm) => {
                let prefix = spm.add_space_prefix && after_special;
                spm.encode(text, prefix, &mut scratch.spm, out);
            }
        }
    }

    /// Decodes ids to text. Bytes that are not valid UTF-8 (a character cut by the end of the
    /// slice) become U+FFFD; ids outside the vocabulary are skipped. Special tokens decode to
    /// their text.
    pub fn decode(&self, ids: &[u32]) -> String {
        // SentencePiece with the space prefix: the space encoding put before the text is
        // dropped again (llama.cpp's detokenize strips one from the first piece).
        let strip = matches!(&self.model, Model::Spm(spm) if spm.add_space_prefix);
        decode_pieces(
            ids.iter()
                .filter_map(|&id| self.token_bytes(id))
                .enumerate()
                .map(|(i, p)| match (i, strip) {
                    (0, true) => p.strip_prefix(b" ").unwrap_or(p),
                    _ => p,
                }),
        )
    }

    /// The id of the token whose bytes are `key`.
    fn lookup(&self, key: &[u8]) -> Option<u32> {
        self.index.get(
            Arena {
                bytes: &self.bytes,
                offsets: &self.offsets,
            },
            key,
        )
    }

    /// The bytes token `id` stands for (`" Paris"` for Qwen's 12095), if `id` is in the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        Some(&self.bytes[start as usize..end as usize])
    }

    /// True for a control or user-defined token (`<|im_end|>`, `<|fim_prefix|>`): text that
    /// only special-token parsing yields, never what plain text encodes to.
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.tokens.iter().any(|(_, t)| *t == id)
    }

    /// Every special id ([`Tokenizer::is_special`]), sorted.
    pub fn special_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.specials.tokens.iter().map(|(_, id)| *id).collect();
        v.sort_unstable();
        v
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// True if `id` ends generation: the eos token, or a control token such as `<|im_end|>`,
    /// `<|endoftext|>` or `<|eot_id|>`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// Whether the model asks for a bos token in front of a prompt (`add_bos_token`).
    pub fn add_bos_default(&self) -> bool {
        self.add_bos && self.bos.is_some()
    }

    /// The id of the token whose text is exactly `text` (`" Paris"`, `"<|im_end|>"`): the
    /// decoded text, not the vocabulary's `Ġ`-spelling.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.lookup(text.as_bytes())
    }
}

/// Buffers of one `encode` call.
#[derive(Default)]
struct PlainScratch {
    bpe: Scratch,
    spm: SpmScratch,
}

/// Finds special tokens in text, leftmost first and longest at a position.
struct SpecialMatcher {
    /// `(bytes, id)`, longest first.
    tokens: Vec<(Box<[u8]>, u32)>,
    /// Indices into `tokens` of those starting with each byte, longest first. (256,)
    by_first: Vec<Vec<u32>>,
}

impl SpecialMatcher {
    fn new<'a>(tokens: impl Iterator<Item = (&'a [u8], u32)>) -> SpecialMatcher {
        let mut tokens: Vec<(Box<[u8]>, u32)> = tokens
            .filter(|(t, _)| !t.is_empty())
            .map(|(t, id)| (Box::from(t), id))
            .collect();
        // Longest first; equal texts keep the lowest id first.
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let mut by_first = vec![Vec::new(); 256];
        for (i, (t, _)) in tokens.iter().enumerate() {
            by_first[usize::from(t[0])].push(i as u32);
        }
        SpecialMatcher { tokens, by_first }
    }

    /// `(start, len, id)` of each non-overlapping match, in order.
    fn find_all<'s>(&'s self, text: &'s [u8]) -> impl Iterator<Item = (usize, usize, u32)> + 's {
        let mut pos = 0;
        std::iter::from_fn(move || {
            if self.tokens.is_empty() {
                return None;
            }
            while pos < text.len() {
                let at = pos;
                let hit = self.by_first[usize::from(text[at])].iter().find_map(|&i| {
                    let (t, id) = &self.tokens[i as usize];
                    text[at..].starts_with(t).then_some((at, t.len(), *id))
                });
                match hit {
                    Some(h) => {
                        pos = at + h.1;
                        return Some(h);
                    }
                    None => pos += 1,
                }
            }
            None
        })
    }
}

/// A hash map keyed by short byte strings and id pairs, with a fast non-cryptographic hash.
/// (The keys come from the model file, not from users, so flooding is not a concern.)
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

/// The multiply-rotate hash of Firefox and rustc: one multiply per 8 bytes.
#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(FX_SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// The text of a run of token pieces (each token's bytes, as [`Tokenizer::token_bytes`] and
/// `GET /vocab` give them): their bytes joined, lossy at an incomplete character. The one
/// detokenizer for BPE and SentencePiece vocabularies (both store a token's text as bytes),
/// used by the station and by a gateway holding only `/vocab`.
pub fn decode_pieces<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut buf = Vec::new();
    for b in pieces {
        buf.extend_from_slice(b);
    }
    match String::from_utf8(buf) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests;
