//! The station under slow, idle, large and numerous clients (issue 17, items 1-5), over
//! loopback on the small SmolLM2 model with low limits set by flags:
//! idle and trickling connections are closed; running out of file descriptors neither spins
//! the accept loop nor stops `/health`; `/tokenize` runs off the async workers and refuses
//! huge texts; withheld bodies time out and give their memory back; connections, sessions and
//! session scratch are bounded; `/chain` routes only to allowed next hops and never follows a
//! redirect; hops that never answer do not delay `/embed`.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fat_station::engine::{Model, SCRATCH_KEEP_BYTES};
use knot_format::{Knot, LayerRange};
use support::*;

/// A station on SmolLM2 with `args`, killed on drop.
fn start(path: &std::path::Path, args: &[&str]) -> StationProc {
    let knot = path.to_str().expect("utf-8 path");
    spawn_station(&[&["--knot", knot, "--listen", "127.0.0.1:0"], args].concat())
}

fn addr(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

/// Sends a raw request and reads the whole answer (the station closes or answers within
/// `wait`); returns the status and the body.
fn raw(url: &str, request: &[u8], wait: Duration) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr(url))?;
    s.set_read_timeout(Some(wait))?;
    s.write_all(request)?;
    read_response(&mut s)
}

/// Reads one response with `Content-Length` from `s`.
fn read_response(s: &mut TcpStream) -> std::io::Result<(u16, String)> {
    let mut r = BufReader::new(s);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h)?;
        if h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

fn get(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").into_bytes()
}

fn post(path: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// True when the peer closes `s` within `wait` (read returns 0 or a reset).
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).expect("timeout");
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

