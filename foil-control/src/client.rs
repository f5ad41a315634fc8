//! Blocking client for the collector: HTTP/1.1 over `ureq` (the workspace's one blocking
//! client), no async runtime needed.
//!
//! ```no_run
//! use foil_control::{client, record::ResidueRecord};
//! let rec = ResidueRecord::dense("qwen2.5-coder-0.5b", &[785, 6722], 12095, 17.25);
//! let out = client::admit("http://127.0.0.1:8886", &rec)?;
//! println!("foil-cache-admit: status={} key={}", out.status, out.key);
//! let hit = client::lookup("http://127.0.0.1:8886", &rec.key)?;
//! assert!(hit.is_some());
//! # Ok::<(), foil_control::client::FoilClientError>(())
//! ```
//!
//! Each call makes one exchange on a fresh connection, with a connect timeout and a
//! read/write timeout ([`Client::new`] defaults: 2 s and 10 s).

use std::io::Read;
use std::time::Duration;

use crate::record::{AdmitResponse, Disposition, ErrorResponse, HealthResponse, ResidueRecord};

/// Path of the admit/lookup endpoint.
pub const CACHE_PATH: &str = "/.aeon/model-forward-cache";
/// Path of the health endpoint.
pub const HEALTH_PATH: &str = "/.aeon/health";
/// Largest response body the client reads.
pub const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Errors of the client. An unreachable collector is `Connect` (or `Resolve`).
#[derive(Debug, thiserror::Error)]
pub enum FoilClientError {
    /// The base URL is not `http://HOST[:PORT][/PREFIX]`.
    #[error("bad collector URL {url:?}: {reason}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The host name did not resolve.
    #[error("cannot resolve {addr}")]
    Resolve {
        /// host:port.
        addr: String,
        /// Cause.
        source: std::io::Error,
    },
    /// No address of the host accepted a connection in time.
    #[error("cannot connect to collector at {addr}")]
    Connect {
        /// host:port.
        addr: String,
        /// Cause (of the last address tried).
        source: std::io::Error,
    },
    /// Sending the request or reading the answer failed (timeouts included).
    #[error("{step} failed")]
    Io {
        /// What was being done.
        step: &'static str,
        /// Cause.
        source: std::io::Error,
    },
    /// The answer is not well-formed HTTP/1.1.
    #[error("malformed answer from collector: {0}")]
    BadResponse(String),
    /// The collector answered with a non-200 status.
    #[error("collector answered {status}: {error}: {detail}")]
    Status {
        /// HTTP status.
        status: u16,
        /// `error` field of the body (or "unknown").
        error: String,
        /// `detail` field of the body (or the raw body).
        detail: String,
    },
    /// A 200 body did not parse as the expected JSON.
    #[error("cannot decode collector answer")]
    Decode(#[source] serde_json::Error),
    /// The request body could not be encoded.
    #[error("cannot encode record")]
    Encode(#[source] serde_json::Error),
}

/// Result of a successful admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmitOutcome {
    /// HTTP status (200).
    pub status: u16,
    /// The key the collector stored.
    pub key: String,
    /// Stored, unchanged (identical duplicate) or replaced.
    pub disposition: Disposition,
    /// `created` of the stored record (Unix seconds).
    pub created: u64,
}

/// A collector endpoint with timeouts. The free functions use [`Client::new`]'s defaults.
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    port: u16,
    prefix: String,
    /// Timeout for each TCP connect attempt.
    pub connect_timeout: Duration,
    /// Read and write timeout on the connection.
    pub io_timeout: Duration,
}

