//! Trust on the wire, end to end over real station processes: a revoked grant (or a grant
//! attenuated from one) is refused by a running entry as soon as the signed revocation list
//! changes; a keyed chain seals the client's request and the exit's answer as well as the
//! residuals between nodes, gives the same tokens as an open chain, and the client refuses a
//! tampered, stripped or replayed answer; an unsealed client request gets 401. Prints the
//! per-hop sealing cost, the return path included (`--nocapture`).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ed25519_dalek::{Signer, SigningKey};
use fat_station::client::SealedStep;
use fat_station::mesh::grant::{hex, GRANT_DOMAIN, REVOCATION_DOMAIN};
use fat_station::mesh::mesh_file::MeshHop;
use fat_station::mesh::replicas::{MeshChain, MeshError, ReplicaSet, StepOut};
use fat_station::mesh::seal::{self, MeshKey, SealContext, SealDir};
use fat_station::wire;
use support::*;

fn start(args: &[&str]) -> StationProc {
    spawn_station(&[args, &["--listen", "127.0.0.1:0", "--threads", "1"]].concat())
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

/// Status and body of a request, whatever the status.
fn send(r: ureq::Request, body: &[u8]) -> (u16, Vec<u8>) {
    let r = match r.send_bytes(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("transport: {e}"),
    };
    let status = r.status();
    let mut b = Vec::new();
    r.into_reader().read_to_end(&mut b).expect("body");
    (status, b)
}

fn error_of(body: &[u8]) -> wire::ErrorBody {
    serde_json::from_slice(body)
        .unwrap_or_else(|_| panic!("not an error body: {}", String::from_utf8_lossy(body)))
}

const PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];

// ---------------------------------------------------------------------------------------
// Revocation.

/// A grant file in monster-guard's canonical encoding (`specs/qspec.md`, "Grant encoding")
/// for the model whose file BLAKE3 is `model`.
fn mint(key: &SigningKey, name: &str, expires: u64, parent: Option<&str>, model: &str) -> String {
    let issuer = hex(key.verifying_key().as_bytes());
    let h = "ab".repeat(32);
    let parent_id = match parent {
        Some(p) => format!("\"{}\"", grant_id(p)),
        None => "null".into(),
    };
    let payload = format!(
        r#"{{"v":1,"name":"{name}","caps":["net"],"issued":1000,"expires":{expires},"issuer":"{issuer}","model_path":"/m.knot","model_hash":"{model}","qspec_hash":"{h}","probes":[],"parent":{parent_id}}}"#
    );
    let mut msg = GRANT_DOMAIN.to_vec();
    msg.extend_from_slice(payload.as_bytes());
    let sig = hex(&key.sign(&msg).to_bytes());
    let parent_env = parent.map(|p| p.trim_end().to_string());
    format!(
        r#"{{"grant":{payload},"sig":"{sig}","parent":{}}}"#,
        parent_env.as_deref().unwrap_or("null")
    ) + "\n"
}

