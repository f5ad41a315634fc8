//! Generation over a chain of stations: tokenize, prefill into a station-side KV session,
//! sample, decode one token per step, stream text, stop on end-of-generation or stop strings.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use knot_format::LayerRange;
use serde::Serialize;
use station_wire::client::{Answer, Ask, Chain, ClientError, StationClient, StepTrace};
use station_wire::mesh_file::MeshFile;
use station_wire::wire::{self, ChainToken, ExitAsk, Health, SampleSpec, TokenizerInfo};

use crate::chat::{fallback_template, ChatTemplate, Message, TemplateError};
use crate::lookup::{self, LookupParams};
use crate::sampling::{Sampler, SamplingParams, TokenLogprob};
use crate::structured::{GrammarError, Vocab, VocabToken};
use crate::textstream::TextStream;

/// Why generation failed.
#[derive(Debug, thiserror::Error)]
pub enum GenError {
    #[error(transparent)]
    Station(#[from] ClientError),
    #[error("mesh file {path}: {why}")]
    MeshFile { path: String, why: String },
    #[error("discovery on {listen}: {why}")]
    Discovery { listen: String, why: String },
    #[error("no station in the chain serves a tokenizer (use --tokens)")]
    NoTokenizer,
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("station returned {got} logits, expected {want}")]
    BadLogits { got: usize, want: usize },
    /// The exit's picks do not answer the trip (no pick, too many, a kept draft that was not
    /// drafted, an id outside the vocabulary).
    #[error("the chain's exit answered bad picks: {0}")]
    BadPicks(String),
    /// The prompt alone does not fit in the stations' context (`413 context_full` in prefill).
    #[error("the prompt ({prompt} tokens) does not fit in the model's context: {source}")]
    ContextFull { prompt: usize, source: ClientError },
    /// The prompt is longer than the stations' context (their `/health` `max_positions`):
    /// refused before any station compute.
    #[error(
        "the prompt ({prompt} tokens) does not fit in the model's context of {context} positions"
    )]
    PromptTooLong { prompt: usize, context: usize },
    /// The chain does not run the whole model ([`chain_problem`]).
    #[error("the chain is incomplete: {0}")]
    Incomplete(String),
    /// Constrained decoding failed (`response_format`, [`crate::structured`]).
    #[error(transparent)]
    Grammar(#[from] GrammarError),
    /// The caller cancelled during prefill (the client went away).
    #[error("cancelled after {prefilled} prompt tokens were prefilled")]
    Cancelled { prefilled: usize },
}

/// True for the stations' refusal of a step that would pass their `--max-positions`.
fn is_context_full(e: &ClientError) -> bool {
    matches!(e, ClientError::Refused(station_wire::wire::Refusal { status: 413, code, .. }) if code == "context_full")
}

/// Prompt tokens sent per prefill step. Between steps a generation checks whether it was
/// cancelled, so a client that leaves during a long prompt frees the stations within one step
/// (about 2 s for Qwen2.5-0.5B on two cores) rather than after the whole prompt. Smaller steps
/// cost an LM head each and were not slower per token when measured (64, 128, 256).
pub const PREFILL_STEP: usize = 128;

/// Where the stations are.
#[derive(Clone, Debug)]
pub enum Target {
    /// One station serving every layer.
    Station(String),
    /// A mesh file listing stations in layer order.
    Mesh(std::path::PathBuf),
    /// Stations heard on their UDP beacons for `wait`, formed into a chain (the first
    /// complete one when there are replicas).
    Discover {
        listen: std::net::SocketAddr,
        wait: Duration,
    },
}

/// A connected chain plus what generation needs to know about the model.
pub struct Backend {
    pub chain: Chain,
    /// The station that tokenizes (the entry one when it has a tokenizer).
    pub tok: Option<StationClient>,
    /// Special ids and the chat template (`None` without a tokenizer).
    pub info: Option<TokenizerInfo>,
    /// Model name: the mesh file's `model`, else the entry station's `model_id`.
    pub model_id: String,
    /// The chain's context: the fewest positions any hop's sessions hold (`None` when no hop
    /// says, as stations before issue 32 did not).
    pub context: Option<usize>,
    /// The vocabulary size (the entry's `/health`).
    pub vocab_size: usize,
    /// Each token's bytes and whether it is special (the tokenizing station's `/vocab`,
    /// fetched once when first needed): detokenizing needs no station trip.
    vocab_bytes: std::sync::OnceLock<Vec<wire::VocabToken>>,
}

/// What one hop's `/health` says is wrong for the blocks `r` the chain gives it: it does not
/// serve them all, or it is not serving (`None`: fine).
pub fn hop_problem(url: &str, r: LayerRange, h: &Health) -> Option<String> {
    let serves = LayerRange::parse(&h.layers);
    if !serves.is_some_and(|s| s.contains_range(&r)) {
        return Some(format!(
            "{url} serves layers {}, the chain needs {}-{} from it",
            h.layers, r.start, r.end
        ));
    }
    (h.status != "ok").then(|| format!("{url} reports status {:?}", h.status))
}

