//! Three stations from three shards, as separate processes, equal one full station bit for bit.
//!
//! Splits Qwen2.5-0.5B into 0-8, 8-16, 16-24 with the shard-knot binary, starts one
//! `fat-station` per shard (each in its own network namespace when running as root, on
//! loopback ports otherwise), drives the chain with `fat_station::client::Chain` and
//! compares the logits with a single full station's. Also measures the resident memory of
//! the stations after serving.
//!
//! Needs the station binary: `target/release/fat-station` (build it with
//! `cargo build --release -p fat-station`) or `FAT_STATION_BIN`. Missing model or binary:
//! the test skips, unless AEON_REQUIRE_MODELS=1, when it fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fat_station::client::{Chain, ClientError, StationClient, StepTrace};
use fat_station::mesh::mesh_file::{MeshFile, MeshHop};
use knot_format::{Knot, LayerRange, Role};
use test_support::{model, spawn_url, station_bin, Proc, GEMMA, QWEN};

const PARIS: [u32; 5] = [785, 6722, 315, 9625, 374];
const PARIS_ID: usize = 12095;

/// Runs a command that must succeed (namespace plumbing).
fn sh(args: &[&str]) -> Result<(), String> {
    let o = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("{args:?}: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// One network namespace joined to the host by a veth pair: host side `10.200.N.1/24`,
/// namespace side `10.200.N.2/24`.
struct Netns {
    name: String,
    host_if: String,
    station_ip: String,
}

/// Namespaces and veths this test created; deleted on drop, even after a panic. Declared
/// before the stations so that they are killed first (locals drop in reverse order).
#[derive(Default)]
struct NetGuard {
    made: Vec<Netns>,
}

impl Drop for NetGuard {
    fn drop(&mut self) {
        for n in self.made.drain(..).rev() {
            // Deleting one end of a veth deletes both.
            let _ = sh(&["ip", "link", "del", &n.host_if]);
            let _ = sh(&["ip", "netns", "del", &n.name]);
        }
    }
}

/// A free `10.200.N.0/24` (no address of the host in it), starting from a per-process guess.
fn free_subnet(taken: &mut Vec<u32>) -> Result<u32, String> {
    let o = Command::new("ip")
        .args(["-o", "-4", "addr"])
        .output()
        .map_err(|e| e.to_string())?;
    let addrs = String::from_utf8_lossy(&o.stdout).to_string();
    let start = std::process::id() % 250;
    (0..250)
        .map(|i| 1 + (start + i) % 250)
        .find(|n| !taken.contains(n) && !addrs.contains(&format!("10.200.{n}.")))
        .inspect(|n| taken.push(*n))
        .ok_or_else(|| "no free 10.200.N.0/24".to_string())
}

impl NetGuard {
    /// Creates namespace `i`; it is recorded before any step can fail, so drop cleans it up.
    fn add(&mut self, i: usize, taken: &mut Vec<u32>) -> Result<usize, String> {
        let pid = std::process::id() % 100_000;
        let n = free_subnet(taken)?;
        let (name, host_if, ns_if) = (
            format!("aeon-shk-{pid}-{i}"),
            format!("ashk{pid}h{i}"),
            format!("ashk{pid}n{i}"),
        );
        sh(&["ip", "netns", "add", &name])?;
        self.made.push(Netns {
            name: name.clone(),
            host_if: host_if.clone(),
            station_ip: format!("10.200.{n}.2"),
        });
        sh(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ])?;
        sh(&["ip", "link", "set", &ns_if, "netns", &name])?;
        sh(&[
            "ip",
            "addr",
            "add",
            &format!("10.200.{n}.1/24"),
            "dev",
            &host_if,
        ])?;
        sh(&["ip", "link", "set", &host_if, "up"])?;
        sh(&[
            "ip",
            "netns",
            "exec",
            &name,
            "ip",
            "addr",
            "add",
            &format!("10.200.{n}.2/24"),
            "dev",
            &ns_if,
        ])?;
        sh(&[
            "ip", "netns", "exec", &name, "ip", "link", "set", &ns_if, "up",
        ])?;
        sh(&[
            "ip", "netns", "exec", &name, "ip", "link", "set", "lo", "up",
        ])?;
        Ok(self.made.len() - 1)
    }
}

/// A station process, killed on drop.
struct Station(Proc);

impl std::ops::Deref for Station {
    type Target = Proc;
    fn deref(&self) -> &Proc {
        &self.0
    }
}

impl Station {
    /// Resident set size in KiB (VmRSS).
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("read /proc status");
        let comm =
            std::fs::read_to_string(format!("/proc/{}/comm", self.child.id())).unwrap_or_default();
        assert_eq!(
            comm.trim(),
            "fat-station",
            "pid {} is not the station (ip netns exec must exec it)",
            self.child.id()
        );
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status")
    }
}

