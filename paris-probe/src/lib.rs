//! The quality probe: run a prompt through a model (in-process or over a station chain),
//! take the argmax of the next token and compare it with the expected token.
//!
//! The JSON report ([`Report`]) is the contract `monster-guard` reads (`specs/qspec.md`).

pub mod cli;
pub mod foil;

use std::time::Duration;

use aeon_grant::{ProbeReport, TopEntry};
use anyhow::{anyhow, bail, Context, Result};
use fat_station::client::{Chain, StepTrace};
use fat_station::engine::sampling::{self, Candidate};
use fat_station::engine::tokenizer::Tokenizer;
use fat_station::engine::Model;
use fat_station::mesh::mesh_file::MeshFile;
use knot_format::Knot;

/// Where the logits come from.
pub enum Source<'a> {
    /// A model file run in this process.
    Dense(&'a Model<'a>, Option<Box<Tokenizer>>),
    /// A chain of stations.
    Chain(Box<Chain>),
}

/// What to ask.
#[derive(Clone, Debug)]
pub struct Question {
    pub tokens: Option<Vec<u32>>,
    pub prompt: Option<String>,
    pub expected: Option<u32>,
    pub expect_text: Option<String>,
    pub top_k: usize,
    pub perplexity_text: Option<String>,
}

/// The probe's verdict and the figures behind it: the report `--json` prints (one type with
/// monster-guard, which judges it) and the final logits, kept for the verdict line and the foil
/// collector but not printed.
#[derive(Clone, Debug)]
pub struct Report {
    pub probe: ProbeReport,
    pub logits: Vec<f32>,
}

impl Source<'_> {
    fn model_id_hash(&self) -> Result<(String, String)> {
        Ok(match self {
            Source::Dense(m, _) => (
                m.knot().header().model_id.clone(),
                m.knot().model_hash().to_string(),
            ),
            Source::Chain(c) => {
                let h = c.entry().health()?;
                (h.model_id, h.model_hash)
            }
        })
    }

    /// `text`'s ids; with `prompt`, led by bos when the model asks for one (Gemma does:
    /// without `<bos>` its logits are noise), else bare (an expectation's first token).
    fn tokenize(&self, text: &str, prompt: bool) -> Result<Vec<u32>> {
        match self {
            Source::Dense(_, Some(t)) => Ok(t.encode(text, prompt && t.add_bos_default())),
            Source::Dense(_, None) => {
                bail!("this model file carries no tokenizer; pass --tokens / --expected ids")
            }
            Source::Chain(c) => Ok(c
                .entry()
                .tokenize(text, if prompt { None } else { Some(false) })?),
        }
    }

    fn token_text(&self, id: u32) -> Option<String> {
        match self {
            Source::Dense(_, Some(t)) => Some(t.decode(&[id])),
            Source::Dense(_, None) => None,
            Source::Chain(c) => c.entry().detokenize(&[id]).ok(),
        }
    }

    /// Last-position logits for `tokens`.
    fn logits(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        match self {
            Source::Dense(m, _) => {
                let mut s = m.new_session(tokens.len());
                Ok(m.logits(&mut s, tokens)?)
            }
            Source::Chain(c) => Ok(c.step(tokens, None, &mut StepTrace::default())?),
        }
    }

    /// Mean NLL of `tokens[1..]` given their prefixes.
    fn nll(&self, tokens: &[u32]) -> Result<f32> {
        if tokens.len() < 2 {
            bail!("the perplexity passage needs at least 2 tokens");
        }
        let mut total = 0.0f64;
        match self {
            Source::Dense(m, _) => {
                // One batched forward, then the head on every prefix's last row.
                let mut s = m.new_session(tokens.len());
                let mut x = m.embed(tokens)?;
                m.forward(&mut s, &mut x, m.holdings().layers)?;
                let h = m.cfg.hidden;
                for i in 0..tokens.len() - 1 {
                    let logits = m.lm_head(&x[..(i + 1) * h])?;
                    total += neg_log_softmax(&logits, tokens[i + 1]);
                }
            }
            Source::Chain(c) => {
                let sid = format!("probe-nll-{}", std::process::id());
                for i in 0..tokens.len() - 1 {
                    let logits = c.step(
                        &tokens[i..i + 1],
                        Some((&sid, i)),
                        &mut StepTrace::default(),
                    )?;
                    total += neg_log_softmax(&logits, tokens[i + 1]);
                }
            }
        }
        Ok((total / (tokens.len() - 1) as f64) as f32)
    }
}

/// `-log softmax(logits)[target]`, in f64.
pub fn neg_log_softmax(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let l = logits
        .get(target as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY) as f64;
    -(l - max - sum.ln())
}

/// The largest finite logit and its id (lowest id on ties); `None` when no logit is finite.
/// NaN and infinities are skipped, so a broken row cannot hide behind them.
pub fn max_finite(logits: &[f32]) -> Option<(u32, f32)> {
    let mut best: Option<(u32, f32)> = None;
    for (i, &l) in logits.iter().enumerate() {
        if l.is_finite() && best.is_none_or(|(_, b)| l > b) {
            best = Some((i as u32, l));
        }
    }
    best
}