/// Why a chain of hops `(url, blocks, health)` in layer order does not run the whole model
/// (`None`: it does): each hop serves its blocks, one model throughout, blocks `0..n` all
/// covered, the first hop embeds, the last runs the LM head. The ranges are already known
/// to tile from 0 without gaps ([`Chain::new`]).
pub fn chain_problem(hops: &[(&str, LayerRange, &Health)]) -> Option<String> {
    let (first, last) = (hops.first()?, hops.last()?);
    for &(url, r, h) in hops {
        if let Some(p) = hop_problem(url, r, h) {
            return Some(p);
        }
        if h.model_hash != first.2.model_hash {
            return Some(format!(
                "{url} serves model {} ({}), {} serves {} ({})",
                h.model_id, h.model_hash, first.0, first.2.model_id, first.2.model_hash
            ));
        }
    }
    let n = first.2.n_layers;
    if last.1.end != n {
        return Some(format!(
            "layers {}-{n} of {n} are not served (the last hop, {}, ends at {})",
            last.1.end, last.0, last.1.end
        ));
    }
    if !first.2.serves_embed {
        return Some(format!("{} (the first hop) does not serve /embed", first.0));
    }
    if !last.2.serves_lm_head {
        return Some(format!("{} (the last hop) does not serve /lm-head", last.0));
    }
    None
}

/// A model's fill-in-the-middle control tokens (Qwen2.5-Coder's `<|fim_prefix|>`,
/// `<|fim_suffix|>`, `<|fim_middle|>`), found in its own vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    pub middle: u32,
}

impl Backend {
    /// Connects: checks every hop's health and finds a tokenizer.
    pub fn connect(target: &Target, timeout: Duration) -> Result<Backend, GenError> {
        let (chain, mesh_model) = match target {
            Target::Station(url) => (Chain::single(url, timeout)?, None),
            Target::Mesh(path) => {
                let p = path.display().to_string();
                let text = std::fs::read_to_string(path).map_err(|e| GenError::MeshFile {
                    path: p.clone(),
                    why: e.to_string(),
                })?;
                let mesh: MeshFile =
                    serde_json::from_str(&text).map_err(|e| GenError::MeshFile {
                        path: p,
                        why: e.to_string(),
                    })?;
                (Chain::from_mesh(&mesh, timeout)?, mesh.model.clone())
            }
            Target::Discover { listen, wait } => {
                let err = |why: String| GenError::Discovery {
                    listen: listen.to_string(),
                    why,
                };
                let heard = station_wire::beacon::discover(*listen, *wait)
                    .map_err(|e| err(e.to_string()))?;
                let mesh =
                    station_wire::beacon::form(&heard, None).map_err(|e| err(e.to_string()))?;
                (Chain::from_mesh(&mesh, timeout)?, mesh.model.clone())
            }
        };
        let mut tok = None;
        let mut model_id = None;
        let mut healths = Vec::new();
        for (c, _) in chain.hops() {
            let h = c.health()?;
            model_id.get_or_insert(h.model_id.clone());
            if h.has_tokenizer && tok.is_none() {
                tok = Some(c.clone());
            }
            healths.push(h);
        }
        let hops: Vec<(&str, LayerRange, &Health)> = chain
            .hops()
            .iter()
            .zip(&healths)
            .map(|((c, r), h)| (c.url(), *r, h))
            .collect();
        if let Some(why) = chain_problem(&hops) {
            return Err(GenError::Incomplete(why));
        }
        let info = match &tok {
            Some(t) => Some(t.tokenizer_info()?),
            None => None,
        };
        // One trip per step (POST /chain to the entry) when every station holds exactly its
        // hop's layers; full stations split by a mesh file are driven hop by hop.
        let exact = hops
            .iter()
            .all(|(_, r, h)| LayerRange::parse(&h.layers) == Some(*r));
        chain.set_relay(exact);
        Ok(Backend {
            chain,
            tok,
            info,
            context: healths.iter().filter_map(|h| h.max_positions).min(),
            model_id: mesh_model.or(model_id).unwrap_or_else(|| "unknown".into()),
            vocab_size: healths.first().map_or(0, |h| h.vocab as usize),
            vocab_bytes: Default::default(),
        })
    }

    /// Refuses a prompt of `len` tokens that cannot fit in the chain's context, before any
    /// station computes a position of it.
    pub fn check_context(&self, len: usize) -> Result<(), GenError> {
        match self.context {
            Some(context) if len > context => Err(GenError::PromptTooLong {
                prompt: len,
                context,
            }),
            _ => Ok(()),
        }
    }

    /// The tokenizing station, or [`GenError::NoTokenizer`].
    pub fn tokenizer(&self) -> Result<&StationClient, GenError> {
        self.tok.as_ref().ok_or(GenError::NoTokenizer)
    }

    /// Tokenizes `text` with the model's default BOS rule.
    pub fn tokenize(&self, text: &str, add_bos: Option<bool>) -> Result<Vec<u32>, GenError> {
        Ok(self.tokenizer()?.tokenize(text, add_bos)?)
    }

    /// Every token's bytes (the tokenizing station's `/vocab`, fetched on first use).
    pub fn vocab_bytes(&self) -> Result<&[wire::VocabToken], GenError> {
        if let Some(v) = self.vocab_bytes.get() {
            return Ok(v);
        }
        let v = self.tokenizer()?.vocab()?;
        Ok(self.vocab_bytes.get_or_init(|| v))
    }

    /// Detokenizes `ids` (lossy at an incomplete character) from the `/vocab` bytes, with the
    /// station's own detokenizer ([`aeon_engine::tokenizer::decode_pieces`]): no station trip
    /// per token. Ids outside the vocabulary have no text.
    pub fn detokenize(&self, ids: &[u32]) -> Result<String, GenError> {
        let v = self.vocab_bytes()?;
        Ok(aeon_engine::tokenizer::decode_pieces(
            ids.iter()
                .filter_map(|&id| v.get(id as usize).map(|t| t.bytes.as_slice())),
        ))
    }