/// Starts `fat-station --knot KNOT --listen ADDR:0`, inside namespace `ns` when given, and
/// waits for its ready line.
fn start(bin: &Path, knot: &Path, ns: Option<&Netns>) -> Station {
    let listen = format!("{}:0", ns.map_or("127.0.0.1", |n| n.station_ip.as_str()));
    let mut cmd = match ns {
        Some(n) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &n.name]).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    cmd.arg("--knot")
        .arg(knot)
        .args(["--listen", &listen, "--threads", "2"]);
    Station(spawn_url(&mut cmd))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn argmax(x: &[f32]) -> usize {
    fat_station::engine::ops::argmax(x) as usize
}

/// Prefill the Paris prompt in a session, then decode " Paris": (prefill logits, decode logits).
fn run_chain(chain: &Chain, session: &str) -> (Vec<f32>, Vec<f32>, StepTrace) {
    let mut trace = StepTrace::default();
    let prefill = chain
        .step(&PARIS, Some((session, 0)), &mut trace)
        .expect("prefill through the chain");
    let mut t2 = StepTrace::default();
    let decode = chain
        .step(&[PARIS_ID as u32], Some((session, PARIS.len())), &mut t2)
        .expect("decode through the chain");
    (prefill, decode, trace)
}

/// Splits `model` at `ranges` with the real CLI into `out`.
fn split(model: &Path, ranges: &str, out: &Path) {
    let o = Command::new(env!("CARGO_BIN_EXE_shard-knot"))
        .arg("split")
        .arg(model)
        .args(["--ranges", ranges, "-o"])
        .arg(out)
        .output()
        .expect("run shard-knot");
    assert!(
        o.status.success(),
        "shard-knot split: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn three_shard_stations_equal_one_full_station_bit_for_bit() {
    let Some(model) = model(QWEN) else {
        return;
    };
    let Some(bin) = station_bin() else {
        return;
    };

    // Split with the real CLI.
    let dir = tempfile::tempdir().expect("temp dir");
    split(&model, "0..8,8..16,16..24", dir.path());
    let parent = Knot::open(&model).expect("open parent");
    let ranges = [
        LayerRange::new(0, 8),
        LayerRange::new(8, 16),
        LayerRange::new(16, 24),
    ];
    let shards: Vec<PathBuf> = ranges
        .iter()
        .map(|r| {
            dir.path().join(format!(
                "qwen2.5-coder-0.5b-instruct-q4_k_m.L{:02}-{:02}.knot",
                r.start, r.end
            ))
        })
        .collect();
    for (p, (r, role)) in shards
        .iter()
        .zip(ranges.iter().zip([Role::Entry, Role::Mid, Role::Exit]))
    {
        let k = Knot::open(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        k.verify(&mut |_| {})
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let s = k.shard().expect("shard record");
        assert_eq!(
            (s.role, s.layers, s.parent_hash.as_str()),
            (role, *r, parent.model_hash())
        );
    }

    // Network namespaces when root (and `ip` works), loopback otherwise.
    let mut net = NetGuard::default();
    let is_root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let mut taken = Vec::new();
    let use_netns = is_root
        && (0..3)
            .map(|i| net.add(i, &mut taken))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| eprintln!("network namespaces unavailable ({e}); using loopback"))
            .is_ok();
    if !use_netns {
        drop(std::mem::take(&mut net));
    }
    eprintln!(
        "stations in {}",
        if use_netns {
            "three network namespaces"
        } else {
            "loopback ports"
        }
    );

    let full = start(&bin, &model, None);
    let stations: Vec<Station> = shards
        .iter()
        .enumerate()
        .map(|(i, p)| start(&bin, p, use_netns.then(|| &net.made[i])))
        .collect();
    let timeout = Duration::from_secs(300);

    // The mid station holds 8-16 only: /embed and other ranges are refused, naming its range.
    let mid = StationClient::new(&stations[1].url, timeout);
    match mid.embed(&PARIS) {
        Err(ClientError::Refused(fat_station::wire::Refusal {
            status: 404,
            code,
            message,
            ..
        })) => {
            assert_eq!(code, "not_held");
            assert!(
                message.contains("8") && message.contains("16"),
                "the refusal names the range: {message}"
            );
        }
        other => panic!("a mid station must refuse /embed with 404 not_held, got {other:?}"),
    }
    assert!(matches!(
        mid.forward(&vec![0.0; 896], LayerRange::new(0, 8), None, false),
        Err(ClientError::Refused(fat_station::wire::Refusal {
            status: 404,
            ..
        }))
    ));
    assert!(matches!(
        mid.lm_head(&vec![0.0; 896]),
        Err(ClientError::Refused(fat_station::wire::Refusal {
            status: 404,
            ..
        }))
    ));

    // The same prefill + decode through the chain and through the full station.
    let mesh = MeshFile {
        stations: stations
            .iter()
            .zip(&ranges)
            .map(|(s, r)| MeshHop {
                url: s.url.clone(),
                layers: format!("{}-{}", r.start, r.end),
                ..MeshHop::default()
            })
            .collect(),
        ..MeshFile::default()
    };
    let chain = Chain::from_mesh(&mesh, timeout).expect("chain");
    let (c_pre, c_dec, trace) = run_chain(&chain, "chain-1");
    let single = Chain::single(&full.url, timeout).expect("single full station");
    let (f_pre, f_dec, _) = run_chain(&single, "full-1");

    for (url, r, bytes, ms) in &trace.hops {
        eprintln!("hop {url} layers {r}: {bytes} B, {ms:.1} ms");
    }
    eprintln!(
        "chain argmax {} logit {:.3}",
        argmax(&c_pre),
        c_pre[argmax(&c_pre)]
    );
    assert_eq!(
        argmax(&f_pre),
        PARIS_ID,
        "the full station must answer \" Paris\""
    );
    assert_eq!(
        argmax(&c_pre),
        PARIS_ID,
        "the three-shard chain must answer \" Paris\""
    );
    assert!(
        bits(&c_pre) == bits(&f_pre),
        "prefill logits of the chain differ from the full station's"
    );
    assert!(
        bits(&c_dec) == bits(&f_dec),
        "decode logits of the chain differ from the full station's"
    );

    // Resident memory after serving: the mid station maps only its 8 blocks.
    let (rss_full, rss_entry, rss_mid, rss_exit) = (
        full.rss_kib(),
        stations[0].rss_kib(),
        stations[1].rss_kib(),
        stations[2].rss_kib(),
    );
    let mb = |k: u64| k as f64 / 1024.0;
    eprintln!(
        "VmRSS after serving: full {:.1} MiB, entry 0-8 {:.1} MiB, mid 8-16 {:.1} MiB, exit 16-24 {:.1} MiB",
        mb(rss_full),
        mb(rss_entry),
        mb(rss_mid),
        mb(rss_exit)
    );
    assert!(
        rss_mid * 3 < rss_full,
        "mid station RSS {rss_mid} KiB is not well under the full station's {rss_full} KiB"
    );
    assert!(
        rss_exit < rss_full && rss_entry < rss_full,
        "every shard station must be smaller than the full one"
    );

    // The hand-driven Python wire driver agrees (skipped without python3).
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/three-node-forward.py");
    let hops: Vec<String> = mesh
        .stations
        .iter()
        .map(|h| format!("{}={}", h.url, h.layers))
        .collect();
    match Command::new("python3").arg(&script).args(&hops).output() {
        Ok(o) => {
            let out = String::from_utf8_lossy(&o.stdout);
            eprint!("{out}");
            assert!(
                o.status.success(),
                "{}: {out}{}",
                script.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            assert!(
                out.contains("argmax 12095") && out.contains("PASS"),
                "{out}"
            );
        }
        Err(e) => eprintln!("skipping the Python driver: python3: {e}"),
    }
}

/// Issue 19: gemma3 over a real HTTP chain. Three shard stations cut around its global layers
/// (5, 11 and 17 attend to everything; the rest slide a 512-token window), driven through
/// `/forward` with sessions: the prefill, then eight greedy decode steps, give the full
/// station's logits bit for bit at every step, and " Paris" is among the prefill's top five
/// (the 270M model's own standing, as specs/gemma-facts.json's `paris_top5` asks).
#[test]
fn gemma3_three_shard_stations_equal_one_full_station_for_a_greedy_run() {
    let Some(model) = model(GEMMA) else {
        return;
    };
    let Some(bin) = station_bin() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    split(&model, "0..5,5..12,12..18", dir.path());
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .expect("shard dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "knot"))
        .collect();
    shards.sort();
    assert_eq!(shards.len(), 3, "{shards:?}");

    let full = start(&bin, &model, None);
    let stations: Vec<Station> = shards.iter().map(|p| start(&bin, p, None)).collect();
    let timeout = Duration::from_secs(300);
    let mesh = MeshFile {
        stations: stations
            .iter()
            .zip(["0-5", "5-12", "12-18"])
            .map(|(s, layers)| MeshHop {
                url: s.url.clone(),
                layers: layers.to_string(),
                ..MeshHop::default()
            })
            .collect(),
        ..MeshFile::default()
    };
    let chain = Chain::from_mesh(&mesh, timeout).expect("chain");
    let single = Chain::single(&full.url, timeout).expect("single full station");

    // Gemma asks for bos: the entry station's tokenizer adds it.
    let prompt = chain
        .entry()
        .tokenize("The capital of France is", None)
        .expect("tokenize at the entry");
    assert_eq!(
        single
            .entry()
            .tokenize("The capital of France is", None)
            .expect("tokenize"),
        prompt
    );
    let paris = chain
        .entry()
        .tokenize(" Paris", Some(false))
        .expect("tokenize");
    assert_eq!(paris.len(), 1, "\" Paris\" is one token: {paris:?}");
    let (mut pos, mut next) = (0usize, prompt.clone());
    let mut greedy = Vec::new();
    for step in 0..9 {
        let mut trace = StepTrace::default();
        let c = chain
            .step(&next, Some(("gemma-chain", pos)), &mut trace)
            .expect("step through the chain");
        let f = single
            .step(&next, Some(("gemma-full", pos)), &mut StepTrace::default())
            .expect("step through the full station");
        assert_eq!(trace.hops.len(), 3, "three hops");
        assert!(
            bits(&c) == bits(&f),
            "step {step}: the chain's logits differ from the full station's"
        );
        if step == 0 {
            let mut top: Vec<usize> = (0..c.len()).collect();
            top.sort_by(|&a, &b| c[b].total_cmp(&c[a]));
            assert!(
                top[..5].contains(&(paris[0] as usize)),
                "\" Paris\" not in the top five: {:?}",
                &top[..5]
            );
        }
        pos += next.len();
        let id = argmax(&c) as u32;
        greedy.push(id);
        next = vec![id];
    }
    let text = chain.entry().detokenize(&greedy).expect("detokenize");
    eprintln!("gemma3 chain greedy: {text:?}");
    assert!(!text.trim().is_empty(), "{greedy:?}");
}

/// Issue 35: a hybrid (LFM2: short convolutions on layers 0, 1, 3, attention on 2 and 4; the
/// synthetic `lfm2-tiny`) split so that a convolution node hands on to an attention node and
/// back (0..2 | 2..3 | 3..5): the prefill, eight greedy decode steps and a rollback of two
/// positions with another token give the full station's logits bit for bit. Each node keeps
/// the recurrent state of its own layers.
#[test]
fn lfm2_split_between_convolution_and_attention_equals_one_station() {
    split_equals_one_station("lfm2-tiny", "0..2,2..3,3..5", &["0-2", "2-3", "3-5"]);
}

/// The same for Mamba (every layer a scan: each node keeps its layers' conv window and scan
/// state) split at every layer, and for Granite 4.0-H's layout (`granitehybrid-tiny`: Mamba-2
/// on 0 and 2, attention on 1 and 3) split at every layer, a recurrent node handing on to an
/// attention node and back.
#[test]
fn mamba_and_granitehybrid_split_at_every_layer_equal_one_station() {
    split_equals_one_station("mamba-tiny", "0..1,1..2,2..3", &["0-1", "1-2", "2-3"]);
    split_equals_one_station(
        "granitehybrid-tiny",
        "0..1,1..2,2..3,3..4",
        &["0-1", "1-2", "2-3", "3-4"],
    );
}

/// `preset` split into `ranges` (stations serving `layers`) == one full station, bit for bit:
/// prefill, eight greedy steps, a rollback of two positions with another token.
fn split_equals_one_station(preset: &str, ranges: &str, layers: &[&str]) {
    let Some(bin) = station_bin() else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let Some((_, model)) = test_support::synthetic_model(dir.path(), preset, &[]) else {
        return;
    };
    let out = dir.path().join("shards");
    split(&model, ranges, &out);
    let mut shards: Vec<PathBuf> = std::fs::read_dir(&out)
        .expect("shard dir")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "knot"))
        .collect();
    shards.sort();
    assert_eq!(shards.len(), layers.len(), "{shards:?}");

    let full = start(&bin, &model, None);
    let stations: Vec<Station> = shards.iter().map(|p| start(&bin, p, None)).collect();
    let timeout = Duration::from_secs(120);
    let mesh = MeshFile {
        stations: stations
            .iter()
            .zip(layers)
            .map(|(s, layers)| MeshHop {
                url: s.url.clone(),
                layers: layers.to_string(),
                ..MeshHop::default()
            })
            .collect(),
        ..MeshFile::default()
    };
    let chain = Chain::from_mesh(&mesh, timeout).expect("chain");
    let single = Chain::single(&full.url, timeout).expect("single full station");
    let both = |next: &[u32], pos: usize, what: &str| -> Vec<f32> {
        let mut trace = StepTrace::default();
        let c = chain
            .step(next, Some(("hybrid-chain", pos)), &mut trace)
            .unwrap_or_else(|e| panic!("{preset} {what} through the chain: {e}"));
        let f = single
            .step(next, Some(("hybrid-full", pos)), &mut StepTrace::default())
            .unwrap_or_else(|e| panic!("{preset} {what} through the full station: {e}"));
        assert_eq!(trace.hops.len(), layers.len(), "one hop per shard");
        assert!(
            bits(&c) == bits(&f),
            "{preset} {what}: the chain's logits differ from the full station's"
        );
        c
    };
    let (mut pos, mut next) = (0usize, PARIS.to_vec());
    let mut greedy = Vec::new();
    for step in 0..9 {
        let c = both(&next, pos, &format!("step {step}"));
        pos += next.len();
        let id = argmax(&c) as u32;
        greedy.push(id);
        next = vec![id];
    }
    // Rejected drafts: back two positions, another token (every node restores its state);
    // the same as a fresh session given the whole sequence at once.
    let c = both(&[11], pos - 2, "rollback");
    let mut whole = PARIS.to_vec();
    whole.extend_from_slice(&greedy[..pos - 2 - PARIS.len()]);
    whole.push(11);
    assert_eq!(whole.len(), pos - 1);
    let fresh = single
        .step(&whole, Some(("hybrid-fresh", 0)), &mut StepTrace::default())
        .expect("fresh session");
    assert!(
        bits(&c) == bits(&fresh),
        "{preset}: the rolled-back chain differs from a fresh session"
    );
    eprintln!("{preset} chain greedy: {greedy:?}");
}