/// BLAKE3 of a grant file's payload bytes (monster-guard's grant id).
fn grant_id(file: &str) -> String {
    let raw = &file[9..file.find(r#","sig":""#).expect("sig")];
    blake3::hash(raw.as_bytes()).to_hex().to_string()
}

/// Writes a signed revocation list exactly as monster-guard's `RevocationList::save` does:
/// signature over the compact JSON of the list, the file pretty-printed, temp file + rename.
fn write_revocations(path: &Path, key: &SigningKey, entries: &[(String, &str, u64)]) {
    let compact = format!(
        r#"{{"v":1,"issuer":"{}","entries":[{}]}}"#,
        hex(key.verifying_key().as_bytes()),
        entries
            .iter()
            .map(|(id, name, at)| format!(r#"{{"id":"{id}","name":"{name}","at":{at}}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut msg = REVOCATION_DOMAIN.to_vec();
    msg.extend_from_slice(compact.as_bytes());
    let sig = hex(&key.sign(&msg).to_bytes());
    let text = format!("{{\n  \"list\": {compact},\n  \"sig\": \"{sig}\"\n}}\n");
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write list");
    std::fs::rename(&tmp, path).expect("rename list");
}

/// The monster-guard binary: `$MONSTER_GUARD`, else the workspace's `target/release` one.
fn monster_guard() -> Option<PathBuf> {
    let p = std::env::var_os("MONSTER_GUARD")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/monster-guard")
        });
    p.exists().then_some(p)
}

/// POST /chain with a grant; (status, body).
fn chain_with_grant(url: &str, grant: &str) -> (u16, Vec<u8>) {
    let body = serde_json::to_vec(&wire::ChainRequest {
        tokens: vec![1, 2, 3],
        exit: None,
    })
    .expect("json");
    send(
        agent()
            .post(&format!("{url}{}", wire::ROUTE_CHAIN))
            .set(wire::H_RETURN, "token")
            .set(wire::H_GRANT, &hex(grant.as_bytes())),
        &body,
    )
}

#[test]
fn a_running_entry_refuses_a_grant_once_it_is_revoked() {
    let Some(path) = model(SMOLLM2) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let home = dir.path().join("guard");
    // The issuer: monster-guard's own identity when the binary is built (so its `revoke`
    // writes the list), else a test key and a list written the way monster-guard writes it.
    let guard = monster_guard();
    let key = match &guard {
        Some(bin) => {
            let out = Command::new(bin)
                .arg("init")
                .env("MONSTER_GUARD_HOME", &home)
                .output()
                .expect("monster-guard init");
            assert!(out.status.success(), "init: {out:?}");
            let text = std::fs::read_to_string(home.join("node.key")).expect("node.key");
            let b: Vec<u8> = (0..64)
                .step_by(2)
                .map(|i| u8::from_str_radix(&text.trim()[i..i + 2], 16).expect("hex"))
                .collect();
            SigningKey::from_bytes(&b.try_into().expect("32 bytes"))
        }
        None => {
            eprintln!("monster-guard not built: writing the revocation list in the test");
            std::fs::create_dir_all(&home).expect("home");
            SigningKey::from_bytes(&[0x42; 32])
        }
    };
    let list = home.join("revoked.json");
    let issuer = hex(key.verifying_key().as_bytes());
    let far = grant_now() + 3600;
    let served = aeon_grant::model_file_hash(&path).expect("hash the model");
    let parent = mint(&key, "qwen", far, None, &served);
    let child = mint(&key, "qwen", far - 60, Some(&parent), &served);
    let other = mint(&key, "other", far, None, &served);

    let st = start(&[
        "--knot",
        path.to_str().expect("utf-8"),
        "--require-grant",
        &issuer,
        "--revocations",
        list.to_str().expect("utf-8"),
        "--state-dir",
        dir.path().join("station-state").to_str().expect("utf-8"),
    ]);
    for g in [&parent, &child, &other] {
        let (s, b) = chain_with_grant(&st.url, g);
        assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    }

    // Revoke "qwen" while the station runs.
    match &guard {
        Some(bin) => {
            let grants = home.join("grants");
            std::fs::create_dir_all(&grants).expect("grants dir");
            set_mode(&grants, 0o700);
            let f = grants.join("qwen.json");
            std::fs::write(&f, &parent).expect("store grant");
            set_mode(&f, 0o600);
            let out = Command::new(bin)
                .args(["revoke", "qwen"])
                .env("MONSTER_GUARD_HOME", &home)
                .output()
                .expect("monster-guard revoke");
            assert!(out.status.success(), "revoke: {out:?}");
        }
        None => write_revocations(&list, &key, &[(grant_id(&parent), "qwen", grant_now())]),
    }
    let t = Instant::now();
    let (s, b) = loop {
        let (s, b) = chain_with_grant(&st.url, &parent);
        if s != 200 || t.elapsed() > Duration::from_secs(2) {
            break (s, b);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t.elapsed();
    assert_eq!(s, 403, "{}", String::from_utf8_lossy(&b));
    let e = error_of(&b);
    assert_eq!(e.error, "grant_revoked", "{}", e.message);
    assert!(
        e.message.contains("\"qwen\"") && e.message.contains("revoked at unix time"),
        "{}",
        e.message
    );
    assert!(took < Duration::from_secs(1), "took {took:?}");
    eprintln!(
        "revocation took effect after {:.0} ms",
        took.as_secs_f64() * 1e3
    );
    // The attenuated child falls with its parent; an unrelated grant still passes.
    let (s, b) = chain_with_grant(&st.url, &child);
    let e = error_of(&b);
    assert_eq!(
        (s, e.error.as_str()),
        (403, "grant_revoked"),
        "{}",
        e.message
    );
    assert!(e.message.contains("attenuated from"), "{}", e.message);
    let (s, b) = chain_with_grant(&st.url, &other);
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));

    // A list that stops verifying refuses every grant (fail closed) until it verifies again.
    let good = std::fs::read_to_string(&list).expect("list");
    let forged = good.replacen("\"qwen\"", "\"qwex\"", 1);
    assert_ne!(forged, good);
    let tmp = list.with_extension("tmp");
    std::fs::write(&tmp, &forged).expect("forge");
    std::fs::rename(&tmp, &list).expect("rename");
    let (s, b) = chain_with_grant(&st.url, &other);
    let e = error_of(&b);
    assert_eq!(
        (s, e.error.as_str()),
        (503, "revocations_unverified"),
        "{}",
        e.message
    );
    assert!(e.message.contains("does not verify"), "{}", e.message);
    std::fs::write(&tmp, &good).expect("restore");
    std::fs::rename(&tmp, &list).expect("rename");
    let (s, _) = chain_with_grant(&st.url, &other);
    assert_eq!(s, 200);
}

/// Issue 32.4: a station under `--require-grant` accepted a grant minted for a different
/// model (a tiny one opened the Qwen station's `/chain`). Now the grant's `model_hash` must be
/// the BLAKE3 of the file the station serves (what `monster-guard delegate --knot FILE`
/// mints): a grant for another model, or an attenuated child of one, is refused with 403
/// `grant_refused` before any compute; the grant for the served model is accepted.
#[test]
fn an_entry_refuses_a_grant_minted_for_another_model() {
    let Some(path) = model(SMOLLM2) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let key = SigningKey::from_bytes(&[0x24; 32]);
    let tiny = dir.path().join("tiny.knot");
    std::fs::write(&tiny, b"a tiny model that passed its own qspec").expect("tiny");
    let far = grant_now() + 3600;
    let for_tiny = mint(
        &key,
        "tiny",
        far,
        None,
        &aeon_grant::model_file_hash(&tiny).expect("hash"),
    );
    let child_of_tiny = mint(&key, "tiny", far - 60, Some(&for_tiny), &{
        aeon_grant::model_file_hash(&tiny).expect("hash")
    });
    let served = aeon_grant::model_file_hash(&path).expect("hash the model");
    let for_served = mint(&key, "smol", far, None, &served);
    let st = start(&[
        "--knot",
        path.to_str().expect("utf-8"),
        "--require-grant",
        &hex(key.verifying_key().as_bytes()),
    ]);
    for g in [&for_tiny, &child_of_tiny] {
        let (s, b) = chain_with_grant(&st.url, g);
        let e = error_of(&b);
        assert_eq!(
            (s, e.error.as_str()),
            (403, "grant_refused"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("minted for another model"),
            "{}",
            e.message
        );
    }
    let (s, b) = chain_with_grant(&st.url, &for_served);
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    // The operator may name the model instead (an entry shard must): then only that one.
    let st = start(&[
        "--knot",
        path.to_str().expect("utf-8"),
        "--require-grant",
        &hex(key.verifying_key().as_bytes()),
        "--grant-model-hash",
        &aeon_grant::model_file_hash(&tiny).expect("hash"),
    ]);
    assert_eq!(chain_with_grant(&st.url, &for_tiny).0, 200);
    assert_eq!(chain_with_grant(&st.url, &for_served).0, 403);
}

/// Writes an entry shard of `src` (tokenizer, embedding, layers `0..n`) as `shard-knot split`
/// does: a shard record naming the parent's model hash.
fn entry_shard(src: &Path, dst: &Path, n: u32) {
    use knot_format::{Knot, KnotWriter, LayerRange, Role, ShardRecord};
    let k = Knot::open(src).expect("open model");
    let h = k.header().clone();
    let mut w = KnotWriter::new(h.model_id.clone(), h.arch.clone());
    if let Some(t) = k.tokenizer().expect("tokenizer") {
        w.tokenizer(t);
    }
    w.shard(ShardRecord {
        role: Role::Entry,
        layers: LayerRange::new(0, n),
        parent_hash: k.model_hash().to_string(),
        parent_layers: h.arch.n_layers,
    });
    for t in k.tensors() {
        let keep = match t.layer() {
            Some(l) => l < n,
            None => t.entry.name == "token_embd.weight",
        };
        if keep {
            w.add_tensor(&t.entry.name, t.entry.dtype, t.entry.shape.clone(), t.bytes)
                .expect("add tensor");
        }
    }
    w.write(dst, &mut |_| {}).expect("write shard");
}

/// Issue 32.4 for a mesh: an entry shard cannot be probed alone, so its grants name the whole
/// model. Under `--require-grant` it will not start without `--grant-model-hash` (it would
/// otherwise bind to a hash no grant carries); with the whole model's file hash it admits that
/// model's grant and refuses another's.
#[test]
fn an_entry_shard_binds_grants_to_the_model_it_was_cut_from() {
    let Some(path) = model(SMOLLM2) else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let shard = dir.path().join("entry.knot");
    entry_shard(&path, &shard, 4);
    let key = SigningKey::from_bytes(&[0x25; 32]);
    let issuer = hex(key.verifying_key().as_bytes());
    let mut child = Command::new(station_bin())
        .args([
            "--knot",
            shard.to_str().expect("utf-8"),
            "--require-grant",
            &issuer,
        ])
        .args(["--listen", "127.0.0.1:0"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn station");
    let t = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if t.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("an entry shard under --require-grant started without --grant-model-hash");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(!status.success(), "{err}");
    assert!(err.contains("--grant-model-hash"), "{err}");

    let whole = aeon_grant::model_file_hash(&path).expect("hash");
    let far = grant_now() + 3600;
    let st = start(&[
        "--knot",
        shard.to_str().expect("utf-8"),
        "--require-grant",
        &issuer,
        "--grant-model-hash",
        &whole,
    ]);
    let (s, b) = chain_with_grant(&st.url, &mint(&key, "other", far, None, &"cd".repeat(32)));
    let e = error_of(&b);
    assert_eq!(
        (s, e.error.as_str()),
        (403, "grant_refused"),
        "{}",
        e.message
    );
    // The whole model's grant passes the entry's check: what stops it is the mesh's business
    // (this shard has no successor).
    let (s, b) = chain_with_grant(&st.url, &mint(&key, "smol", far, None, &whole));
    let e = error_of(&b);
    assert_eq!(
        (s, e.error.as_str()),
        (409, "no_successor"),
        "{}",
        e.message
    );
}

fn grant_now() -> u64 {
    fat_station::mesh::grant::now_s()
}

#[cfg(unix)]
fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

#[cfg(not(unix))]
fn set_mode(_: &Path, _: u32) {}

// ---------------------------------------------------------------------------------------
// Sealed requests and answers.

/// What a man in the middle does to the entry's answer.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mitm {
    Pass,
    /// Flip one bit of the body.
    Flip,
    /// Drop `X-Seal` / `X-Seal-Ts` and send the body as is.
    Strip,
    /// Answer with the previous answer (a valid seal, for another request).
    Replay,
}

/// A one-request-per-connection HTTP proxy in front of `target` that applies `mode` to the
/// answers. Returns its base URL.
fn proxy(target: String, mode: Arc<Mutex<Mitm>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    std::thread::spawn(move || {
        let agent = agent();
        let mut last: Option<Answer> = None;
        for s in l.incoming() {
            let Ok(s) = s else { continue };
            let m = *mode.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(a) = relay_one(&agent, &target, s, m, &last) {
                last = Some(a);
            }
        }
    });
    url
}

type Answer = (u16, Vec<(String, String)>, Vec<u8>);

fn relay_one(
    agent: &ureq::Agent,
    target: &str,
    s: TcpStream,
    mode: Mitm,
    last: &Option<Answer>,
) -> Option<Answer> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut req = agent.post(&format!("{target}{path}"));
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        match k.as_str() {
            "content-length" => len = v.parse().ok()?,
            "host" | "connection" | "transfer-encoding" => {}
            _ => req = req.set(&k, v),
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    let resp = match req.send_bytes(&body) {
        Ok(x) => x,
        Err(ureq::Error::Status(_, x)) => x,
        Err(_) => return None,
    };
    let status = resp.status();
    let headers: Vec<(String, String)> = [
        "content-type",
        wire::H_SEAL,
        wire::H_SEAL_TS,
        wire::H_REQUEST_ID,
        wire::H_CHAIN_TRACE,
    ]
    .iter()
    .filter_map(|h| resp.header(h).map(|v| (h.to_string(), v.to_string())))
    .collect();
    let mut b = Vec::new();
    resp.into_reader().read_to_end(&mut b).ok()?;
    let real = (status, headers, b);
    let (status, mut headers, mut b) = match (mode, last) {
        (Mitm::Replay, Some(prev)) => prev.clone(),
        _ => real.clone(),
    };
    match mode {
        Mitm::Flip => {
            let i = b.len() / 2;
            b[i] ^= 0x04;
        }
        Mitm::Strip => headers.retain(|(k, _)| k != wire::H_SEAL && k != wire::H_SEAL_TS),
        _ => {}
    }
    let mut out = s;
    let mut head = format!("HTTP/1.1 {status} X\r\n");
    for (k, v) in &headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n",
        b.len()
    ));
    out.write_all(head.as_bytes()).ok()?;
    out.write_all(&b).ok()?;
    Some(real)
}

const RANGES: [(&str, &str); 3] = [("entry", "0..8"), ("mid", "8..16"), ("exit", "16..24")];

fn chain_of(nodes: &[StationProc], key: Option<&MeshKey>) -> MeshChain {
    let hops = nodes
        .iter()
        .zip(RANGES)
        .enumerate()
        .map(|(i, (n, (_, l)))| MeshHop {
            node_id: format!("n{i}"),
            url: n.url.clone(),
            layers: l.replace("..", "-"),
        })
        .collect();
    let mut c = MeshChain::new(hops, Duration::from_secs(120)).expect("chain");
    c.mesh_key = key.cloned();
    c
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[test]
fn a_keyed_chain_seals_request_and_answer_and_matches_the_open_chain() {
    let Some(path) = model(QWEN) else { return };
    let m = path.to_str().expect("utf-8");
    let dir = tempfile::tempdir().expect("tempdir");
    let key_path = dir.path().join("mesh.key");
    let key_bytes = [0x3cu8; 32];
    std::fs::write(&key_path, key_bytes).expect("key");
    let key = MeshKey::from_bytes(&key_bytes);
    let k = key_path.to_str().expect("utf-8");
    // Exit first, so each node can be told its next hop (X-Route may name only that).
    let start_chain = |keyed: bool| -> Vec<StationProc> {
        let mut nodes: Vec<StationProc> = Vec::new();
        for (role, layers) in RANGES.iter().rev() {
            let mut a = vec!["--knot", m, "--role", role, "--layers", layers];
            if keyed {
                a.extend(["--mesh-key", k]);
            }
            let next = nodes.last().map(|n| n.url.clone());
            if let Some(next) = &next {
                a.extend(["--route-to", next.as_str()]);
            }
            nodes.push(start(&a));
        }
        nodes.reverse();
        nodes
    };
    let open = start_chain(false);
    let sealed = start_chain(true);

    // Same greedy tokens, open and sealed (request, three residual hops' worth of seals, and
    // the answer); the logits of one step are bit-identical.
    let gen = |c: MeshChain, name: &str| -> Vec<u32> {
        let mut rs = ReplicaSet::new(vec![c], name).expect("replicas");
        rs.generate_greedy(&PROMPT, 8, &[], &mut |_, _| {})
            .expect("generation")
    };
    let want = gen(chain_of(&open, None), "open1");
    assert_eq!(want[0], 12095, "\" Paris\" first");
    assert_eq!(gen(chain_of(&sealed, Some(&key)), "sealed1"), want);
    let lo = chain_of(&open, None)
        .step(&PROMPT, None, true)
        .expect("open logits");
    let ls = chain_of(&sealed, Some(&key))
        .step(&PROMPT, None, true)
        .expect("sealed logits");
    let bits = |s: &StepOut| -> Vec<u32> {
        s.logits
            .as_ref()
            .expect("logits")
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(
        bits(&lo),
        bits(&ls),
        "sealed logits equal open logits bit for bit"
    );
    assert_eq!(ls.trace.len(), 3, "three nodes answered");

    // An unsealed client request to the keyed entry: 401.
    match chain_of(&sealed, None).step(&PROMPT, None, false) {
        Err(MeshError::Refused(fat_station::wire::Refusal { status, code, .. })) => {
            assert_eq!((status, code.as_str()), (401, "unsealed"))
        }
        other => panic!("expected 401 unsealed, got {other:?}"),
    }
    // A keyed client in front of an open entry gets an unsealed answer and says so.
    let e = chain_of(&open, Some(&key))
        .step(&PROMPT, None, false)
        .expect_err("an open entry cannot answer a sealed request");
    assert!(e.to_string().contains("no_key"), "{e}");

    // A sealed request replayed to the entry: 409; a request seal sent as a residual: 403.
    let route = format!("{},{}", sealed[1].url, sealed[2].url);
    let mut step = SealedStep::new(&key, None, &route, true);
    let plain = serde_json::to_vec(&wire::ChainRequest {
        tokens: PROMPT.to_vec(),
        exit: None,
    })
    .expect("json");
    let (body, ts) = step.seal_request(&plain);
    let post = |url: &str| {
        agent()
            .post(&format!("{url}{}", wire::ROUTE_CHAIN))
            .set(wire::H_RETURN, "token")
            .set(wire::H_ROUTE, &route)
            .set(wire::H_REQUEST_ID, &step.request_id)
            .set(wire::H_SEAL, "v1")
            .set(wire::H_SEAL_TS, &ts.to_string())
    };
    let (s, b) = send(post(&sealed[0].url), &body);
    assert_eq!(s, 200, "{}", String::from_utf8_lossy(&b));
    let (s, b) = send(post(&sealed[0].url), &body);
    assert_eq!((s, error_of(&b).error.as_str()), (409, "replayed"));
    let (s, b) = send(post(&sealed[1].url).set(wire::H_FROM_LAYER, "8"), &body);
    assert_eq!((s, error_of(&b).error.as_str()), (403, "seal_invalid"));

    // A man in the middle at the entry: the client refuses a changed, stripped or replayed
    // answer with a clear error.
    let mode = Arc::new(Mutex::new(Mitm::Pass));
    let mitm = proxy(sealed[0].url.clone(), mode.clone());
    let mut via = chain_of(&sealed, Some(&key));
    via.hops[0].url = mitm;
    let ok = via
        .step(&PROMPT, None, false)
        .expect("through an honest proxy");
    assert_eq!(ok.token, 12095);
    for (m, says) in [
        (Mitm::Flip, "seal does not verify"),
        (Mitm::Strip, "not sealed"),
        (Mitm::Replay, "seal does not verify"),
    ] {
        *mode.lock().expect("mode") = m;
        let e = via
            .step(&PROMPT, None, false)
            .expect_err("a changed answer is refused");
        let text = e.to_string();
        assert!(
            matches!(e, MeshError::BadResponse { .. })
                && text.contains("sealed response refused")
                && text.contains(says),
            "{m:?}: {text}"
        );
        eprintln!("{m:?}: {text}");
    }

    // The cost of sealing per hop, the return path included: decode steps in one session
    // (varying tokens), open and sealed chains interleaved step by step (so both see the same
    // load on shared cores), both answer kinds.
    let steps = 16;
    let mut report = Vec::new();
    for want_logits in [false, true] {
        let chains = [chain_of(&open, None), chain_of(&sealed, Some(&key))];
        let sess: Vec<String> = (0..2)
            .map(|k| format!("cost{}{k}", want_logits as u8))
            .collect();
        for (c, s) in chains.iter().zip(&sess) {
            c.step(&PROMPT, Some((s, 0)), want_logits).expect("prefill");
        }
        let mut walls = [Vec::new(), Vec::new()];
        let mut seal_node = vec![Vec::new(); 3];
        let mut tok = [100u32; 2];
        for i in 0..steps {
            for k in 0..2 {
                let s = chains[k]
                    .step(&[tok[k]], Some((&sess[k], PROMPT.len() + i)), want_logits)
                    .expect("decode");
                tok[k] = (s.token + 7) % 150_000;
                walls[k].push(s.wall_ms);
                if k == 1 {
                    for (j, t) in s.trace.iter().enumerate() {
                        seal_node[j].push(t.3);
                    }
                }
            }
        }
        let [wo, ws] = walls;
        report.push((
            want_logits,
            median(wo),
            median(ws),
            seal_node.into_iter().map(median).collect::<Vec<_>>(),
        ));
    }
    // Client-side seal + open for the same bodies, and the raw cipher cost per size.
    let bench = |n: usize| -> f64 {
        let plain = vec![7u8; n];
        let ctx = SealContext {
            dir: SealDir::Response,
            request_id: "c0",
            from_layer: 24,
            session: "s",
            pos: 9,
            ts_ms: seal::now_ms(),
            route: "",
            ret: "logits",
        };
        let reps = if n > 100_000 { 20 } else { 2000 };
        let t = Instant::now();
        for _ in 0..reps {
            let s = key.seal(&plain, &ctx);
            key.open(&s, &ctx).expect("opens");
        }
        t.elapsed().as_secs_f64() * 1e3 / reps as f64
    };
    eprintln!(
        "sealing cost ({steps} decode steps, median; 3-node chain 0-8/8-16/16-24, Qwen2.5-0.5B):"
    );
    for (want_logits, ow, sw, seals) in &report {
        let kind = if *want_logits {
            "logits (607744 B answer)"
        } else {
            "token (JSON answer)"
        };
        eprintln!(
            "  {kind}: wall open {ow:.2} ms, sealed {sw:.2} ms ({:+.2}); per node seal+open ms: entry {:.4} (request open + residual seal), mid {:.4}, exit {:.4} (residual open + answer seal)",
            sw - ow,
            seals[0],
            seals[1],
            seals[2]
        );
    }
    eprintln!(
        "  seal+open of one body: 30 B request {:.4} ms, 3584 B residual {:.4} ms, 607744 B logits {:.3} ms",
        bench(30),
        bench(3584),
        bench(607_744)
    );
}