    /// One token's text alone (lossy when the token is part of a character).
    pub fn token_text(&self, id: u32) -> Result<String, GenError> {
        self.detokenize(&[id])
    }

    /// The id of `text` when the vocabulary holds it as one token (with special parsing).
    pub fn special_id(&self, text: &str) -> Result<Option<u32>, GenError> {
        let ids = self
            .tokenizer()?
            .tokenize_parts(&[(text, true)], Some(false))?;
        Ok(match ids[..] {
            [id] => Some(id),
            _ => None,
        })
    }

    /// The model's fill-in-the-middle tokens (`<|fim_prefix|>`, `<|fim_suffix|>`,
    /// `<|fim_middle|>`), `None` when its vocabulary lacks any of them.
    pub fn fim_tokens(&self) -> Result<Option<FimTokens>, GenError> {
        let (Some(prefix), Some(suffix), Some(middle)) = (
            self.special_id("<|fim_prefix|>")?,
            self.special_id("<|fim_suffix|>")?,
            self.special_id("<|fim_middle|>")?,
        ) else {
            return Ok(None);
        };
        Ok(Some(FimTokens {
            prefix,
            suffix,
            middle,
        }))
    }

    /// A fill-in-the-middle prompt in the prefix-suffix-middle order Qwen2.5-Coder and
    /// llama.cpp's infill use: `<|fim_prefix|>PREFIX<|fim_suffix|>SUFFIX<|fim_middle|>MIDDLE`,
    /// where MIDDLE is the start of the answer the model continues. The texts are plain (a
    /// `<|fim_suffix|>` typed in the code is text), the model's BOS rule applies.
    pub fn fim_prompt(
        &self,
        fim: FimTokens,
        prefix: &str,
        suffix: &str,
        middle: &str,
        extra: &[(String, String)],
    ) -> Result<Vec<u32>, GenError> {
        let t = self.tokenizer()?;
        let plain = |s: &str| -> Result<Vec<u32>, GenError> {
            if s.is_empty() {
                return Ok(Vec::new());
            }
            Ok(t.tokenize_parts(&[(s, false)], Some(false))?)
        };
        let mut ids = match self.info.as_ref() {
            Some(i) if i.add_bos => i.bos_id.into_iter().collect(),
            _ => Vec::new(),
        };
        if !extra.is_empty() {
            // Other files of the project first, in the repository format Qwen2.5-Coder was
            // trained on (`<|repo_name|>NAME\n`, then `<|file_sep|>PATH\nTEXT` per file); a
            // model without those tokens gets each file as a plain `PATH\nTEXT` block.
            let repo = self.special_id("<|repo_name|>")?;
            let sep = self.special_id("<|file_sep|>")?;
            if let Some(r) = repo {
                ids.push(r);
                ids.extend(plain("project\n")?);
            }
            for (name, text) in extra {
                ids.extend(sep);
                ids.extend(plain(&format!("{name}\n"))?);
                ids.extend(plain(text)?);
                if sep.is_none() && !text.ends_with('\n') {
                    ids.extend(plain("\n")?);
                }
            }
            // The file being edited comes last, unnamed.
            ids.extend(sep);
        }
        ids.push(fim.prefix);
        ids.extend(plain(prefix)?);
        ids.push(fim.suffix);
        ids.extend(plain(suffix)?);
        ids.push(fim.middle);
        ids.extend(plain(middle)?);
        Ok(ids)
    }

    /// The vocabulary for constrained decoding (the tokenizing station's `/vocab`, with the
    /// model's end-of-generation ids).
    pub fn vocab(&self) -> Result<Vocab, GenError> {
        let info = self.info.as_ref().ok_or(GenError::NoTokenizer)?;
        let tokens: Vec<VocabToken> = self
            .vocab_bytes()?
            .iter()
            .map(|t| VocabToken {
                special: t.special,
                bytes: t.bytes.clone(),
            })
            .collect();
        Ok(Vocab::new(&tokens, &info.eog_ids)?)
    }

    /// True when `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.info.as_ref().is_some_and(|i| i.eog_ids.contains(&id))
    }

    /// The model's chat template; when it carries none, Gemma's turn format for a vocabulary
    /// with a `<start_of_turn>` token, else ChatML.
    pub fn chat_template(&self) -> Result<ChatTemplate, GenError> {
        let info = self.info.as_ref().ok_or(GenError::NoTokenizer)?;
        let text = |id: Option<u32>| {
            id.and_then(|i| self.detokenize(&[i]).ok())
                .unwrap_or_default()
        };
        let src = match info.chat_template.as_deref() {
            Some(t) => t,
            None => fallback_template(
                self.tokenize("<start_of_turn>", Some(false))
                    .is_ok_and(|ids| ids.len() == 1),
            ),
        };
        Ok(ChatTemplate::new(
            src,
            &text(info.bos_id),
            &text(info.eos_id),
        )?)
    }

    /// Renders a conversation and tokenizes it (no extra BOS: the template places its own).
    /// Only the template's markup yields special tokens; message content is plain text, so
    /// `<|im_end|>` inside a message stays the characters `<|im_end|>`.
    pub fn chat_tokens(
        &self,
        template: &ChatTemplate,
        messages: &[Message],
    ) -> Result<Vec<u32>, GenError> {
        self.chat_tokens_with_tools(template, messages, None)
    }

    /// [`Backend::chat_tokens`] with the request's `tools` rendered by the template.
    pub fn chat_tokens_with_tools(
        &self,
        template: &ChatTemplate,
        messages: &[Message],
        tools: Option<&serde_json::Value>,
    ) -> Result<Vec<u32>, GenError> {
        let parts = template.render_parts_with_tools(messages, tools, true)?;
        let parts: Vec<(&str, bool)> = parts.iter().map(|(t, m)| (t.as_str(), *m)).collect();
        Ok(self.tokenizer()?.tokenize_parts(&parts, Some(false))?)
    }
}

