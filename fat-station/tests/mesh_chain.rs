//! The mesh end to end on the real Qwen model: six station processes (two replica chains of
//! 0-8, 8-16, 16-24) started from node manifests with a mesh key, found by UDP beacon, formed
//! into chains, generating 16 greedy tokens equal to the single-process engine's while the
//! middle node of the active chain is killed; sealed residuals that are tampered, replayed or
//! unsealed are refused.

mod support;

use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant};

use fat_station::engine::Model;
use fat_station::mesh::mesh_file::{MeshFile, MeshHop};
use fat_station::mesh::replicas::{MeshChain, ReplicaSet};
use fat_station::mesh::seal::{self, MeshKey, SealContext, SealDir};
use fat_station::wire;
use knot_format::{Knot, LayerRange};
use station_wire::beacon;
use support::*;

fn start(args: &[&str]) -> StationProc {
    spawn_station(args)
}

const PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];
const RANGES: [(u32, u32); 3] = [(0, 8), (8, 16), (16, 24)];

fn write_manifests(dir: &Path, knot: &Path, model_hash: &str, ports: &[u16]) {
    for c in 0..2u32 {
        for (i, (a, b)) in RANGES.iter().enumerate() {
            let k = c as usize * 3 + i;
            let role = ["entry", "mid", "exit"][i];
            let successor = if i < 2 {
                let (na, nb) = RANGES[i + 1];
                format!(
                    r#"{{"node_id":"c{c}n{}","url":"http://127.0.0.1:{}","layers":"{na}-{nb}"}}"#,
                    i + 1,
                    ports[k + 1]
                )
            } else {
                "null".into()
            };
            let m = format!(
                r#"{{"node_id":"c{c}n{i}","model_id":"qwen","model_hash":"{model_hash}","role":"{role}","layers":"{a}-{b}","successor":{successor},"listen":"127.0.0.1:{}","shard":"{}","chain":{c}}}"#,
                ports[k],
                knot.display()
            );
            std::fs::write(dir.join(format!("c{c}n{i}.json")), m).expect("write manifest");
        }
    }
}

