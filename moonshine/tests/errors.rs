//! Errors a person meets first: one line on stderr naming what failed, its cause once and a
//! hint, exit 2. No model needed.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use support::moonshine;

/// moonshine's stderr and exit code for `args`.
fn fails(args: &[&str]) -> (String, Option<i32>) {
    let o = moonshine(args, None);
    (
        String::from_utf8_lossy(&o.stderr).into_owned(),
        o.status.code(),
    )
}

#[test]
fn a_station_that_is_not_running_is_named_once_with_a_hint() {
    // `HOST:PORT` without `http://` (was `RelativeUrlWithoutBase` three times); nothing listens
    // on port 1 (was `connecting to Station(..): ../health: ../health: Connection Failed: ..`).
    let (err, code) = fails(&["-c", "hi", "--station", "127.0.0.1:1", "--timeout", "2"]);
    assert_eq!(
        err,
        "moonshine: error: cannot reach http://127.0.0.1:1/health: connection refused \
         (is fat-station running at http://127.0.0.1:1?)\n"
    );
    assert_eq!(code, Some(2));
}

#[test]
fn a_station_url_no_station_serves_is_refused_with_what_to_write() {
    let (err, code) = fails(&["-c", "hi", "--station", "8080"]);
    assert_eq!(
        err.lines().next(),
        Some(
            "error: invalid value '8080' for '--station <STATION>': \"8080\" is not a station \
             URL: a bare port: did you mean 127.0.0.1:8080? (write HOST:PORT or http://HOST:PORT)"
        ),
        "{err}"
    );
    assert_eq!(code, Some(2));
}

/// A stand-in for `moonshine serve` on a loopback port: answers `/health` as the gateway does
/// and `/v1/models` with the gateway's model list. Returns its base URL.
fn fake_gateway() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    std::thread::spawn(move || {
        for conn in l.incoming().take(8) {
            let Ok(mut s) = conn else { continue };
            let mut line = String::new();
            let mut r = BufReader::new(s.try_clone().expect("clone"));
            if r.read_line(&mut line).is_err() {
                continue;
            }
            // Drain the request head.
            let mut h = String::new();
            while r.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let body = if line.starts_with("GET /v1/models ") {
                r#"{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"aeon-shell"}]}"#
            } else {
                r#"{"status":"ok","model":"m"}"#
            };
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn a_gateway_passed_as_station_is_named_as_such() {
    let url = fake_gateway();
    let (err, code) = fails(&["-c", "hi", "--station", &url, "--timeout", "5"]);
    assert_eq!(
        err,
        format!(
            "moonshine: error: {url} is a moonshine gateway (OpenAI API), not a fat-station: \
             give the URL of a station (the one the gateway was started with), or send OpenAI \
             requests to {url}/v1\n"
        )
    );
    assert_eq!(code, Some(2));
}

#[test]
fn quiet_and_verbose_work_before_and_after_serve() {
    // `moonshine -q serve` was refused by the parser ("the subcommand 'serve' cannot be used
    // with '--quiet'"): the generation flags conflict with subcommands, and -q/-v are global.
    // Here each form reaches the gateway's start-up, which names the station it cannot reach.
    for args in [
        &["-q", "serve"][..],
        &["serve", "-q"],
        &["-v", "serve"],
        &["serve", "-vv"],
    ] {
        let mut all = args.to_vec();
        all.extend([
            "--station",
            "127.0.0.1:1",
            "--listen",
            "127.0.0.1:0",
            "--timeout",
            "2",
        ]);
        let (err, code) = fails(&all);
        assert!(
            err.contains("cannot reach http://127.0.0.1:1/health"),
            "{args:?}: {err}"
        );
        assert_eq!(code, Some(2), "{args:?}");
    }
}

#[test]
fn generation_flags_before_a_subcommand_are_refused() {
    // `--station` before `serve` would be the generation's, not the gateway's: refused with
    // where it belongs.
    let (err, code) = fails(&["--station", "127.0.0.1:1", "serve"]);
    assert!(
        err.starts_with("error: --station belongs after the subcommand: moonshine serve --station"),
        "{err}"
    );
    assert_eq!(code, Some(2));
}