/// Station compute reported per hop, summed over steps (for `Server-Timing` and metrics).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timing {
    pub embed_ms: f64,
    /// (station url, layers `a-b`, compute ms) per hop.
    pub hops: Vec<(String, String, f64)>,
    pub head_ms: f64,
    /// Chain steps (one per [`PREFILL_STEP`] prompt tokens sent, then one per decoded token).
    pub steps: usize,
}

impl Timing {
    fn add(&mut self, t: &StepTrace) {
        self.embed_ms += t.embed_ms;
        self.head_ms += t.head_ms;
        if self.hops.len() != t.hops.len() {
            self.hops = t
                .hops
                .iter()
                .map(|(u, r, _, _)| (u.clone(), format!("{}-{}", r.start, r.end), 0.0))
                .collect();
        }
        for (acc, (_, _, _, ms)) in self.hops.iter_mut().zip(&t.hops) {
            acc.2 += ms;
        }
        self.steps += 1;
    }

    /// Engine compute over all hops.
    pub fn compute_ms(&self) -> f64 {
        self.embed_ms + self.head_ms + self.hops.iter().map(|h| h.2).sum::<f64>()
    }

    /// `Server-Timing` header value: one entry per hop plus embed and head.
    pub fn server_timing(&self) -> String {
        let mut parts = vec![format!("embed;dur={:.1}", self.embed_ms)];
        for (i, (url, layers, ms)) in self.hops.iter().enumerate() {
            let desc = format!("{url} {layers}").replace(['"', '\\'], "");
            parts.push(format!("hop{i};desc=\"{desc}\";dur={ms:.1}"));
        }
        parts.push(format!("lm-head;dur={:.1}", self.head_ms));
        parts.join(", ")
    }
}

static SESSION_SEQ: AtomicU64 = AtomicU64::new(0);

/// A station-side KV session: an id and the tokens whose keys and values the stations hold.
#[derive(Debug)]
pub struct KvSession {
    pub id: String,
    /// Tokens held by the stations' caches, in order.
    pub cached: Vec<u32>,
}

impl KvSession {
    /// A session with a process-unique id (`prefix-PID-N-NANOS`).
    pub fn new(prefix: &str) -> KvSession {
        let n = SESSION_SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        KvSession::with_id(format!("{prefix}-{}-{n}-{nanos:x}", std::process::id()))
    }

    /// A session with a given id; the stations may still hold older tokens under it, which the
    /// first feed rewinds (`X-Pos` 0 truncates).
    pub fn with_id(id: String) -> KvSession {
        KvSession {
            id,
            cached: Vec::new(),
        }
    }