/// A raw HTTP answer.
#[derive(Debug, Clone)]
pub struct RawResponse {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// Admits `record` into the collector at `base_url` (e.g. `http://127.0.0.1:8886`).
pub fn admit(base_url: &str, record: &ResidueRecord) -> Result<AdmitOutcome, FoilClientError> {
    Client::new(base_url)?.admit(record)
}

/// Looks `key` up in the collector at `base_url`; `Ok(None)` is a miss.
pub fn lookup(base_url: &str, key: &str) -> Result<Option<ResidueRecord>, FoilClientError> {
    Client::new(base_url)?.lookup(key)
}

/// Reads the collector's health counters.
pub fn health(base_url: &str) -> Result<HealthResponse, FoilClientError> {
    Client::new(base_url)?.health()
}

/// Percent-encodes everything but RFC 3986 unreserved characters.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Client {
    /// Parses `base_url` (`http://HOST[:PORT][/PREFIX]` or `HOST[:PORT][/PREFIX]`; IPv6 hosts
    /// in brackets).
    /// Defaults: connect timeout 2 s, read/write timeout 10 s.
    pub fn new(base_url: &str) -> Result<Client, FoilClientError> {
        let bad = |reason: &str| FoilClientError::BadUrl {
            url: base_url.to_string(),
            reason: reason.into(),
        };
        // `HOST:PORT` alone means http (the collector speaks plain HTTP).
        let rest = match base_url.split_once("://") {
            Some((scheme, r)) if scheme.eq_ignore_ascii_case("http") => r,
            Some(_) => return Err(bad("only http:// URLs are supported")),
            None => base_url,
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        if authority.is_empty() {
            return Err(bad("missing host"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| bad("unclosed '[' in IPv6 host"))?;
            let host = &v6[..end];
            let port = match &v6[end + 1..] {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("junk after IPv6 host"))?,
                ),
            };
            (format!("[{host}]"), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| bad("port is not a number in 1..65535"))?,
        };
        if port == 0 {
            return Err(bad("port 0"));
        }
        if path.contains(['?', '#']) {
            return Err(bad("query or fragment in base URL"));
        }
        Ok(Client {
            host,
            port,
            prefix: path.trim_end_matches('/').to_string(),
            connect_timeout: Duration::from_secs(2),
            io_timeout: Duration::from_secs(10),
        })
    }

    /// `host:port` as used for connecting and in the `Host` header.
    pub fn authority(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Admits a record. A non-200 answer is [`FoilClientError::Status`].
    pub fn admit(&self, record: &ResidueRecord) -> Result<AdmitOutcome, FoilClientError> {
        let body = serde_json::to_vec(record).map_err(FoilClientError::Encode)?;
        let resp = self.request("POST", CACHE_PATH, Some(&body))?;
        let parsed: AdmitResponse = ok_json(&resp)?;
        Ok(AdmitOutcome {
            status: resp.status,
            key: parsed.key,
            disposition: parsed.disposition,
            created: parsed.created,
        })
    }

    /// Looks a key up; `Ok(None)` is a miss (`cache_hit: false`).
    pub fn lookup(&self, key: &str) -> Result<Option<ResidueRecord>, FoilClientError> {
        let path = format!("{CACHE_PATH}?key={}", percent_encode(key));
        let resp = self.request("GET", &path, None)?;
        let value: serde_json::Value = ok_json(&resp)?;
        match value.get("cache_hit").and_then(|v| v.as_bool()) {
            Some(true) => serde_json::from_value(value)
                .map(Some)
                .map_err(FoilClientError::Decode),
            Some(false) => Ok(None),
            None => Err(FoilClientError::BadResponse(
                "lookup answer has no boolean cache_hit".into(),
            )),
        }
    }

    /// Reads the health counters.
    pub fn health(&self) -> Result<HealthResponse, FoilClientError> {
        let resp = self.request("GET", HEALTH_PATH, None)?;
        ok_json(&resp)
    }

    /// Sends one request (`path` relative to the base URL's prefix) and reads the answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<RawResponse, FoilClientError> {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(self.connect_timeout)
            .timeout_read(self.io_timeout)
            .timeout_write(self.io_timeout)
            .user_agent(concat!("foil-control-client/", env!("CARGO_PKG_VERSION")))
            .build();
        let url = format!("http://{}{}{path}", self.authority(), self.prefix);
        let req = agent
            .request(method, &url)
            .set("Accept", "application/json");
        let sent = match body {
            Some(b) => req.set("Content-Type", "application/json").send_bytes(b),
            None => req.call(),
        };
        let resp = match sent {
            Ok(r) => r,
            // A non-2xx answer is still an answer: its body says why.
            Err(ureq::Error::Status(_, r)) => r,
            Err(ureq::Error::Transport(t)) => return Err(self.transport_error(t)),
        };
        let status = resp.status();
        let mut body = Vec::new();
        resp.into_reader()
            .take(MAX_RESPONSE_BYTES as u64 + 1)
            .read_to_end(&mut body)
            .map_err(|source| FoilClientError::Io {
                step: "read response body",
                source,
            })?;
        if body.len() > MAX_RESPONSE_BYTES {
            return Err(FoilClientError::BadResponse(
                "response body too large".into(),
            ));
        }
        Ok(RawResponse { status, body })
    }

