//! Posting the probe's residue to the foil collector when `GNOSIS_FOIL_CACHE_URL` is set.
//! The collector is an observer: it never changes the verdict, and an unreachable one is a
//! warning.

use std::path::Path;

use foil_control::client;
use foil_control::record::{ResidueRecord, TopK};

use aeon_grant::ProbeReport;

/// Environment variable naming the collector's base URL.
pub const FOIL_URL_ENV: &str = "GNOSIS_FOIL_CACHE_URL";

/// Admits `report` to the collector named by the environment, logging the outcome on stderr.
/// `file` is the model file the probe ran (`--dense`), `None` for a station or a mesh.
pub fn admit_if_configured(report: &ProbeReport, file: Option<&Path>) {
    let Ok(url) = std::env::var(FOIL_URL_ENV) else {
        return;
    };
    if url.trim().is_empty() {
        return;
    }
    let mut rec = ResidueRecord::dense(
        &collector_model(file, report.model_id.as_deref().unwrap_or_default()),
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

/// The MODEL part of the collector key `MODEL:dense:TOKENS`: the model file's stem when the
/// probe ran a file (`qwen05-dense.knot` -> `qwen05-dense`, as the seed report's lookups
/// expect), else the slug of the model id the station reports.
pub fn collector_model(file: Option<&Path>, model_id: &str) -> String {
    file.and_then(Path::file_stem)
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| model_slug(model_id))
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

    /// Issue 18 item 6: the seed's probe of `qwen05-dense.knot` logs
    /// `key=qwen05-dense:dense:785,...`, the file's stem, not the model id.
    #[test]
    fn collector_key_names_the_model_file() {
        use std::path::Path;
        let id = "Qwen2.5 Coder 0.5B Instruct AWQ";
        let m = super::collector_model(Some(Path::new("/models/qwen05-dense.knot")), id);
        assert_eq!(m, "qwen05-dense");
        assert_eq!(
            foil_control::record::ResidueRecord::dense_key(&m, &[785, 6722, 315, 9625, 374]),
            "qwen05-dense:dense:785,6722,315,9625,374"
        );
        // Over a station or a mesh there is no file: the model id's slug.
        assert_eq!(
            super::collector_model(None, id),
            "qwen2.5-coder-0.5b-instruct-awq"
        );
    }
}
