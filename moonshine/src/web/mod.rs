//! The gateway's web page (`GET /`): chat with streaming, sampling settings and a live view
//! of the mesh, written by hand in plain HTML, JavaScript and CSS, embedded in the binary
//! (no build step, nothing fetched from elsewhere). The page talks to the gateway's own
//! routes only: `/v1/models`, `/v1/chat/completions` (`stream: true`) and `/mesh`.
//!
//! This module owns the page's routes ([`asset`]) and the shape of `/mesh`
//! ([`MeshView`]); `serve.rs` dispatches to them and fills the view from its state.
//!
//! Security: every asset goes out with `Content-Security-Policy: default-src 'self'`
//! (no inline script or style, no other origin, no framing) and `X-Content-Type-Options:
//! nosniff`; the script writes model text with `textContent` only. The assets are public
//! constants, so they are served without the API key (a browser cannot send one on a
//! navigation); the page asks for the key and sends it on its API calls, which stay behind
//! `--api-key` like every other route.

pub mod markdown;

use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde::Serialize;

use crate::generate::Timing;

/// One embedded file of the page.
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static str,
}

/// The page's files by route.
const ASSETS: &[(&str, Asset)] = &[
    (
        "/",
        Asset {
            content_type: "text/html; charset=utf-8",
            body: include_str!("index.html"),
        },
    ),
    (
        "/app.js",
        Asset {
            content_type: "text/javascript; charset=utf-8",
            body: include_str!("app.js"),
        },
    ),
    (
        "/app.css",
        Asset {
            content_type: "text/css; charset=utf-8",
            body: include_str!("app.css"),
        },
    ),
    (
        "/favicon.svg",
        Asset {
            content_type: "image/svg+xml",
            body: include_str!("favicon.svg"),
        },
    ),
];

/// The page's routes (for the route table and the request metrics' labels).
pub fn routes() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|(p, _)| *p)
}

/// The embedded file served at `path`, if any.
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|(p, _)| *p == path).map(|(_, a)| a)
}

/// The policy of every page asset: only this origin's scripts, styles, images and
/// connections; no `<base>` rewriting, no form posts elsewhere, no framing (clickjacking).
pub const CSP: &str =
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Sets the headers every page asset carries: its type, the CSP, `nosniff`, no referrer,
/// and revalidation (a new gateway binary serves a new page).
pub fn asset_headers(h: &mut HeaderMap, a: &Asset) {
    h.insert(CONTENT_TYPE, HeaderValue::from_static(a.content_type));
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert("cache-control", HeaderValue::from_static("no-cache"));
}

/// What the last finished generation cost, as the mesh view shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LastGeneration {
    /// Compute ms per token step on each forward hop, in chain order: the decode steps'
    /// mean, or the prefill's when nothing was decoded after it.
    pub hop_ms: Vec<f64>,
    /// The entry station's `/embed` and the exit station's `/lm-head`, ms per step (same rule).
    pub embed_ms: f64,
    pub head_ms: f64,
    /// Generated tokens (end-of-generation ids included).
    pub tokens: usize,
    /// Tokens after the first, per second of decoding; `None` with fewer than two tokens.
    pub tokens_per_s: Option<f64>,
    /// When it ended, seconds since the Unix epoch.
    pub finished: u64,
}

impl LastGeneration {
    /// From the station compute after the prefill (`prefill`) and at the end (`whole`, which
    /// includes the prefill's), the tokens generated and the decoding's wall time.
    pub fn new(
        prefill: &Timing,
        whole: &Timing,
        tokens: usize,
        decode_s: f64,
        finished: u64,
    ) -> LastGeneration {
        let decode_steps = whole.steps.saturating_sub(prefill.steps);
        // Per-step means over the decode steps (what a token costs on each hop); the
        // prefill's (per step of up to PREFILL_STEP tokens) when it was all there was.
        let zero = Timing::default();
        let (before, end, steps) = if decode_steps > 0 {
            (prefill, whole, decode_steps)
        } else {
            (&zero, prefill, prefill.steps.max(1))
        };
        let per = |after: f64, before: f64| (after - before).max(0.0) / steps as f64;
        let hop_ms = end
            .hops
            .iter()
            .enumerate()
            .map(|(i, h)| per(h.2, before.hops.get(i).map_or(0.0, |b| b.2)))
            .collect();
        LastGeneration {
            hop_ms,
            embed_ms: per(end.embed_ms, before.embed_ms),
            head_ms: per(end.head_ms, before.head_ms),
            tokens,
            tokens_per_s: (tokens >= 2 && decode_s > 0.0).then(|| (tokens - 1) as f64 / decode_s),
            finished,
        }
    }
}