    /// Makes the stations hold exactly `tokens` and returns the last row's logits and how many
    /// tokens were sent: sends only the part after the longest prefix already cached
    /// (rewinding the rest), [`PREFILL_STEP`] tokens per request, and stops with
    /// [`GenError::Cancelled`] when `cancelled()` turns true between two. A session the
    /// stations lost (evicted, restarted) is re-filled from position 0. `cached` always
    /// matches what the stations hold, also after an error or a cancellation.
    pub fn feed(
        &mut self,
        chain: &Chain,
        tokens: &[u32],
        timing: &mut Timing,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<(Vec<f32>, usize), GenError> {
        match self.feed_ask(chain, tokens, &Ask::Logits { rows: 1 }, timing, cancelled)? {
            (Answer::Logits(l), sent) => Ok((l, sent)),
            (Answer::Picks(_), _) => Err(GenError::BadLogits { got: 0, want: 1 }),
        }
    }

    /// [`KvSession::feed`] answering `ask` from the last request: the logits after each of
    /// the last `rows` tokens, `(rows, vocab)` row-major (fewer rows when fewer tokens had to
    /// be sent; at most [`PREFILL_STEP`]), or the exit's picks over them: one trip verifies a
    /// token plus `rows - 1` drafted ones. The last request always carries at least `rows`
    /// tokens when that many are new; the requests before it ask only the exit's argmax (a
    /// few bytes, discarded).
    pub fn feed_ask(
        &mut self,
        chain: &Chain,
        tokens: &[u32],
        ask: &Ask,
        timing: &mut Timing,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<(Answer, usize), GenError> {
        if tokens.is_empty() {
            return Err(GenError::EmptyPrompt);
        }
        let rows = match ask {
            Ask::Logits { rows } => *rows,
            Ask::Token(a) => a.drafts.len() + 1,
            Ask::Hidden => 1,
        };
        let rows = rows.clamp(1, PREFILL_STEP);
        let mut pos = self
            .cached
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if pos == tokens.len() {
            pos -= 1; // logits need at least one row to run
        }
        self.cached.truncate(pos);
        let (mut answer, mut sent) = (Answer::Logits(Vec::new()), 0);
        let skim = Ask::Token(ExitAsk::default());
        while pos < tokens.len() {
            if cancelled() {
                return Err(GenError::Cancelled { prefilled: sent });
            }
            let mut end = (pos + PREFILL_STEP).min(tokens.len());
            if end < tokens.len() && tokens.len() - end < rows {
                end = tokens.len() - rows; // the last request carries every wanted row
            }
            let last = end == tokens.len();
            let ask = match ask {
                _ if !last => &skim,
                // Fewer tokens to send than rows asked: only the last rows' logits.
                Ask::Logits { rows } if *rows > end - pos => &Ask::Logits { rows: end - pos },
                a => a,
            };
            let mut trace = StepTrace::default();
            match chain.trip(&tokens[pos..end], Some((&self.id, pos)), ask, &mut trace) {
                Ok(a) => answer = a,
                Err(ClientError::Refused(station_wire::wire::Refusal {
                    status: 409,
                    ref code,
                    held,
                    ..
                })) if pos > 0 && sent == 0 && code == "session_mismatch" => {
                    // A hybrid's station went back to its latest checkpoint (`held`), or lost
                    // the session (0): re-send from there. Each retry starts earlier, so this
                    // ends (at 0 at worst).
                    let from = held.filter(|&h| h < pos).unwrap_or(0);
                    tracing::warn!(
                        session = %self.id,
                        "stations hold {from} of {pos} positions; re-sending from there"
                    );
                    pos = from;
                    self.cached.truncate(from);
                    continue;
                }
                Err(e) if is_context_full(&e) => {
                    return Err(GenError::ContextFull {
                        prompt: tokens.len(),
                        source: e,
                    })
                }
                Err(e) => return Err(e.into()),
            }
            timing.add(&trace);
            self.cached.extend_from_slice(&tokens[pos..end]);
            sent += end - pos;
            pos = end;
        }
        Ok((answer, sent))
    }
}

/// How a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Finish {
    /// End-of-generation token or stop string.
    Stop,
    /// `max_tokens` reached, or the stations' context is full (`413 context_full` while
    /// decoding): the text so far is the answer, as OpenAI's `finish_reason: "length"`.
    Length,
    /// The consumer asked to stop (client gone).
    Cancelled,
}

/// One generation's inputs.
#[derive(Clone, Debug)]
pub struct GenRequest {
    /// Tokens the model continues (the whole conversation in chat mode).
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stops: Vec<String>,
    /// Report each generated token's log-probability with this many alternatives (`None`:
    /// none).
    pub logprobs: Option<usize>,
    /// Speculative decoding with prompt-lookup drafts (`--lookup`); `None`: one token per
    /// trip.
    pub lookup: Option<LookupParams>,
    /// Structured output: the grammar every sampled token must keep the text inside (its
    /// mask is applied to the logits before the sampler); `None`: free text.
    pub grammar: Option<crate::structured::Grammar>,
}

/// One generation's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct GenOutcome {
    pub text: String,
    /// Every sampled id, including a final end-of-generation id.
    pub tokens: Vec<u32>,
    pub prompt_tokens: usize,
    /// Prompt tokens actually sent (the rest were already cached).
    pub prompt_sent: usize,
    pub finish: Finish,
    /// Per generated token (end-of-generation ids excluded), when asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub logprobs: Vec<TokenLogprob>,
    /// When each id of `tokens` was sampled (for the gateway's latency histograms).
    #[serde(skip)]
    pub token_times: Vec<Instant>,
    pub prefill_s: f64,
    pub decode_s: f64,
    pub timing: Timing,
    /// Chain trips after the prefill (plain decoding: one per token after the first).
    pub trips: usize,
    /// Tokens drafted by prompt lookup and sent for verification.
    pub drafted: usize,
    /// Drafted tokens the sampler kept.
    pub accepted: usize,
    /// Seconds spent computing and applying grammar masks (structured output).
    pub mask_s: f64,
}

impl GenOutcome {
    /// Tokens produced per decode trip (1 for plain decoding; the first token comes with
    /// the prefill and is not counted).
    pub fn tokens_per_trip(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.trips.max(1) as f64
    }

    /// Generated tokens that count (end-of-generation ids excluded).
    pub fn completion_tokens(&self, b: &Backend) -> usize {
        self.tokens.iter().filter(|&&t| !b.is_eog(t)).count()
    }
}

/// Generates from `req` in `session`. `on_text` gets each safe piece of text and returns
/// `false` to cancel. Without a tokenizer, text is empty and only ids are produced.
pub fn generate(
    b: &Backend,
    session: &mut KvSession,
    req: &GenRequest,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenOutcome, GenError> {
    Generation::start(b, session, req, &|| false)?.run(on_text)
}

/// A generation whose prompt is in the stations' KV cache; [`Generation::run`] decodes.
pub struct Generation<'a> {
    b: &'a Backend,
    session: &'a mut KvSession,
    req: &'a GenRequest,
    /// Polled between chain steps; true stops prefill or decoding.
    cancelled: &'a dyn Fn() -> bool,
    /// What the prefill's last trip answered: the first token's logits or the exit's pick.
    first: Answer,
    sampler: Sampler,
    timing: Timing,
    prefill_s: f64,
    already: usize,
}