#[test]
fn mesh_by_discovery_matches_single_station_survives_a_dead_node_and_refuses_bad_seals() {
    let Some(path) = model(QWEN) else { return };
    let knot = Knot::open(&path).expect("open qwen");
    let model = Model::load(&knot, None).expect("load");

    // Reference: greedy in one process.
    let mut s = model.new_session(64);
    let mut want = Vec::new();
    let mut next = model.logits(&mut s, &PROMPT).expect("prefill");
    for _ in 0..16 {
        let t = argmax(&next) as u32;
        want.push(t);
        next = model.logits(&mut s, &[t]).expect("decode");
    }
    assert_eq!(want[0], 12095, "reference starts with \" Paris\"");

    let dir = tempfile::tempdir().expect("tempdir");
    let key_path = dir.path().join("mesh.key");
    let key_bytes = [0x5au8; 32];
    std::fs::write(&key_path, key_bytes).expect("key");
    let ports: Vec<u16> = (0..6).map(|_| free_port()).collect();
    write_manifests(dir.path(), &path, knot.model_hash(), &ports);
    let beacon_port = UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("udp port")
        .port();
    let beacon_to = format!("127.0.0.1:{beacon_port}");
    let mut nodes: Vec<Option<StationProc>> = Vec::new();
    for c in 0..2 {
        for i in 0..3 {
            let m = dir.path().join(format!("c{c}n{i}.json"));
            let args = [
                "--manifest",
                m.to_str().expect("utf-8"),
                "--mesh-key",
                key_path.to_str().expect("utf-8"),
                "--beacon",
                &beacon_to,
                "--beacon-interval-ms",
                "100",
                "--threads",
                "1",
                "--hop-timeout-s",
                "60",
            ];
            nodes.push(Some(start(&args)));
        }
    }

    // Discovery and the ephemeral elector.
    let heard = beacon::discover(
        beacon_to.parse::<SocketAddr>().expect("addr"),
        Duration::from_millis(1500),
    )
    .expect("discover");
    assert_eq!(heard.len(), 6, "all six nodes announce: {heard:?}");
    assert!(heard
        .iter()
        .all(|a| a.mesh == "sealed" && a.model_hash == knot.model_hash()));
    let formed: MeshFile = beacon::form(&heard, None).expect("form");
    let ids: Vec<Vec<&str>> = formed
        .chains
        .iter()
        .map(|c| c.iter().map(|h| h.node_id.as_str()).collect())
        .collect();
    assert_eq!(
        ids,
        vec![vec!["c0n0", "c0n1", "c0n2"], vec!["c1n0", "c1n1", "c1n2"]]
    );

    // Generate 16 tokens, killing chain 0's middle node after the 5th.
    // The client holds the mesh key too: it seals its requests and opens the answers.
    let key = MeshKey::from_bytes(&key_bytes);
    let mut rs =
        ReplicaSet::from_file(&formed, Duration::from_secs(120), "gen1").expect("replicas");
    for c in rs.chains_mut() {
        c.mesh_key = Some(key.clone());
    }
    let mut hops_seen = 0;
    let t0 = Instant::now();
    let got = rs
        .generate_greedy(&PROMPT, 16, &[], &mut |i, step| {
            hops_seen = hops_seen.max(step.trace.len());
            if i == 4 {
                nodes[1] = None; // c0n1 (layers 8-16) dies
            }
        })
        .expect("generation completes on the replica");
    let wall = t0.elapsed();
    assert_eq!(
        got, want,
        "mesh tokens equal the single-process greedy tokens"
    );
    assert_eq!(
        hops_seen, 3,
        "one request per token went through three nodes"
    );
    assert_eq!(rs.failovers.len(), 1, "exactly one failover");
    let f = &rs.failovers[0];
    assert_eq!(
        (f.from_chain, f.to_chain, f.reprefilled),
        (0, 1, PROMPT.len() + 5)
    );
    assert!(
        f.error.contains("c0n1") && f.error.contains("8-16"),
        "failover names the dead node and range: {}",
        f.error
    );
    eprintln!("16 tokens with one failover in {:.1} s", wall.as_secs_f64());

    // Without a replica the failure is reported, naming node and range, promptly.
    let mut chain0 =
        MeshChain::new(formed.chains[0].clone(), Duration::from_secs(30)).expect("chain");
    chain0.mesh_key = Some(key.clone());
    let mut lone = ReplicaSet::new(vec![chain0], "gen2").expect("one chain");
    let t = Instant::now();
    let e = lone
        .next(&PROMPT, false)
        .expect_err("chain 0 is broken")
        .to_string();
    assert!(e.contains("node c0n1 (layers 8-16)"), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "failure reported promptly"
    );

    // Sealed residuals at chain 1's exit (16-24): valid, replayed, tampered, unsealed.
    let exit = nodes[5].as_ref().expect("c1n2").url.clone();
    let mut sess = model.new_session(64);
    let mut x = model.embed(&PROMPT).expect("embed");
    model
        .forward(&mut sess, &mut x, LayerRange::new(0, 16))
        .expect("forward 0-16");
    let plain = wire::encode_f32(&x);
    let ts = seal::now_ms();
    let ctx = SealContext {
        dir: SealDir::Hop,
        request_id: "t-1",
        from_layer: 16,
        session: "",
        pos: 0,
        ts_ms: ts,
        route: "",
        ret: "token",
    };
    let sealed = key.seal(&plain, &ctx);
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build();
    let post = |body: &[u8], sealed: bool| -> (u16, String) {
        let mut r = agent
            .post(&format!("{exit}/chain"))
            .set(wire::H_REQUEST_ID, "t-1")
            .set(wire::H_FROM_LAYER, "16")
            .set(wire::H_RETURN, "token");
        if sealed {
            r = r
                .set(wire::H_SEAL, "v1")
                .set(wire::H_SEAL_TS, &ts.to_string());
        }
        match r.send_bytes(body) {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
            Err(e) => panic!("transport: {e}"),
        }
    };
    // The answer travels sealed for the requester, under the request id it chose.
    let r = agent
        .post(&format!("{exit}/chain"))
        .set(wire::H_REQUEST_ID, "t-1")
        .set(wire::H_FROM_LAYER, "16")
        .set(wire::H_RETURN, "token")
        .set(wire::H_SEAL, "v1")
        .set(wire::H_SEAL_TS, &ts.to_string())
        .send_bytes(&sealed)
        .expect("a valid sealed residual is accepted");
    assert_eq!(r.header(wire::H_SEAL), Some("v1"));
    let answer_ts: u64 = r
        .header(wire::H_SEAL_TS)
        .and_then(|t| t.parse().ok())
        .expect("X-Seal-Ts on the answer");
    let mut answer = Vec::new();
    std::io::Read::read_to_end(&mut r.into_reader(), &mut answer).expect("answer");
    let answer_ctx = SealContext {
        dir: SealDir::Response,
        from_layer: 24,
        ts_ms: answer_ts,
        ..ctx.clone()
    };
    let (tok, _) = key.open(&answer, &answer_ctx).expect("the answer opens");
    let tok: wire::ChainToken = serde_json::from_slice(&tok).expect("token json");
    assert_eq!(tok.token, 12095);
    let (st, body) = post(&sealed, true);
    assert_eq!(st, 409, "a replay is refused: {body}");
    assert!(body.contains("replayed"), "{body}");
    let mut tampered = sealed.clone();
    tampered[100] ^= 0x01;
    let (st, body) = post(&tampered, true);
    assert_eq!(st, 403, "a tampered residual is refused: {body}");
    let (st, body) = post(&plain, false);
    assert_eq!(st, 401, "an unsealed residual is refused: {body}");
    let health: wire::Health = serde_json::from_str(
        &agent
            .get(&format!("{exit}/health"))
            .call()
            .expect("health")
            .into_string()
            .expect("body"),
    )
    .expect("json");
    assert_eq!(health.mesh.as_deref(), Some("sealed"));

    // An open single station says so, and serves /chain in one hop.
    let open = start(&[
        "--knot",
        path.to_str().expect("utf-8"),
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
    ]);
    let h: wire::Health = serde_json::from_str(
        &agent
            .get(&format!("{}/health", open.url))
            .call()
            .expect("health")
            .into_string()
            .expect("body"),
    )
    .expect("json");
    assert_eq!(h.mesh.as_deref(), Some("open"));
    let one = MeshChain::new(
        vec![MeshHop {
            node_id: "full".into(),
            url: open.url.clone(),
            layers: "0-24".into(),
        }],
        Duration::from_secs(60),
    )
    .expect("chain");
    let out = one.step(&PROMPT, None, true).expect("one-hop chain");
    let logits = out.logits.expect("logits");
    let mut s2 = model.new_session(64);
    let direct = model.logits(&mut s2, &PROMPT).expect("direct");
    assert!(
        logits
            .iter()
            .zip(&direct)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "chain logits equal the engine's bit for bit"
    );
}