/// One hop of a chain as `/mesh` shows it.
#[derive(Clone, Debug, Serialize)]
pub struct HopView {
    pub hop: usize,
    pub url: String,
    /// The blocks the chain gives it, `a-b` (half-open).
    pub layers: String,
    /// `ok` or `down` (its `/health` failed or does not serve its blocks).
    pub status: &'static str,
    /// Why it is down.
    pub error: Option<String>,
    /// Its own `role` (`entry`, `mid`, `exit`, `full`) and live KV sessions, when it answered.
    pub role: Option<String>,
    pub sessions: Option<usize>,
    /// Compute ms per token on this hop in the last generation.
    pub ms_per_token: Option<f64>,
}

/// One chain of stations (the gateway drives one; a list so replicas fit later).
#[derive(Clone, Debug, Serialize)]
pub struct ChainView {
    pub hops: Vec<HopView>,
}

/// `GET /mesh`: the chain(s), each hop's health and cost, and the gateway's throughput.
#[derive(Clone, Debug, Serialize)]
pub struct MeshView {
    pub model: String,
    pub chains: Vec<ChainView>,
    /// The last generation's decoding speed, tokens/s.
    pub tokens_per_s: Option<f64>,
    pub generations_active: usize,
    pub completion_tokens_total: u64,
    pub last: Option<LastGeneration>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(hops: &[f64], steps: usize) -> Timing {
        Timing {
            embed_ms: steps as f64,
            hops: hops
                .iter()
                .enumerate()
                .map(|(i, &ms)| (format!("http://h{i}"), format!("{i}-{}", i + 1), ms))
                .collect(),
            head_ms: 2.0 * steps as f64,
            steps,
        }
    }

    #[test]
    fn per_hop_cost_is_the_decode_steps_mean_without_the_prefill() {
        // Prefill: one step, 50 ms on hop 0; then 10 decode steps of 3 ms (hop 0) and 5 ms.
        let prefill = timing(&[50.0, 80.0], 1);
        let whole = timing(&[80.0, 130.0], 11);
        let g = LastGeneration::new(&prefill, &whole, 11, 0.5, 7);
        assert_eq!(g.hop_ms, vec![3.0, 5.0]);
        assert_eq!((g.embed_ms, g.head_ms), (1.0, 2.0));
        assert_eq!(g.tokens_per_s, Some(20.0));
    }

    #[test]
    fn a_generation_without_decode_steps_shows_the_prefill() {
        let prefill = timing(&[40.0], 2);
        let g = LastGeneration::new(&prefill, &prefill, 1, 0.0, 7);
        assert_eq!(g.hop_ms, vec![20.0]);
        assert_eq!(g.tokens_per_s, None);
    }

    #[test]
    fn every_asset_carries_the_policy_and_nosniff() {
        for p in routes() {
            let a = asset(p).expect("asset");
            let mut h = HeaderMap::new();
            asset_headers(&mut h, a);
            assert_eq!(h["content-security-policy"], CSP);
            assert!(CSP.starts_with("default-src 'self'"));
            assert_eq!(h["x-content-type-options"], "nosniff");
        }
        assert!(asset("/nope").is_none());
    }

    #[test]
    fn the_page_has_no_inline_script_or_model_text_through_inner_html() {
        let html = asset("/").expect("page").body;
        // CSP default-src 'self' blocks inline code: every script is a file of ours.
        assert!(!html.contains("<script>"), "inline script");
        // No `onclick=`-style handler attributes.
        let handler = html.split(" on").skip(1).any(|rest| {
            let name: String = rest.chars().take_while(char::is_ascii_lowercase).collect();
            !name.is_empty() && rest[name.len()..].starts_with('=')
        });
        assert!(!handler, "inline handler attribute");
        assert!(!html.contains("style="), "inline style");
        let js = asset("/app.js").expect("script").body;
        assert!(
            !js.contains("innerHTML"),
            "model text must go through textContent"
        );
        assert!(!js.contains("eval("));
    }
}