impl<'a> Generation<'a> {
    /// Prefills: sends the part of the prompt the session does not hold yet. `cancelled` is
    /// polled between chain steps, here and in [`Generation::run`]; true stops the prefill
    /// with [`GenError::Cancelled`].
    pub fn start(
        b: &'a Backend,
        session: &'a mut KvSession,
        req: &'a GenRequest,
        cancelled: &'a dyn Fn() -> bool,
    ) -> Result<Generation<'a>, GenError> {
        let t0 = Instant::now();
        let mut timing = Timing::default();
        b.check_context(req.prompt.len())?;
        let mut sampler = Sampler::new(req.sampling.clone());
        sampler.observe(&req.prompt);
        let ask = exit_ask(&sampler, req, Vec::new());
        let (first, sent) =
            session.feed_ask(&b.chain, &req.prompt, &ask, &mut timing, cancelled)?;
        let already = req.prompt.len() - sent;
        check_answer(b, &first, &[])?;
        Ok(Generation {
            b,
            session,
            req,
            cancelled,
            first,
            sampler,
            timing,
            prefill_s: t0.elapsed().as_secs_f64(),
            already,
        })
    }

    /// Station compute so far (the prefill, before [`Generation::run`]).
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// Prompt tokens that were already cached and not sent.
    pub fn reused(&self) -> usize {
        self.already
    }

    /// Samples and decodes until end-of-generation, a stop string, `max_tokens`, the
    /// stations' context limit ([`Finish::Length`] with the text so far), or cancellation
    /// (`on_text` returning `false`, or `cancelled()` between steps). With
    /// [`GenRequest::lookup`], each trip also carries tokens drafted from the context and
    /// returns logits for every one of them; the sampler keeps the drafts it agrees with
    /// ([`Sampler::sample_or_accept`]) plus one token of its own.
    pub fn run(self, mut on_text: impl FnMut(&str) -> bool) -> Result<GenOutcome, GenError> {
        self.run_with_logprobs(|text, _| on_text(text))
    }

    /// [`Generation::run`] where `on_text` also gets the log-probabilities of the tokens
    /// sampled since its last call (when the request asks for them; a piece of text may
    /// span several tokens, or none when a token completes no character).
    pub fn run_with_logprobs(
        self,
        mut on_text: impl FnMut(&str, &[TokenLogprob]) -> bool,
    ) -> Result<GenOutcome, GenError> {
        let Generation {
            b,
            session,
            req,
            cancelled,
            first,
            mut sampler,
            mut timing,
            prefill_s,
            already,
        } = self;
        let mut grammar = req.grammar.clone();
        let mut mask_s = 0.0;
        let mut stream = TextStream::new(req.stops.clone());
        let mut detok = |ids: &[u32]| {
            if b.tok.is_some() {
                b.detokenize(ids)
            } else {
                Ok(String::new())
            }
        };
        let mut text = String::new();
        let mut tokens = Vec::new();
        let (mut lps, mut lps_sent) = (Vec::new(), 0);
        let mut token_times = Vec::new();
        let t1 = Instant::now();
        let mut finish = Finish::Length;
        let mut context = req.prompt.clone();
        let vocab = b.vocab_size;
        // What the last trip answered, and the drafts it carried: logit row `i` (or pick `i`)
        // is for the position `drafts[i]` was proposed for.
        let mut answer = first;
        let mut drafts: Vec<u32> = Vec::new();
        let (mut trips, mut drafted, mut accepted) = (0, 0, 0);
        'decode: while tokens.len() < req.max_tokens {
            let mut done = false;
            let n = match &answer {
                Answer::Logits(rows) => rows.len() / vocab.max(1),
                Answer::Picks(t) if !t.rows.is_empty() => t.rows.len(),
                Answer::Picks(t) => t.picks.len().max(1),
            };
            for i in 0..n {
                let draft = drafts.get(i).copied();
                let (id, lp) = match &mut answer {
                    Answer::Logits(rows) => {
                        let row = &mut rows[i * vocab..(i + 1) * vocab];
                        if let Some(g) = grammar.as_mut() {
                            let t = Instant::now();
                            g.mask(row)?;
                            mask_s += t.elapsed().as_secs_f64();
                        }
                        sampler.pick(row, draft, req.logprobs)
                    }
                    Answer::Picks(t) if !t.rows.is_empty() => {
                        let mut row = vec![f32::NEG_INFINITY; vocab];
                        for &(id, l) in &t.rows[i] {
                            if let Some(x) = row.get_mut(id as usize) {
                                *x = l;
                            }
                        }
                        let t0 = Instant::now();
                        if let Some(g) = grammar.as_mut() {
                            g.mask(&mut row)?;
                        }
                        mask_s += t0.elapsed().as_secs_f64();
                        if row.iter().any(|&l| l > f32::NEG_INFINITY) {
                            let id = crate::sampling::argmax(&row);
                            sampler.record(id, sampler.rng_state());
                            (id, None)
                        } else {
                            // The grammar allows none of the best: this row's logits whole.
                            // Re-sending `context`'s last token rolls the stations back to
                            // this row's position.
                            let ask = Ask::Logits { rows: 1 };
                            trips += 1;
                            let (mut row, _) = match session.feed_ask(
                                &b.chain,
                                &context,
                                &ask,
                                &mut timing,
                                cancelled,
                            )? {
                                (Answer::Logits(l), sent) if l.len() == vocab => (l, sent),
                                (a, _) => {
                                    check_answer(b, &a, &[])?;
                                    return Err(GenError::BadLogits {
                                        got: 0,
                                        want: vocab,
                                    });
                                }
                            };
                            let t0 = Instant::now();
                            if let Some(g) = grammar.as_mut() {
                                g.mask(&mut row)?;
                            }
                            mask_s += t0.elapsed().as_secs_f64();
                            sampler.pick(&mut row, draft, None)
                        }
                    }
                    Answer::Picks(t) => taken(&mut sampler, t, i, req.logprobs),
                };
                if let Some(g) = grammar.as_mut() {
                    g.consume(id)?;
                }
                tokens.push(id);
                token_times.push(Instant::now());
                if draft == Some(id) {
                    accepted += 1;
                }
                if b.is_eog(id) {
                    finish = Finish::Stop;
                    break 'decode;
                }
                lps.extend(lp);
                let piece = stream.push(id, &mut detok)?;
                if !piece.text.is_empty() {
                    text.push_str(&piece.text);
                    let fresh = &lps[lps_sent..];
                    lps_sent = lps.len();
                    if !on_text(&piece.text, fresh) {
                        finish = Finish::Cancelled;
                        break 'decode;
                    }
                }
                if piece.stopped {
                    finish = Finish::Stop;
                    break 'decode;
                }
                if tokens.len() == req.max_tokens {
                    done = true;
                    break;
                }
                context.push(id);
                if draft != Some(id) {
                    break; // a correction (or the token after the last draft): draft again
                }
            }
            if done {
                break;
            }
            if cancelled() {
                finish = Finish::Cancelled;
                break;
            }
            // The last kept token plus fresh drafts, through `feed`: it sends only what the
            // stations lack (its `X-Pos` rolls back the rejected drafts' keys and values) and
            // re-fills the whole context when a busy station evicted the session.
            drafts = match &req.lookup {
                // A draft is worth sending only while tokens remain to be generated.
                Some(p) => lookup::draft(&context, p, req.max_tokens - tokens.len() - 1),
                None => Vec::new(),
            };
            let mut fed = context.clone();
            fed.extend_from_slice(&drafts);
            let ask = exit_ask(&sampler, req, drafts.clone());
            let mut out = session.feed_ask(&b.chain, &fed, &ask, &mut timing, cancelled);
            if matches!(out, Err(GenError::ContextFull { .. })) && !drafts.is_empty() {
                // The drafts do not fit, the token alone may: decode it as plain decoding would.
                drafts.clear();
                let ask = exit_ask(&sampler, req, Vec::new());
                out = session.feed_ask(&b.chain, &context, &ask, &mut timing, cancelled);
            }
            trips += 1;
            answer = match out {
                Ok((l, _)) => l,
                Err(GenError::ContextFull { .. }) => {
                    tracing::debug!(session = %session.id, "context full: generation ends");
                    break; // finish stays Length
                }
                Err(GenError::Cancelled { .. }) => {
                    finish = Finish::Cancelled;
                    break;
                }
                Err(e) => return Err(e),
            };
            check_answer(b, &answer, &drafts)?;
            drafted += drafts.len();
        }
        if finish != Finish::Cancelled {
            let tail = stream.finish(&mut detok)?;
            if !tail.text.is_empty() {
                text.push_str(&tail.text);
                on_text(&tail.text, &lps[lps_sent..]);
            }
        }
        Ok(GenOutcome {
            text,
            tokens,
            prompt_tokens: req.prompt.len(),
            prompt_sent: req.prompt.len() - already,
            finish,
            logprobs: lps,
            token_times,
            prefill_s,
            decode_s: t1.elapsed().as_secs_f64(),
            timing,
            trips,
            drafted,
            accepted,
            mask_s,
        })
    }
}

