//! What a quality probe reports: `paris-probe --json` writes it, monster-guard reads and judges
//! it (the contract in `specs/qspec.md`), and the grant keeps a
//! [`ProbeSummary`](crate::ProbeSummary) of the judgement. One type for both ends, so writer and
//! reader cannot drift apart.
//!
//! Figures are f32, as the engine computes them: what the probe printed is what is judged.
//! Fields a probe may leave out (another probe program, an older paris-probe) have defaults.

use serde::{Deserialize, Serialize};

/// One probe run's figures and its own verdict.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeReport {
    #[serde(default)]
    pub model_id: Option<String>,
    /// The judged model's hash (`knot_format::ModelHash` hex): monster-guard refuses a report
    /// about another model than the one it was asked to judge.
    #[serde(default)]
    pub model_hash: Option<String>,
    #[serde(default)]
    pub tokens: Vec<u32>,
    pub argmax: u32,
    #[serde(default)]
    pub argmax_text: Option<String>,
    /// The argmax's logit.
    pub logit: f32,
    pub expected: u32,
    #[serde(default)]
    pub expected_text: Option<String>,
    pub expected_logit: f32,
    /// 0 when the expected token is the argmax.
    pub expected_rank: u32,
    /// Expected logit minus the best other logit (negative when it is not the argmax).
    pub margin: f32,
    #[serde(default)]
    pub top: Vec<TopEntry>,
    /// Mean negative log-likelihood (nats/token) of the perplexity passage.
    #[serde(default)]
    pub nll: Option<f32>,
    #[serde(default)]
    pub nll_tokens: Option<u32>,
    /// The probe's own verdict (argmax == expected).
    #[serde(default)]
    pub pass: Option<bool>,
}

/// One entry of the report's `top` list.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopEntry {
    pub id: u32,
    pub logit: f32,
    #[serde(default)]
    pub text: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minimal_report_reads_and_a_full_one_round_trips() {
        let min: ProbeReport = serde_json::from_str(
            r#"{"argmax":12095,"logit":14.34,"expected":12095,"expected_logit":14.34,"expected_rank":0,"margin":2.5}"#,
        )
        .expect("parse");
        assert_eq!((min.argmax, min.margin, min.pass), (12095, 2.5, None));
        let full = ProbeReport {
            model_id: Some("m".into()),
            top: vec![TopEntry {
                id: 1,
                logit: 0.25,
                text: Some(" Paris".into()),
            }],
            pass: Some(true),
            ..min
        };
        let text = serde_json::to_string(&full).expect("write");
        assert!(
            text.contains(r#""logit":14.34"#),
            "f32 figures print short: {text}"
        );
        assert_eq!(
            serde_json::from_str::<ProbeReport>(&text).expect("parse"),
            full
        );
    }
}
