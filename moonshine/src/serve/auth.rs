//! Who may call: CORS origins and the preflight, the bearer key (compared whole).

use super::*;

/// The request's `Origin` when `--allowed-origins` lists it (or `*`): the value of
/// `Access-Control-Allow-Origin` for the answer.
pub(super) fn allowed_origin<B>(allowed: &[String], req: &Request<B>) -> Option<HeaderValue> {
    let o = req.headers().get(hyper::header::ORIGIN)?;
    let s = o.to_str().ok()?;
    allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/') == s)
        .then(|| o.clone())
}

/// A CORS preflight (`OPTIONS`): which methods and headers a browser may use; the
/// allow-origin header is added by [`handle`] for an allowed origin only. No key is asked
/// (browsers send none on a preflight). The headers asked for are allowed back as asked
/// (the OpenAI JS SDK sends `x-stainless-*` ones, a list no fixed answer keeps up with; a
/// `*` would not cover `authorization`); a request naming none gets the two the API reads.
pub(super) fn preflight<B>(req: &Request<B>) -> Resp {
    // 200, not 204: both are a preflight's success, and llama-server's clients check for 200.
    let mut r = Response::new(Full::new(Bytes::new()).boxed());
    let asked = req
        .headers()
        .get("access-control-request-headers")
        .filter(|v| {
            // Header names, commas and spaces only: nothing else is echoed back.
            v.as_bytes().iter().all(|&c| {
                c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b',' | b' ' | b'.')
            }) && !v.is_empty()
        })
        .cloned();
    let h = r.headers_mut();
    h.insert(
        "access-control-allow-methods",
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    h.insert(
        "access-control-allow-headers",
        asked.unwrap_or(HeaderValue::from_static("authorization, content-type")),
    );
    h.insert("access-control-max-age", HeaderValue::from_static("600"));
    if req.headers().contains_key("access-control-request-headers") {
        // The answer depends on what was asked: caches keep one per list.
        h.insert(
            "vary",
            HeaderValue::from_static("access-control-request-headers"),
        );
    }
    r
}

/// With `--api-key`, every route but `/health` and the web page's files needs
/// `Authorization: Bearer KEY` (or Anthropic's `x-api-key: KEY`); else 401 in OpenAI's shape (`invalid_api_key`). The page's
/// files are public constants (a browser sends no key when it opens a page); the page sends
/// the key on its calls to the API and `/mesh`.
pub(super) fn authorize<B>(st: &AppState, req: &Request<B>, path: &str) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    if path == "/health" || (req.method() == Method::GET && web::asset(path).is_some()) {
        return Ok(());
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        // Anthropic's clients send the key as `x-api-key`.
        .or_else(|| req.headers().get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim);
    if given.is_some_and(|g| same_secret(g.as_bytes(), key.as_bytes())) {
        return Ok(());
    }
    Err(ApiError {
        status: StatusCode::UNAUTHORIZED,
        kind: "invalid_request_error",
        code: Some("invalid_api_key"),
        param: None,
        message: match given {
            None => "no API key: send Authorization: Bearer KEY".into(),
            Some(_) => "incorrect API key".into(),
        },
    })
}

/// Compares two secrets in time independent of where they differ.
pub(super) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