/// What a trip asks of the chain's exit: the exit's picks with the sampler's parameters and
/// state (the exit runs the same sampler: same ids, same seed determinism), `drafts` to verify
/// and the logprobs asked. With a grammar (its mask applies here, before the sampler): greedy
/// without logprobs, each row's best candidates; else the logit rows.
fn exit_ask(sampler: &Sampler, req: &GenRequest, drafts: Vec<u32>) -> Ask {
    let p = sampler.params();
    // With a grammar the mask comes first, here: greedy needs only the best tokens (the
    // allowed one among them is the allowed argmax), sampling and logprobs every logit.
    let candidates = match req.grammar {
        Some(_) if p.is_greedy() && req.logprobs.is_none() => Some(GRAMMAR_CANDIDATES),
        Some(_) => {
            return Ask::Logits {
                rows: drafts.len() + 1,
            }
        }
        None => None,
    };
    let st = sampler.state();
    Ask::Token(ExitAsk {
        rows: 0,
        sample: Some(SampleSpec {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            repeat_penalty: p.repeat_penalty,
            repeat_last_n: p.repeat_last_n,
            presence_penalty: p.presence_penalty,
            frequency_penalty: p.frequency_penalty,
            logit_bias: p.logit_bias.clone(),
            rng: st.rng,
            recent: st.recent,
            counts: st.counts,
        }),
        drafts,
        logprobs: req.logprobs,
        candidates,
        hidden: false,
    })
}

/// Best tokens per row a greedy grammar-constrained generation asks of the exit: when the
/// grammar allows none of them, that row's logits are fetched whole (one more trip).
const GRAMMAR_CANDIDATES: usize = 64;

/// Pick `i` of the exit's answer, recorded in `sampler` as if it had picked it (history,
/// counts, the RNG state the exit left), with its log-probabilities when asked. An answer
/// without picks (a station before the exit sampled) is its one argmax token.
fn taken(
    sampler: &mut Sampler,
    t: &ChainToken,
    i: usize,
    logprobs: Option<usize>,
) -> (u32, Option<TokenLogprob>) {
    let rng = t.rng.unwrap_or_else(|| sampler.rng_state());
    let Some(p) = t.picks.get(i) else {
        sampler.record(t.token, rng);
        return (t.token, None);
    };
    sampler.record(p.id, rng);
    let lp = logprobs.map(|_| TokenLogprob {
        id: p.id,
        logprob: p.logprob.unwrap_or(f32::NEG_INFINITY),
        top: p
            .top
            .iter()
            .map(|&(id, v)| (id, v.unwrap_or(f32::NEG_INFINITY)))
            .collect(),
    });
    (p.id, lp)
}

