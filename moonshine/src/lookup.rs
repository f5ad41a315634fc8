//! Prompt-lookup drafts for speculative decoding over the chain (`--lookup`).
//!
//! A chain trip costs every hop's link latency whether it carries one token or eight, so the
//! client guesses the next few tokens for free and lets the stations check them in one
//! batch: it finds the most recent earlier occurrence of the context's last n-gram (prompt
//! plus generated text) and proposes the tokens that followed it. Code edits ("repeat this
//! function with one change") and quotations repeat long runs of the prompt, so drafts hit;
//! free prose rarely matches and sends no drafts at all.
//!
//! Lossless: [`crate::generate`] keeps a drafted token only when the sampler picks it from
//! the logits of the position before it ([`crate::sampling::Sampler::sample_or_accept`]):
//! greedy output is the same token for token, sampled output has the same distribution.

/// How drafts are made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupParams {
    /// Most tokens drafted per trip (the stations then run `draft + 1` rows).
    pub draft: usize,
    /// Longest n-gram matched (tried first).
    pub ngram_max: usize,
    /// Shortest n-gram matched; below it nothing is drafted.
    pub ngram_min: usize,
}

/// Most drafted tokens per trip (`X-Logit-Rows` allows 64 rows; the kernels batch 8 rows
/// per weight tile, so more than 7 drafts rarely pays).
pub const MAX_DRAFT: usize = 32;

impl Default for LookupParams {
    fn default() -> Self {
        LookupParams {
            draft: 7,
            ngram_max: 3,
            ngram_min: 2,
        }
    }
}

/// `--lookup` flags, shared by generation and `moonshine serve`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct LookupArgs {
    /// Speculative decoding with prompt-lookup drafts: guess the next tokens from an earlier
    /// place where the last few tokens occurred and verify them in one chain trip. Greedy
    /// output is unchanged; sampled output keeps its distribution (not the same text for a
    /// seed). Pays on code edits and quotations, costs a little compute elsewhere.
    #[arg(long)]
    pub lookup: bool,
    /// With --lookup: most tokens drafted per trip (1-32).
    #[arg(long, default_value_t = 7, requires = "lookup")]
    pub lookup_draft: usize,
    /// With --lookup: longest n-gram to match (shorter ones down to 2 are tried next; 1-8).
    #[arg(long, default_value_t = 3, requires = "lookup")]
    pub lookup_ngram: usize,
}

impl LookupArgs {
    /// The checked parameters, `None` when lookup is off.
    pub fn params(&self) -> Result<Option<LookupParams>, String> {
        if !self.lookup {
            return Ok(None);
        }
        if !(1..=MAX_DRAFT).contains(&self.lookup_draft) {
            return Err(format!(
                "--lookup-draft must be 1-{MAX_DRAFT}, got {}",
                self.lookup_draft
            ));
        }
        if !(1..=8).contains(&self.lookup_ngram) {
            return Err(format!(
                "--lookup-ngram must be 1-8, got {}",
                self.lookup_ngram
            ));
        }
        Ok(Some(LookupParams {
            draft: self.lookup_draft,
            ngram_max: self.lookup_ngram,
            ngram_min: self.lookup_ngram.min(2),
        }))
    }
}

/// Up to `most` tokens that followed the most recent earlier occurrence of the last n-gram
/// of `context`, for n from `p.ngram_max` down to `p.ngram_min`; empty when none matches.
pub fn draft(context: &[u32], p: &LookupParams, most: usize) -> Vec<u32> {
    let most = most.min(p.draft);
    if most == 0 {
        return Vec::new();
    }
    let len = context.len();
    for n in (p.ngram_min.max(1)..=p.ngram_max).rev() {
        if len <= n {
            continue;
        }
        let tail = &context[len - n..];
        // Start positions of earlier occurrences, newest first (the tail itself excluded).
        if let Some(i) = (0..len - n).rev().find(|&i| &context[i..i + n] == tail) {
            let from = i + n;
            return context[from..(from + most).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> LookupParams {
        LookupParams::default()
    }

    #[test]
    fn drafts_what_followed_the_last_trigram() {
        // ... 1 2 3 4 5 6 ... 1 2 3 -> 4 5 6 ...
        let c = [9, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3];
        assert_eq!(draft(&c, &p(), 7), [4, 5, 6, 7, 8, 0, 1]);
        assert_eq!(draft(&c, &p(), 2), [4, 5]);
        assert!(draft(&c, &p(), 0).is_empty());
    }

    #[test]
    fn the_newest_occurrence_wins_and_drafts_stop_at_the_end() {
        let c = [1, 2, 7, 1, 2, 8, 1, 2];
        // Bigram (1, 2) last seen before the tail at index 3: followed by 8, 1, 2.
        assert_eq!(draft(&c, &p(), 7), [8, 1, 2]);
    }

    #[test]
    fn a_longer_match_is_preferred_to_a_newer_shorter_one() {
        // Trigram (5, 1, 2) occurs at 0 (followed by 3); bigram (1, 2) also at 5 (then 4).
        let c = [5, 1, 2, 3, 0, 1, 2, 4, 5, 1, 2];
        assert_eq!(draft(&c, &p(), 1), [3]);
    }

    #[test]
    fn no_match_or_a_unigram_only_drafts_nothing() {
        assert!(draft(&[1, 2, 3, 4], &p(), 7).is_empty());
        // Only the last token (4) repeats: below the shortest n-gram.
        assert!(draft(&[4, 1, 2, 3, 4], &p(), 7).is_empty());
        assert!(draft(&[], &p(), 7).is_empty());
        assert!(draft(&[1], &p(), 7).is_empty());
    }

    #[test]
    fn flags_are_checked() {
        let a = |lookup, d, n| LookupArgs {
            lookup,
            lookup_draft: d,
            lookup_ngram: n,
        };
        assert_eq!(a(false, 0, 0).params(), Ok(None));
        assert_eq!(a(true, 7, 3).params(), Ok(Some(p())));
        assert!(a(true, 0, 3).params().is_err());
        assert!(a(true, 33, 3).params().is_err());
        assert!(a(true, 7, 0).params().is_err());
        assert_eq!(
            a(true, 4, 1).params().map(|p| p.map(|p| p.ngram_min)),
            Ok(Some(1))
        );
    }
}
