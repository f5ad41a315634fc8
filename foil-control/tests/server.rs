//! Runs the real `foil-control` binary on an ephemeral port and talks to it with the
//! library client and with raw sockets.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use foil_control::client::{self, FoilClientError};
use foil_control::record::{Disposition, ResidueRecord, TopK};

/// A running collector; killed (SIGKILL) on drop.
struct Server {
    child: Child,
    url: String,
    addr: String,
    stderr: PathBuf,
}

impl Server {
    fn start(data_dir: &Path, extra: &[&str]) -> Server {
        let stderr = data_dir.with_extension(format!("stderr.{}", rand_suffix()));
        let err_file = std::fs::File::create(&stderr).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_foil-control"))
            .args(["--host", "127.0.0.1", "--port", "0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(err_file)
            .spawn()
            .expect("spawn foil-control");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .strip_prefix("foil-control listening on ")
            .unwrap_or_else(|| {
                panic!(
                    "no listening line; stdout {line:?}, stderr:\n{}",
                    std::fs::read_to_string(&stderr).unwrap()
                )
            })
            .to_string();
        let addr = url.trim_start_matches("http://").to_string();
        Server {
            child,
            url,
            addr,
            stderr,
        }
    }

    fn kill9(mut self) {
        self.child.kill().unwrap(); // SIGKILL on unix
        self.child.wait().unwrap();
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn record(model: &str, i: u32) -> ResidueRecord {
    let mut r = ResidueRecord::dense(model, &[785, 6722, i], 12095 + i, 17.25 + i as f32 / 8.0);
    r.top_k = vec![
        TopK {
            id: 12095 + i,
            logit: r.logit,
        },
        TopK {
            id: 576,
            logit: 3.5,
        },
    ];
    r
}

/// Sends raw bytes, returns (status, body as JSON).
fn raw(addr: &str, request: &[u8]) -> (u16, serde_json::Value) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status: u16 = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").unwrap().1;
    (
        status,
        serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.into())),
    )
}

fn get(addr: &str, path: &str) -> (u16, serde_json::Value) {
    raw(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

#[test]
fn admit_hit_and_miss() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let mut rec = record("qwen", 1);
    rec.set_residual(&[1.0, -2.0, 0.5]);
    let out = client::admit(&srv.url, &rec).unwrap();
    assert_eq!(
        (out.status, out.key.as_str(), out.disposition),
        (200, rec.key.as_str(), Disposition::Stored)
    );
    assert_eq!(rec.key, "qwen:dense:785,6722,1");

    let hit = client::lookup(&srv.url, &rec.key).unwrap().expect("hit");
    assert_eq!(hit.created, Some(out.created));
    assert!(hit.same_content(&rec));
    assert_eq!(hit.residual().unwrap().unwrap(), vec![1.0, -2.0, 0.5]);
    assert!(client::lookup(&srv.url, "qwen:dense:1,2,3")
        .unwrap()
        .is_none());

    // The raw wire shape, with an unencoded key as curl users would send it.
    let (status, body) = get(
        &srv.addr,
        "/.aeon/model-forward-cache?key=qwen:dense:785,6722,1",
    );
    assert_eq!(status, 200);
    assert_eq!(body["cache_hit"], true);
    assert_eq!(body["argmax"], 12096);
    assert_eq!(body["logit"], 17.375);
    assert_eq!(body["top_k"][1]["id"], 576);
    let (status, body) = get(&srv.addr, "/.aeon/model-forward-cache?key=nope");
    assert_eq!(status, 200);
    assert_eq!(body, serde_json::json!({"cache_hit": false, "key": "nope"}));

    let h = client::health(&srv.url).unwrap();
    assert_eq!((h.status.as_str(), h.records), ("ok", 1));
    assert!(h.bytes > 100 && h.log_bytes >= h.bytes + 8, "{h:?}");
}

#[test]
fn bare_query_and_bad_requests_are_400() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    for path in [
        "/.aeon/model-forward-cache",
        "/.aeon/model-forward-cache?",
        "/.aeon/model-forward-cache?key=",
        "/.aeon/model-forward-cache?other=1",
    ] {
        let (status, body) = get(&srv.addr, path);
        assert_eq!(status, 400, "{path}");
        assert_eq!(body["error"], "bad_request", "{path}");
    }
    let post = |body: &str| {
        raw(
            &srv.addr,
            format!(
                "POST /.aeon/model-forward-cache HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .as_bytes(),
        )
    };
    let (status, body) = post("{not json");
    assert_eq!((status, body["error"].as_str()), (400, Some("bad_request")));
    let (status, body) = post(r#"{"key":"","model":"m","tokens":[],"argmax":1,"logit":1}"#);
    assert_eq!(status, 400);
    assert!(body["detail"].as_str().unwrap().contains("key"), "{body}");
    let (status, _) =
        post(r#"{"key":"k","model":"m","tokens":[],"argmax":1,"logit":1,"residual_b64":"AAA="}"#);
    assert_eq!(status, 400);
    // Client library surfaces the status and the server's error code.
    let mut bad = record("m", 1);
    bad.model.clear();
    match client::admit(&srv.url, &bad) {
        Err(FoilClientError::Status {
            status: 400, error, ..
        }) => assert_eq!(error, "bad_request"),
        other => panic!("expected 400, got {other:?}"),
    }
    assert_eq!(get(&srv.addr, "/nope").0, 404);
    let (status, _) = raw(
        &srv.addr,
        b"DELETE /.aeon/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 405);
    assert_eq!(client::health(&srv.url).unwrap().records, 0);
}

#[test]
fn oversized_body_is_413() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &["--max-body", "4K"]);
    // Declared too large: refused from the head alone, before any body byte is sent.
    let (status, body) = raw(
        &srv.addr,
        b"POST /.aeon/model-forward-cache HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5000000\r\n\r\n",
    );
    assert_eq!(
        (status, body["error"].as_str()),
        (413, Some("payload_too_large"))
    );
    // Chunked, no declared size: cut off while reading.
    let chunk = "x".repeat(3000);
    let req = format!(
        "POST /.aeon/model-forward-cache HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    assert_eq!(raw(&srv.addr, req.as_bytes()).0, 413);
    // Through the client: a record with a big residual.
    let mut big = record("m", 1);
    big.set_residual(&vec![0.25; 4096]);
    match client::admit(&srv.url, &big) {
        Err(FoilClientError::Status { status: 413, .. }) => {}
        // The server may close before the client finished writing the body.
        Err(FoilClientError::Io { .. }) => {}
        other => panic!("expected 413, got {other:?}"),
    }
    // A record that fits still goes in.
    let mut ok = record("m", 2);
    ok.set_residual(&vec![0.25; 256]);
    assert_eq!(client::admit(&srv.url, &ok).unwrap().status, 200);
    assert_eq!(client::health(&srv.url).unwrap().records, 1);
}

#[test]
fn duplicate_key_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let srv = Server::start(&data, &[]);
    let rec = record("m", 7);
    let first = client::admit(&srv.url, &rec).unwrap();
    let log_len = std::fs::metadata(data.join("residues.log")).unwrap().len();
    let second = client::admit(&srv.url, &rec).unwrap();
    assert_eq!(
        (second.status, second.disposition),
        (200, Disposition::Unchanged)
    );
    assert_eq!(
        second.created, first.created,
        "unchanged duplicate keeps its created"
    );
    assert_eq!(
        std::fs::metadata(data.join("residues.log")).unwrap().len(),
        log_len,
        "no write for a duplicate"
    );
    assert_eq!(client::health(&srv.url).unwrap().records, 1);

    let mut changed = rec.clone();
    changed.argmax = 1;
    assert_eq!(
        client::admit(&srv.url, &changed).unwrap().disposition,
        Disposition::Replaced
    );
    assert_eq!(
        client::lookup(&srv.url, &rec.key).unwrap().unwrap().argmax,
        1
    );
    assert_eq!(client::health(&srv.url).unwrap().records, 1);
}

#[test]
fn concurrent_clients() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let url = Arc::new(srv.url.clone());
    let started = Instant::now();
    let threads: Vec<_> = (0..8u32)
        .map(|t| {
            let url = Arc::clone(&url);
            std::thread::spawn(move || {
                for i in 0..50u32 {
                    let rec = record(&format!("model{t}"), i);
                    assert_eq!(client::admit(&url, &rec).unwrap().status, 200);
                    let back = client::lookup(&url, &rec.key)
                        .unwrap()
                        .expect("own record visible");
                    assert!(back.same_content(&rec));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    eprintln!("8 threads x 50 admit+lookup in {:?}", started.elapsed());
    assert_eq!(client::health(&srv.url).unwrap().records, 400);
    for t in 0..8 {
        for i in [0, 25, 49] {
            assert!(
                client::lookup(&srv.url, &record(&format!("model{t}"), i).key)
                    .unwrap()
                    .is_some()
            );
        }
    }
}

#[test]
fn survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let srv = Server::start(&data, &[]);
    for i in 0..20 {
        client::admit(&srv.url, &record("m", i)).unwrap();
    }
    // Keep admitting from another thread while the server is killed: every acknowledged
    // admission must survive.
    let acked = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (url, acked) = (srv.url.clone(), Arc::clone(&acked));
        std::thread::spawn(move || {
            for i in 100..10_000 {
                match client::admit(&url, &record("m", i)) {
                    Ok(_) => acked.lock().unwrap().push(i),
                    Err(_) => break,
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    srv.kill9();
    writer.join().unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(
        !acked.is_empty(),
        "writer got no admission in before the kill"
    );

    let srv = Server::start(&data, &[]);
    for i in (0..20).chain(acked.iter().copied()) {
        let rec = record("m", i);
        let hit = client::lookup(&srv.url, &rec.key).unwrap();
        assert!(
            hit.is_some_and(|h| h.same_content(&rec)),
            "record {i} lost after kill -9"
        );
    }
    let records = client::health(&srv.url).unwrap().records;
    // At most one unacknowledged admission may have reached the disk too.
    assert!(
        records == 20 + acked.len() || records == 21 + acked.len(),
        "{records} vs {}",
        20 + acked.len()
    );
    eprintln!(
        "kill -9 during writes: {} acknowledged admissions all survived",
        20 + acked.len()
    );
}

#[test]
fn torn_tail_is_truncated_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let log = data.join("residues.log");
    let srv = Server::start(&data, &[]);
    for i in 0..5 {
        client::admit(&srv.url, &record("m", i)).unwrap();
    }
    srv.kill9();
    let good = std::fs::metadata(&log).unwrap().len();

    // A crash mid-append: a frame header promising 500 bytes, followed by 40.
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    f.write_all(&500u32.to_le_bytes()).unwrap();
    f.write_all(&0xdead_beefu32.to_le_bytes()).unwrap();
    f.write_all(&[b'{'; 40]).unwrap();
    drop(f);
    let srv = Server::start(&data, &[]);
    assert_eq!(client::health(&srv.url).unwrap().records, 5);
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        good,
        "tail truncated back to the last good frame"
    );
    assert!(
        srv.stderr().contains("torn or corrupt log tail"),
        "stderr:\n{}",
        srv.stderr()
    );
    // The log keeps working after recovery.
    client::admit(&srv.url, &record("m", 99)).unwrap();
    srv.kill9();

    // Cut the last frame in half: that record is gone, the rest stays.
    let len = std::fs::metadata(&log).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(len - 7)
        .unwrap();
    let srv = Server::start(&data, &[]);
    assert_eq!(client::health(&srv.url).unwrap().records, 5);
    assert!(client::lookup(&srv.url, &record("m", 99).key)
        .unwrap()
        .is_none());
    assert!(client::lookup(&srv.url, &record("m", 4).key)
        .unwrap()
        .is_some());
}

#[test]
fn eviction_bound_holds_across_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let flags = ["--max-records", "10", "--compact-threshold", "4K"];
    let srv = Server::start(&data, &flags);
    for i in 0..200 {
        client::admit(&srv.url, &record("m", i)).unwrap();
    }
    let h = client::health(&srv.url).unwrap();
    assert_eq!((h.records, h.evicted), (10, 190));
    assert!(h.compactions > 0, "{h:?}");
    let log_len = std::fs::metadata(data.join("residues.log")).unwrap().len();
    assert!(
        log_len <= h.bytes + 4096 + 8 + 300,
        "log is {log_len} bytes for {} live bytes",
        h.bytes
    );
    assert!(
        client::lookup(&srv.url, &record("m", 189).key)
            .unwrap()
            .is_none(),
        "oldest evicted first"
    );
    assert!(client::lookup(&srv.url, &record("m", 190).key)
        .unwrap()
        .is_some());
    srv.kill9();

    let srv = Server::start(&data, &flags);
    assert_eq!(client::health(&srv.url).unwrap().records, 10);
    for i in 190..200 {
        assert!(
            client::lookup(&srv.url, &record("m", i).key)
                .unwrap()
                .is_some(),
            "record {i}"
        );
    }
    assert!(client::lookup(&srv.url, &record("m", 0).key)
        .unwrap()
        .is_none());
}

#[test]
fn sigterm_shuts_down_cleanly_and_second_instance_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut srv = Server::start(&data, &[]);
    client::admit(&srv.url, &record("m", 1)).unwrap();

    // A second collector on the same data directory must refuse (exit 1), not corrupt it.
    let out = Command::new(env!("CARGO_BIN_EXE_foil-control"))
        .args(["--port", "0", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("in use by another foil-control"));

    // SAFETY: sending a signal to our own child process.
    let sent = unsafe { libc::kill(srv.child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = srv.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "no exit within 15 s of SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0), "stderr:\n{}", srv.stderr());
    assert!(srv.stderr().contains("SIGTERM received"));

    let srv = Server::start(&data, &[]);
    assert!(client::lookup(&srv.url, &record("m", 1).key)
        .unwrap()
        .is_some());
}

#[test]
fn bad_arguments_exit_2_and_foreign_log_exits_1() {
    let out = Command::new(env!("CARGO_BIN_EXE_foil-control"))
        .args(["--max-body", "lots"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("residues.log"), b"something else entirely").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_foil-control"))
        .args(["--port", "0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a foil-control log"));
    assert_eq!(
        std::fs::read(dir.path().join("residues.log")).unwrap(),
        b"something else entirely"
    );
}

/// Issue 17 item 13: a chunked body that trickles forever (a byte every 200 ms, never the
/// last chunk) was held open indefinitely. With `--body-timeout 1` it gets 408 and the
/// connection is closed, while other clients are served meanwhile.
#[test]
fn trickling_chunked_body_gets_408_and_the_connection_closes() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &["--body-timeout", "1"]);
    let mut s = TcpStream::connect(&srv.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    s.write_all(
        b"POST /.aeon/model-forward-cache HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
    )
    .unwrap();
    let mut w = s.try_clone().unwrap();
    let stop = Arc::new(Mutex::new(false));
    let stop2 = Arc::clone(&stop);
    let trickle = std::thread::spawn(move || {
        for _ in 0..75 {
            if *stop2.lock().unwrap() || w.write_all(b"1\r\n \r\n").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    });
    assert_eq!(
        client::health(&srv.url).unwrap().records,
        0,
        "others are served"
    );
    let mut buf = Vec::new();
    let read = s.read_to_end(&mut buf);
    *stop.lock().unwrap() = true;
    trickle.join().unwrap();
    let text = String::from_utf8_lossy(&buf);
    assert!(
        read.is_ok(),
        "the server closes the connection: {read:?}, got {text:?}"
    );
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("request_timeout"), "{text}");
    // A body that arrives in time still goes in.
    client::admit(&srv.url, &record("m", 1)).unwrap();
    assert_eq!(client::health(&srv.url).unwrap().records, 1);
}

/// Issue 17 item 13: a key carrying a C1 control character (U+0085, NEL) was stored; the
/// spec forbids control characters in keys. Now 400, nothing stored.
#[test]
fn key_with_c1_control_character_is_400() {
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(&dir.path().join("data"), &[]);
    let mut r = record("m", 1);
    r.key = "m:dense:1\u{85}2".into();
    let body = serde_json::to_string(&r).unwrap();
    let (status, reply) = raw(
        &srv.addr,
        format!(
            "POST /.aeon/model-forward-cache HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    );
    assert_eq!(status, 400, "{reply}");
    assert!(
        reply["detail"]
            .as_str()
            .unwrap()
            .contains("control character at byte 9"),
        "{reply}"
    );
    assert_eq!(client::health(&srv.url).unwrap().records, 0);
}