    fn transport_error(&self, t: ureq::Transport) -> FoilClientError {
        let addr = self.authority();
        let kind = t.kind();
        let source = std::io::Error::other(t);
        match kind {
            ureq::ErrorKind::Dns => FoilClientError::Resolve { addr, source },
            ureq::ErrorKind::ConnectionFailed => FoilClientError::Connect { addr, source },
            ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader => {
                FoilClientError::BadResponse(source.to_string())
            }
            _ => FoilClientError::Io {
                step: "HTTP exchange",
                source,
            },
        }
    }
}

/// Checks for 200 and decodes the JSON body; other statuses become `Status` errors.
fn ok_json<T: serde::de::DeserializeOwned>(resp: &RawResponse) -> Result<T, FoilClientError> {
    if resp.status != 200 {
        let (error, detail) = match serde_json::from_slice::<ErrorResponse>(&resp.body) {
            Ok(e) => (e.error, e.detail),
            Err(_) => (
                "unknown".to_string(),
                String::from_utf8_lossy(&resp.body).into_owned(),
            ),
        };
        return Err(FoilClientError::Status {
            status: resp.status,
            error,
            detail,
        });
    }
    serde_json::from_slice(&resp.body).map_err(FoilClientError::Decode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_base_urls() {
        let c = Client::new("http://127.0.0.1:8886").unwrap();
        assert_eq!(
            (c.authority(), c.prefix.as_str()),
            ("127.0.0.1:8886".to_string(), "")
        );
        let c = Client::new("http://localhost/foil/").unwrap();
        assert_eq!(
            (c.authority(), c.prefix.as_str()),
            ("localhost:80".to_string(), "/foil")
        );
        let c = Client::new("http://[::1]:9000").unwrap();
        assert_eq!(c.authority(), "[::1]:9000");
        let c = Client::new("127.0.0.1:8886").unwrap();
        assert_eq!(c.authority(), "127.0.0.1:8886", "http:// is implied");
        for bad in [
            "https://x:1",
            "ftp://x:1",
            "http://",
            "http://h:0",
            "http://h:99999",
            "http://h:1/?q",
        ] {
            assert!(
                matches!(Client::new(bad), Err(FoilClientError::BadUrl { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn percent_encodes_keys() {
        assert_eq!(percent_encode("m:dense:1,2"), "m%3Adense%3A1%2C2");
        assert_eq!(percent_encode("a b+é"), "a%20b%2B%C3%A9");
    }

    #[test]
    fn unreachable_collector_is_a_connect_error() {
        // Bind then drop a listener to get a port that refuses connections.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = lookup(&format!("http://127.0.0.1:{port}"), "k").unwrap_err();
        assert!(matches!(err, FoilClientError::Connect { .. }), "{err:?}");
    }
}