/// Checks that a trip's answer fits the request: `drafts.len() + 1` whole logit rows of the
/// vocabulary, or 1 to `drafts.len() + 1` picks inside it whose every pick but the last kept
/// its draft.
fn check_answer(b: &Backend, a: &Answer, drafts: &[u32]) -> Result<(), GenError> {
    let rows = drafts.len() + 1;
    match a {
        Answer::Logits(l) => {
            if l.len() != rows * b.vocab_size || l.is_empty() {
                return Err(GenError::BadLogits {
                    got: l.len(),
                    want: rows * b.vocab_size,
                });
            }
        }
        Answer::Picks(t) if !t.rows.is_empty() => {
            if t.rows.len() != rows {
                return Err(GenError::BadPicks(format!(
                    "{} candidate rows for {rows}",
                    t.rows.len()
                )));
            }
        }
        Answer::Picks(t) => {
            let ids: Vec<u32> = match t.picks.is_empty() {
                true => vec![t.token],
                false => t.picks.iter().map(|p| p.id).collect(),
            };
            if ids.len() > rows {
                return Err(GenError::BadPicks(format!(
                    "{} picks for {rows} rows",
                    ids.len()
                )));
            }
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= b.vocab_size) {
                return Err(GenError::BadPicks(format!(
                    "token {bad} is outside the vocabulary ({})",
                    b.vocab_size
                )));
            }
            if ids[..ids.len() - 1]
                .iter()
                .zip(drafts)
                .any(|(id, d)| id != d)
            {
                return Err(GenError::BadPicks(
                    "a pick before the last is not its row's draft".into(),
                ));
            }
        }
    }
    Ok(())
}

/// The result of one stateless greedy step (`--oneoff`).
#[derive(Clone, Debug, Serialize)]
pub struct OneOff {
    pub tokens: Vec<u32>,
    pub next_id: u32,
    pub next_text: Option<String>,
    pub logit: f32,
    pub ms: f64,
    pub timing: Timing,
}

/// One stateless step through the chain: the argmax after `tokens`.
pub fn oneoff(b: &Backend, tokens: &[u32]) -> Result<OneOff, GenError> {
    if tokens.is_empty() {
        return Err(GenError::EmptyPrompt);
    }
    let t0 = Instant::now();
    let mut trace = StepTrace::default();
    let ask = Ask::Token(ExitAsk::default());
    let (next_id, logit) = match b.chain.trip(tokens, None, &ask, &mut trace)? {
        Answer::Picks(t) => (t.token, t.logit),
        Answer::Logits(logits) => {
            let id = crate::sampling::argmax(&logits);
            let logit = logits
                .get(id as usize)
                .copied()
                .ok_or(GenError::BadLogits { got: 0, want: 1 })?;
            (id, logit)
        }
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let next_text = match &b.tok {
        Some(_) => Some(b.detokenize(&[next_id])?),
        None => None,
    };
    let mut timing = Timing::default();
    timing.add(&trace);
    Ok(OneOff {
        tokens: tokens.to_vec(),
        next_id,
        next_text,
        logit,
        ms,
        timing,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(layers: &str, embed: bool, head: bool, hash: &str) -> Health {
        Health {
            status: "ok".into(),
            model_id: "m".into(),
            model_hash: hash.into(),
            shard_hash: None,
            arch: "qwen2".into(),
            role: "mid".into(),
            layers: layers.into(),
            n_layers: 24,
            hidden: 896,
            vocab: 1000,
            serves_embed: embed,
            serves_lm_head: head,
            has_tokenizer: embed,
            sessions: 0,
            session_bytes: 0,
            uptime_s: 1.0,
            mesh: None,
            node_id: None,
            max_positions: None,
            kv_bytes_per_position: None,
        }
    }

    #[test]
    fn a_chain_must_cover_every_layer_with_embed_and_head() {
        let r = LayerRange::new;
        let (a, b) = (
            health("0-12", true, false, "h"),
            health("12-24", false, true, "h"),
        );
        assert_eq!(
            chain_problem(&[("A", r(0, 12), &a), ("B", r(12, 24), &b)]),
            None
        );
        let why = chain_problem(&[("A", r(0, 12), &a)]).expect("half a model");
        assert!(why.contains("layers 12-24 of 24 are not served"), "{why}");
        let other = health("12-24", false, true, "other");
        let why =
            chain_problem(&[("A", r(0, 12), &a), ("B", r(12, 24), &other)]).expect("two models");
        assert!(why.contains("B serves model"), "{why}");
        let why =
            chain_problem(&[("A", r(0, 12), &a), ("B", r(12, 24), &a)]).expect("wrong layers");
        assert!(
            why.contains("B serves layers 0-12, the chain needs 12-24"),
            "{why}"
        );
        let headless = health("12-24", false, false, "h");
        let why =
            chain_problem(&[("A", r(0, 12), &a), ("B", r(12, 24), &headless)]).expect("no head");
        assert!(why.contains("does not serve /lm-head"), "{why}");
    }
}