/// The `k` largest logits, best first (ties: lower id first): the engine's sampler's top-k.
fn top_k(logits: &[f32], k: usize) -> Vec<Candidate> {
    let all = logits
        .iter()
        .enumerate()
        .map(|(i, &p)| Candidate { id: i as u32, p })
        .collect();
    sampling::top_k(all, k)
}

/// Runs the probe.
pub fn probe(src: &Source<'_>, q: &Question) -> Result<Report> {
    let tokens = match (&q.tokens, &q.prompt) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => src.tokenize(p, true)?,
        (None, None) => bail!("give --tokens or --prompt"),
    };
    if tokens.is_empty() {
        bail!("the prompt has no tokens");
    }
    let expected = match (q.expected, &q.expect_text) {
        (Some(e), _) => e,
        (None, Some(t)) => *src
            .tokenize(t, false)?
            .first()
            .ok_or_else(|| anyhow!("--expect {t:?} tokenizes to nothing"))?,
        (None, None) => bail!("give --expected or --expect"),
    };
    let logits = src.logits(&tokens).context("running the model")?;
    // A station is a network peer: refuse a logit vector too short to rank, never index it blindly.
    if logits.len() < 2 {
        bail!(
            "the model returned {} logits; a probe needs at least 2",
            logits.len()
        );
    }
    let expected_logit = *logits.get(expected as usize).ok_or_else(|| {
        anyhow!(
            "expected id {expected} is outside the vocabulary ({})",
            logits.len()
        )
    })?;
    let top = top_k(&logits, q.top_k.max(2));
    let (argmax, logit) = (top[0].id, top[0].p);
    // A one-token vocabulary has no runner-up: a margin of 0.
    let runner_up = top.get(1).map_or(logit, |c| c.p);
    let best_other = if argmax == expected { runner_up } else { logit };
    let expected_rank = logits
        .iter()
        .enumerate()
        .filter(|&(i, &l)| l > expected_logit || (l == expected_logit && (i as u32) < expected))
        .count() as u32;
    let (nll, nll_tokens) = match &q.perplexity_text {
        Some(text) => {
            let t = src.tokenize(text, true)?;
            (
                Some(src.nll(&t).context("perplexity probe")?),
                Some(t.len() as u32),
            )
        }
        None => (None, None),
    };
    let (model_id, model_hash) = src.model_id_hash()?;
    Ok(Report {
        probe: ProbeReport {
            model_id: Some(model_id),
            model_hash: Some(model_hash),
            tokens,
            argmax,
            argmax_text: src.token_text(argmax),
            logit,
            expected,
            expected_text: src.token_text(expected),
            expected_logit,
            expected_rank,
            margin: expected_logit - best_other,
            top: top
                .iter()
                .take(q.top_k.max(1))
                .map(|c| TopEntry {
                    id: c.id,
                    logit: c.p,
                    text: src.token_text(c.id),
                })
                .collect(),
            nll,
            nll_tokens,
            pass: Some(argmax == expected),
        },
        logits,
    })
}

/// Opens a model file for an in-process probe (with its tokenizer when it has one).
pub fn open_dense(knot: &Knot) -> Result<(Model<'_>, Option<Tokenizer>)> {
    let model = Model::load(knot, None).context("loading the model")?;
    let tok = match knot.tokenizer().context("reading the tokenizer")? {
        Some(d) => Some(Tokenizer::from_data(&d).context("building the tokenizer")?),
        None => None,
    };
    Ok((model, tok))
}

/// A chain from `--station URL` or `--mesh FILE`.
pub fn open_chain(station: Option<&str>, mesh: Option<&std::path::Path>) -> Result<Chain> {
    let timeout = Duration::from_secs(120);
    match (station, mesh) {
        (Some(url), _) => Ok(Chain::single(url, timeout)?),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let mesh: MeshFile = serde_json::from_str(&text)
                .with_context(|| format!("parsing {}", path.display()))?;
            Ok(Chain::from_mesh(&mesh, timeout)?)
        }
        (None, None) => bail!("give --dense FILE, --station URL or --mesh FILE"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_finite_skips_nan_and_infinities() {
        assert_eq!(
            max_finite(&[1.0, f32::NAN, f32::INFINITY, 3.5, 3.5, f32::NEG_INFINITY]),
            Some((3, 3.5))
        );
        assert_eq!(max_finite(&[f32::NAN, f32::INFINITY]), None);
        assert_eq!(max_finite(&[]), None);
    }

    #[test]
    fn top_k_orders_and_breaks_ties_by_id() {
        let l = [0.5, 3.0, 3.0, -1.0, 2.0];
        let ids: Vec<(u32, f32)> = top_k(&l, 3).iter().map(|c| (c.id, c.p)).collect();
        assert_eq!(ids, vec![(1, 3.0), (2, 3.0), (4, 2.0)]);
    }

    #[test]
    fn nll_of_certain_token_is_small() {
        let l = [100.0, 0.0, 0.0];
        assert!(neg_log_softmax(&l, 0) < 1e-6);
        assert!((neg_log_softmax(&[0.0, 0.0], 1) - std::f64::consts::LN_2).abs() < 1e-9);
    }
}
