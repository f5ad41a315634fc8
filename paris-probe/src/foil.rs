//! Posting the probe's residue to the foil collector when `GNOSIS_FOIL_CACHE_URL` is set.
//! The collector is an observer: it never changes the verdict, and an unreachable one is a
//! warning.

use foil_control::client;
use foil_control::record::{ResidueRecord, TopK};

use crate::Report;

/// Environment variable naming the collector's base URL.
pub const FOIL_URL_ENV: &str = "GNOSIS_FOIL_CACHE_URL";

/// Admits `report` to the collector named by the environment, logging the outcome on stderr.
pub fn admit_if_configured(report: &Report) {
    let Ok(url) = std::env::var(FOIL_URL_ENV) else {
        return;
    };
    if url.trim().is_empty() {
        return;
    }
    let mut rec = ResidueRecord::dense(
        &model_slug(&report.model_id),
        &report.tokens,
        report.argmax,
        report.logit,
    );
    rec.top_k = report
        .top
        .iter()
        .map(|c| TopK {
            id: c.id,
            logit: c.logit,
        })
        .collect();
    match client::admit(&url, &rec) {
        Ok(o) => eprintln!("foil-cache-admit: status={} key={}", o.status, o.key),
        Err(e) => {
            eprintln!("foil-cache-admit: warning: collector {url} unreachable or refused: {e}")
        }
    }
}

/// The model id as a URL-safe key part: `Qwen2.5 Coder 0.5B` -> `qwen2.5-coder-0.5b`.
pub fn model_slug(id: &str) -> String {
    let s: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    #[test]
    fn slugs_are_url_safe() {
        assert_eq!(
            super::model_slug("Qwen2.5 Coder 0.5B Instruct AWQ"),
            "qwen2.5-coder-0.5b-instruct-awq"
        );
        assert_eq!(super::model_slug("  a//b "), "a-b");
    }
}