/// Raises this process's open-file limit (and its children's) to `want` or the hard limit.
fn raise_fd_limit(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one rlimit struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < want {
            r.rlim_cur = want.min(r.rlim_max);
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

// 1. Header-read and idle timeouts.
#[test]
fn silent_trickling_and_idle_connections_are_closed() {
    let Some(path) = model(SMOLLM2) else { return };
    let st = start(&path, &["--header-timeout", "0.5", "--idle-timeout", "1"]);
    let a = addr(&st.url);
    // Sends nothing at all.
    let mut silent = TcpStream::connect(&a).expect("connect");
    // Starts a request and trickles a header line every 200 ms.
    let mut trickle = TcpStream::connect(&a).expect("connect");
    trickle
        .write_all(b"GET /health HTTP/1.1\r\n")
        .expect("write");
    let t2 = trickle.try_clone().expect("clone");
    let trickler = std::thread::spawn(move || {
        let mut t2 = t2;
        for i in 0..40 {
            if t2.write_all(format!("x-{i}: y\r\n").as_bytes()).is_err() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    // Finishes one request, then stays idle on keep-alive.
    let mut idle = TcpStream::connect(&a).expect("connect");
    idle.write_all(&get("/health")).expect("write");
    let (status, _) = read_response(&mut idle).expect("health");
    assert_eq!(status, 200);

    assert!(
        closed_within(&mut silent, Duration::from_secs(5)),
        "a connection that sends nothing is closed after --header-timeout"
    );
    assert!(
        closed_within(&mut trickle, Duration::from_secs(5)),
        "a trickled request head is closed after --header-timeout"
    );
    assert!(
        closed_within(&mut idle, Duration::from_secs(5)),
        "an idle keep-alive connection is closed after --idle-timeout"
    );
    assert!(
        trickler.join().expect("trickler"),
        "the trickler was cut off"
    );
}

// 1. No accept spin on EMFILE, and /health still answers.
#[test]
fn out_of_file_descriptors_the_accept_loop_backs_off_and_health_answers() {
    let Some(path) = model(SMOLLM2) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let err_path = dir.path().join("stderr");
    // ulimit -n 200, with a connection bound above it (so accept does hit EMFILE) and with
    // the default bound (lowered under the limit).
    for bound in [None, Some("1000")] {
        let knot = path.to_str().expect("utf-8");
        let bin = station_bin();
        let mut args = vec![
            "-c",
            "ulimit -n 200 && exec \"$0\" \"$@\"",
            bin.to_str().expect("utf-8 path"),
            "--knot",
            knot,
            "--listen",
            "127.0.0.1:0",
        ];
        if let Some(b) = bound {
            args.extend(["--max-connections", b]);
        }
        let stderr = std::fs::File::create(&err_path).expect("stderr file");
        let st = spawn_url(Command::new("sh").args(&args).stderr(stderr));

        let idle: Vec<TcpStream> = (0..260)
            .map(|_| TcpStream::connect(addr(&st.url)).expect("connect"))
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        let health = raw(&st.url, &get("/health"), Duration::from_secs(8));
        std::thread::sleep(Duration::from_millis(500));
        let log = std::fs::metadata(&err_path).map(|m| m.len()).unwrap_or(0);
        drop(idle);
        assert!(
            matches!(health, Ok((200, _))),
            "bound {bound:?}: /health must answer with 260 idle connections under ulimit -n 200: {health:?}"
        );
        assert!(
            log < 20_000,
            "bound {bound:?}: the accept loop must not flood stderr ({log} bytes)"
        );
    }
}

// 2. /tokenize off the async workers; a cap on its input.
#[test]
fn tokenize_does_not_stall_health_and_huge_texts_are_refused() {
    let Some(path) = model(SMOLLM2) else { return };
    // One compute at a time: the tokenizes queue behind each other (about 0.2 s each here) and
    // leave the other cores free, so on a busy 2-core box /health still has a wide margin to
    // answer before the first of them ends.
    let st = start(&path, &["--max-compute", "1"]);
    // One more slow tokenize than there are cores (the async workers on the old code).
    let n = std::thread::available_parallelism().map_or(2, |n| n.get()) + 1;
    let text = serde_json::json!({ "text": " ".repeat(250_000) }).to_string();
    let done = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..n)
        .map(|_| {
            let (url, text, done) = (st.url.clone(), text.clone(), done.clone());
            std::thread::spawn(move || {
                let r = raw(
                    &url,
                    &post(
                        "/tokenize",
                        "content-type: application/json\r\n",
                        text.as_bytes(),
                    ),
                    Duration::from_secs(120),
                );
                done.lock().expect("lock").push("tokenize");
                r
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(60));
    let h = raw(&st.url, &get("/health"), Duration::from_secs(120));
    done.lock().expect("lock").push("health");
    for w in workers {
        let (status, _) = w.join().expect("worker").expect("tokenize");
        assert_eq!(status, 200);
    }
    assert_eq!(h.expect("health").0, 200);
    let order = done.lock().expect("lock").clone();
    assert_eq!(
        order.first(),
        Some(&"health"),
        "/health answers while tokenizing runs: {order:?}"
    );

    // A text over the cap: 413 before any tokenizing.
    let big = serde_json::json!({ "text": "a".repeat(300_000) }).to_string();
    let (status, body) = raw(
        &st.url,
        &post("/tokenize", "", big.as_bytes()),
        Duration::from_secs(30),
    )
    .expect("big tokenize");
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("too_large"), "{body}");
}

// 3. Withheld bodies time out and give their memory back.
#[test]
fn withheld_bodies_time_out_and_their_memory_is_returned() {
    let Some(path) = model(SMOLLM2) else { return };
    // Weights stay in the mapped file: packed copies (made in the background) would be
    // counted as if they were body memory kept.
    let st = start(
        &path,
        &[
            "--body-timeout",
            "1",
            "--max-body",
            "32Mi",
            "--pack-weights",
            "never",
        ],
    );
    assert_eq!(
        raw(&st.url, &get("/health"), Duration::from_secs(10))
            .expect("health")
            .0,
        200
    );
    let before = rss_kib(st.child.id());
    let chunk = vec![0u8; 1 << 20];
    let mut clients: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = TcpStream::connect(addr(&st.url)).expect("connect");
            s.write_all(
                b"POST /forward HTTP/1.1\r\nhost: x\r\nx-layer-range: 0-1\r\ncontent-length: 33554432\r\n\r\n",
            )
            .expect("head");
            for _ in 0..24 {
                s.write_all(&chunk).expect("24 of the 32 MiB");
            }
            s
        })
        .collect();
    let during = rss_kib(st.child.id());
    let answers: Vec<_> = clients
        .iter_mut()
        .map(|s| {
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            read_response(s).map(|(status, _)| status)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let after = rss_kib(st.child.id());
    eprintln!("RSS KiB: before {before}, with 8 withheld bodies {during}, after {after}");
    for a in &answers {
        assert!(
            matches!(a, Ok(408)),
            "a withheld body gets 408: {answers:?}"
        );
    }
    assert!(
        after < before + 48 * 1024,
        "the 192 MiB of withheld bodies are given back: before {before} KiB, after {after} KiB"
    );

    // A Content-Length over --max-body is refused before any of the body is sent.
    let mut s = TcpStream::connect(addr(&st.url)).expect("connect");
    s.write_all(b"POST /forward HTTP/1.1\r\nhost: x\r\nx-layer-range: 0-1\r\ncontent-length: 40000000\r\n\r\n")
        .expect("head");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    assert_eq!(read_response(&mut s).expect("413").0, 413);
}

// 3. A bound on connections: idle ones make room, busy ones get 503 + Retry-After.
#[test]
fn connections_are_bounded_idle_ones_make_room_for_health() {
    let Some(path) = model(SMOLLM2) else { return };
    let st = start(&path, &["--max-connections", "4"]);
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(addr(&st.url)).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let h = raw(&st.url, &get("/health"), Duration::from_secs(10)).expect("health");
    assert_eq!(h.0, 200, "an idle connection makes room for /health");
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    // Four requests mid-body: nobody is idle, so a fifth connection is turned away.
    let busy: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(addr(&st.url)).expect("connect");
            s.write_all(b"POST /forward HTTP/1.1\r\nhost: x\r\nx-layer-range: 0-1\r\ncontent-length: 1000\r\n\r\n0123")
                .expect("write");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut s = TcpStream::connect(addr(&st.url)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    assert!(
        text.starts_with("HTTP/1.1 503") && text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text:?}"
    );
    drop(busy);
}

// 3. Session scratch is not kept at its peak after a big forward.
#[test]
fn a_long_prefill_leaves_no_peak_scratch_in_its_session() {
    let Some(path) = model(SMOLLM2) else { return };
    let knot = Knot::open(&path).expect("open");
    let model = Model::load(&knot, None).expect("load");
    let mut s = model.new_session(1024);
    let tokens: Vec<u32> = (0..400).map(|i| 100 + i).collect();
    let mut x = model.embed(&tokens).expect("embed");
    model
        .forward(&mut s, &mut x, LayerRange::new(0, 1))
        .expect("prefill 400 rows");
    assert!(
        s.scratch_bytes() <= SCRATCH_KEEP_BYTES,
        "after a 400-row forward the session keeps {} bytes of scratch",
        s.scratch_bytes()
    );
    let mut x = model.embed(&[7]).expect("embed");
    model
        .forward(&mut s, &mut x, LayerRange::new(0, 1))
        .expect("decode");
    assert!(s.scratch_bytes() > 0, "a decode step's scratch is kept");
}

// 3. Sessions are bounded by memory: the least recently used goes.
#[test]
fn sessions_beyond_the_memory_bound_are_evicted() {
    let Some(path) = model(SMOLLM2) else { return };
    let knot = Knot::open(&path).expect("open");
    let cfg = Model::load(&knot, None).expect("load").cfg;
    let rows = 16;
    let one = rows * cfg.n_layers * cfg.kv_dim() * 2 * 4;
    let bound = format!("{}K", one * 3 / 2 / 1024);
    let st = start(&path, &["--max-session-memory", &bound]);
    let c = fat_station::client::StationClient::new(&st.url, Duration::from_secs(60));
    let tokens: Vec<u32> = (0..rows as u32).map(|i| 100 + i).collect();
    let x = c.embed(&tokens).expect("embed").residual;
    let all = LayerRange::new(0, cfg.n_layers as u32);
    c.forward(&x, all, Some(("a", 0)), false)
        .expect("session a");
    c.forward(&x, all, Some(("b", 0)), false)
        .expect("session b");
    assert_eq!(
        c.health().expect("health").sessions,
        1,
        "a was evicted for b"
    );
    match c.forward(&x[..cfg.hidden], all, Some(("a", rows)), false) {
        Err(fat_station::client::ClientError::Refused(fat_station::wire::Refusal {
            status,
            code,
            ..
        })) => {
            assert_eq!((status, code.as_str()), (409, "session_mismatch"))
        }
        other => panic!("session a must be gone: {other:?}"),
    }
}

// 3. Abandoned sessions expire on the station's timer, with no other session request to
// trigger the sweep (the soak's 160 abandoned sessions stayed until one arrived).
#[test]
fn idle_sessions_expire_without_another_request() {
    let Some(path) = model(SMOLLM2) else { return };
    let st = start(&path, &["--session-idle-s", "1"]);
    let c = fat_station::client::StationClient::new(&st.url, Duration::from_secs(60));
    let h = c.health().expect("health");
    let x = c.embed(&[100, 101, 102, 103]).expect("embed").residual;
    let all = LayerRange::new(0, h.n_layers);
    for id in ["a", "b", "c"] {
        c.forward(&x, all, Some((id, 0)), false).expect("session");
    }
    let h = c.health().expect("health");
    assert_eq!(h.sessions, 3);
    assert!(
        h.session_bytes > 0,
        "the live sessions' KV bytes are reported"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let h = c.health().expect("health");
        if h.sessions == 0 {
            assert_eq!(h.session_bytes, 0);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "idle sessions still held: {}",
            h.sessions
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A listener that counts the connections it gets (and answers each with `answer`).
fn listener(answer: &'static [u8]) -> (String, Arc<AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            let mut b = [0u8; 65536];
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = s.read(&mut b);
            let _ = s.write_all(answer);
        }
    });
    (url, n)
}

fn chain_request(route: &str) -> Vec<u8> {
    post(
        "/chain",
        &format!("x-route: {route}\r\ncontent-type: application/json\r\n"),
        br#"{"tokens": [1]}"#,
    )
}

// 4. X-Route reaches only allowed next hops, and redirects are not followed.
#[test]
fn chain_routes_only_to_allowed_hops_and_never_follows_redirects() {
    let Some(path) = model(SMOLLM2) else { return };
    let (victim, victim_seen) = listener(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
    let redirect: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 307 Temporary Redirect\r\nlocation: {victim}/chain\r\ncontent-length: 0\r\n\r\n"
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    let (redirector, redirector_seen) = listener(redirect);
    // An entry with no successor and no allowed hops forwards nowhere.
    let st = start(&path, &["--role", "entry", "--layers", "0..1"]);
    let (status, body) =
        raw(&st.url, &chain_request(&victim), Duration::from_secs(30)).expect("chain");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("route_refused"), "{body}");
    drop(st);
    let st = start(
        &path,
        &[
            "--role",
            "entry",
            "--layers",
            "0..1",
            "--route-to",
            &redirector,
        ],
    );
    let (status, body) =
        raw(&st.url, &chain_request(&victim), Duration::from_secs(30)).expect("chain");
    assert_eq!(status, 403, "{body}");
    let (status, body) = raw(
        &st.url,
        &chain_request(&redirector),
        Duration::from_secs(30),
    )
    .expect("chain");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("redirect"), "{body}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        redirector_seen.load(Ordering::SeqCst),
        1,
        "the allowed hop was called"
    );
    assert_eq!(
        victim_seen.load(Ordering::SeqCst),
        0,
        "the station reached a URL it was not allowed to"
    );
}

// 5. Hops that never answer do not delay an ordinary /embed.
#[test]
fn hops_that_never_answer_do_not_delay_embed() {
    let Some(path) = model(SMOLLM2) else { return };
    raise_fd_limit(4096);
    // Accepts every connection and never answers.
    let dead = TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead_url = format!("http://{}", dead.local_addr().expect("addr"));
    let held = Arc::new(Mutex::new(Vec::new()));
    let h = held.clone();
    std::thread::spawn(move || {
        for s in dead.incoming().flatten() {
            h.lock().expect("lock").push(s);
        }
    });
    // An entry node whose manifest successor is the dead hop.
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("n0.json");
    let hash = Knot::open(&path).expect("open").model_hash().to_string();
    std::fs::write(
        &manifest,
        serde_json::json!({
            "node_id": "n0", "model_id": "smollm2", "model_hash": hash, "role": "entry",
            "layers": "0-1", "listen": "127.0.0.1:0", "shard": path, "chain": 0,
            "successor": {"node_id": "dead", "url": dead_url, "layers": "1-30"},
        })
        .to_string(),
    )
    .expect("manifest");
    let st = spawn_station(&[
        "--manifest",
        manifest.to_str().expect("utf-8"),
        "--hop-timeout-s",
        "120",
    ]);
    let req = post(
        "/chain",
        "content-type: application/json\r\n",
        br#"{"tokens": [1]}"#,
    );
    let pending: Vec<TcpStream> = (0..530)
        .map(|_| {
            let mut s = TcpStream::connect(addr(&st.url)).expect("connect");
            s.write_all(&req).expect("chain request");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1000));
    let t = Instant::now();
    let e = raw(
        &st.url,
        &post("/embed", "", br#"{"tokens": [1, 2, 3]}"#),
        Duration::from_secs(20),
    );
    eprintln!(
        "/embed with 530 hops pending: {:?} in {:?}",
        e.as_ref().map(|r| r.0),
        t.elapsed()
    );
    assert!(
        matches!(e, Ok((200, _))),
        "/embed answers while 530 hops hang: {e:?}"
    );
    drop(pending);
}

// ---- Issue 32, items 10 to 12: clients that never read, prompts past the context, loose
// header values. ----

/// `name`'s value in the station's `/metrics` text.
fn station_metric(url: &str, name: &str) -> f64 {
    let (status, text) = raw(url, &get("/metrics"), Duration::from_secs(10)).expect("metrics");
    assert_eq!(status, 200);
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Anonymous resident memory of `pid` (`RssAnon`: heap, not the mapped model file).
fn anon_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("RssAnon")
}

/// A residual of `rows` rows of SmolLM2's width (576), as f32 bytes.
fn residual(rows: usize) -> Vec<u8> {
    (0..rows * 576)
        .flat_map(|i| ((i % 7) as f32 * 0.01).to_le_bytes())
        .collect()
}

// 10. Clients that ask for a big answer and never read it hold at most the response budget.
#[test]
fn clients_that_never_read_hold_at_most_the_response_budget() {
    let Some(path) = model(SMOLLM2) else { return };
    // Weights stay in the mapped file, so the anonymous memory measured is the answers'.
    let st = start(
        &path,
        &[
            "--max-response-memory",
            "16Mi",
            "--max-compute",
            "2",
            "--pack-weights",
            "never",
        ],
    );
    let x = residual(64);
    let req = post("/lm-head", "x-logit-rows: 64\r\n", &x);
    // Warm up (pools and scratch made), then the baseline.
    let (status, _) = raw(&st.url, &req, Duration::from_secs(60)).expect("lm-head");
    assert_eq!(status, 200, "a reading client gets its 64 rows (12.6 MB)");
    std::thread::sleep(Duration::from_millis(500));
    let before = anon_kib(st.child.id());
    // 16 clients each ask for 64 rows of logits (12.6 MB) and read only the status line.
    let mut statuses = Vec::new();
    let mut held = Vec::new();
    for _ in 0..16 {
        let mut s = TcpStream::connect(addr(&st.url)).expect("connect");
        s.write_all(&req).expect("request");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("timeout");
        let mut first = [0u8; 12];
        s.read_exact(&mut first).expect("status line");
        statuses.push(String::from_utf8_lossy(&first[9..12]).into_owned());
        held.push(s);
    }
    std::thread::sleep(Duration::from_millis(500));
    let during = anon_kib(st.child.id());
    eprintln!(
        "RssAnon KiB: before {before}, with 16 unread 64-row answers {during}; statuses {statuses:?}"
    );
    let ok = statuses.iter().filter(|s| *s == "200").count();
    let busy = statuses.iter().filter(|s| *s == "503").count();
    assert!(
        ok >= 1,
        "the budget serves one answer at a time: {statuses:?}"
    );
    assert_eq!(ok + busy, 16, "{statuses:?}");
    assert!(
        busy >= 14,
        "answers past the 16 MiB budget are refused: {statuses:?}"
    );
    assert!(
        during < before + 80 * 1024,
        "16 unread answers (202 MB unbounded) pinned {} MiB",
        (during.saturating_sub(before)) / 1024
    );
    assert!(station_metric(&st.url, "fat_station_responses_refused_total") >= 14.0);
    drop(held);
    // The budget comes back once the clients are gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while station_metric(&st.url, "fat_station_response_bytes") > 0.0 {
        assert!(Instant::now() < deadline, "the budget was not given back");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _) = raw(&st.url, &req, Duration::from_secs(60)).expect("lm-head");
    assert_eq!(status, 200);
}

// 11. A prompt longer than the context is refused before any compute.
#[test]
fn a_prompt_past_the_context_is_refused_before_any_compute() {
    let Some(path) = model(SMOLLM2) else { return };
    let st = start(&path, &["--max-positions", "4096"]);
    let computed = || station_metric(&st.url, "fat_station_compute_seconds_count");
    let before = computed();
    let tokens: Vec<u32> = vec![1; 40_030];
    let body = serde_json::json!({ "tokens": tokens }).to_string();
    let t = Instant::now();
    let (status, text) = raw(
        &st.url,
        &post(
            "/chain",
            "content-type: application/json\r\n",
            body.as_bytes(),
        ),
        Duration::from_secs(60),
    )
    .expect("chain");
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("context_full"), "{text}");
    // A session already holding positions: its next step is checked against them too.
    let (status, text) = raw(
        &st.url,
        &post(
            "/chain",
            "content-type: application/json\r\nx-session: s1\r\nx-pos: 4000\r\n",
            serde_json::json!({ "tokens": vec![1u32; 200] })
                .to_string()
                .as_bytes(),
        ),
        Duration::from_secs(60),
    )
    .expect("chain");
    assert_eq!(status, 413, "{text}");
    let (status, text) = raw(
        &st.url,
        &post("/forward", "x-layer-range: 0-1\r\n", &residual(4097)),
        Duration::from_secs(60),
    )
    .expect("forward");
    assert_eq!(status, 413, "{text}");
    eprintln!("three refusals in {:?}", t.elapsed());
    assert_eq!(
        computed(),
        before,
        "a prompt past the context reached the compute pool"
    );
}

// 12. Header values have one strict spelling; a value that is not ASCII is refused, not dropped.
#[test]
fn loose_header_values_are_refused() {
    let Some(path) = model(SMOLLM2) else { return };
    let st = start(&path, &[]);
    let one = residual(1);
    let forward = |headers: &[u8]| {
        let mut r = format!(
            "POST /forward HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n",
            one.len()
        )
        .into_bytes();
        r.extend_from_slice(headers);
        r.extend_from_slice(b"\r\n");
        r.extend_from_slice(&one);
        raw(&st.url, &r, Duration::from_secs(30)).expect("forward")
    };
    let (status, text) = forward(b"x-layer-range: 0-1\r\n");
    assert_eq!(status, 200, "{text}");
    let (status, text) = forward(b"x-layer-range: 0-1\r\nx-session: s-1\r\nx-pos: 0\r\n");
    assert_eq!(status, 200, "{text}");
    let cases: [(&str, &[u8]); 7] = [
        (
            "non-ASCII X-Session",
            b"x-layer-range: 0-1\r\nx-session: caf\xc3\xa9\r\n",
        ),
        ("spaced range", b"x-layer-range: 0 - 1\r\n"),
        (
            "zero-padded range",
            b"x-layer-range: 00000000000000000001-2\r\n",
        ),
        ("signed range", b"x-layer-range: +0-1\r\n"),
        ("dotted range", b"x-layer-range: 0..1\r\n"),
        (
            "padded X-Pos",
            b"x-layer-range: 0-1\r\nx-session: s-2\r\nx-pos:  +0\r\n",
        ),
        ("unknown X-Dtype", b"x-layer-range: 0-1\r\nx-dtype: F16\r\n"),
    ];
    for (what, headers) in cases {
        let (status, text) = forward(headers);
        assert_eq!(status, 400, "{what}: {text}");
    }
    let x = residual(2);
    let (status, text) = raw(
        &st.url,
        &post("/lm-head", "x-logit-rows: 02\r\n", &x),
        Duration::from_secs(30),
    )
    .expect("lm-head");
    assert_eq!(status, 400, "zero-padded X-Logit-Rows: {text}");
    let (status, text) = raw(
        &st.url,
        &post(
            "/chain",
            "content-type: application/json\r\nx-session: été\r\n",
            br#"{"tokens": [1]}"#,
        ),
        Duration::from_secs(30),
    )
    .expect("chain");
    assert_eq!(status, 400, "non-ASCII X-Session on /chain: {text}");
}
