//! The ephemeral elector assigning ranges (issue 10): three full-model stations announce RAM
//! budgets of 1, 2 and 1 GB by beacon; `moonshine mesh form --assign` gives them layers 0-6,
//! 6-18 and 18-24, writes the chains file and one manifest per node, and exits. The formed mesh
//! then generates the same 16 greedy tokens as one station, both with the stations as they are
//! (the per-hop client sends each hop its assigned X-Layer-Range) and with the stations
//! restarted from the elector's manifests (POST /chain: each station holds only its range and
//! forwards to the next). A /chain generation over the unrestarted full-model stations is
//! refused: the entry would run every layer itself, so its tokens would prove nothing of the
//! split.

mod support;

use std::process::Command;

use support::*;

const PROMPT: &str = "785,6722,315,9625,374";

/// Greedy token ids from `moonshine --json ARGS --tokens PROMPT -n 16`.
fn greedy_json(target: &[&str]) -> Vec<u64> {
    let mut a = target.to_vec();
    a.extend_from_slice(&["--json", "--tokens", PROMPT, "-n", "16"]);
    let (out, err) = moonshine_ok(&a, None);
    let v: serde_json::Value =
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    v["tokens"]
        .as_array()
        .unwrap_or_else(|| panic!("no tokens in {v}"))
        .iter()
        .map(|t| t.as_u64().expect("token id"))
        .collect()
}

fn ids(s: &str) -> Vec<u64> {
    s.trim()
        .split(',')
        .map(|t| t.parse().unwrap_or_else(|_| panic!("not ids: {s:?}")))
        .collect()
}

fn layers_of(url: &str) -> String {
    let body = ureq::get(&format!("{url}/health"))
        .call()
        .expect("health")
        .into_string()
        .expect("health body");
    let h: serde_json::Value = serde_json::from_str(&body).expect("health json");
    h["layers"].as_str().expect("layers").to_string()
}

#[test]
fn elector_assigns_ranges_by_ram_and_the_formed_mesh_matches_one_station() {
    let Some((knot, bin)) = setup() else { return };
    let knot_s = knot.to_str().expect("utf-8 path");

    // Reference: one full station.
    let want = {
        let one = station(&bin, &knot, &["--threads", "1"]);
        greedy_json(&["--station", &one.url])
    };
    assert_eq!(want.len(), 16, "16 tokens without an early stop: {want:?}");
    assert_eq!(want[0], 12095, "the reference starts with \" Paris\"");

    // Three full-model stations announcing their budgets on a per-test UDP port.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("udp port")
        .port();
    let beacon_to = format!("127.0.0.1:{port}");
    // n1 announces 2G by `--ram`, which must win over its environment's 1G; n0 and n2 by
    // the environment alone.
    let budgets = [
        ("n0", "1GB", None),
        ("n1", "1GB", Some("2GB")),
        ("n2", "1GB", None),
    ];
    let mut nodes: Vec<Proc> = budgets
        .iter()
        .map(|(id, env_ram, flag_ram)| {
            let mut args = vec![
                "--knot",
                knot_s,
                "--listen",
                "127.0.0.1:0",
                "--node-id",
                id,
                "--beacon",
                &beacon_to,
                "--beacon-interval-ms",
                "100",
                "--threads",
                "1",
            ];
            if let Some(r) = flag_ram {
                args.extend(["--ram", r]);
            }
            spawn_with_env(&bin, &args, &[("AEON_NODE_RAM", env_ram)])
        })
        .collect();
    for n in &nodes {
        assert_eq!(
            layers_of(&n.url),
            "0-24",
            "each station holds the whole model"
        );
    }

    // The elector: hears them, assigns by RAM, writes the mesh and the manifests, exits.
    let dir = tempfile::tempdir().expect("tempdir");
    let mesh = dir.path().join("mesh.json");
    let mdir = dir.path().join("nodes");
    let (mesh_s, mdir_s) = (mesh.to_str().expect("utf-8"), mdir.to_str().expect("utf-8"));
    let (out, err) = moonshine_ok(
        &[
            "mesh",
            "form",
            "--assign",
            "--listen",
            &beacon_to,
            "--timeout",
            "1.5",
            "-o",
            mesh_s,
            "--manifests",
            mdir_s,
            "--shard",
            knot_s,
        ],
        None,
    );
    assert!(
        out.contains("chain 0: n0[0-6, 1.00 GB] -> n1[6-18, 2.00 GB] -> n2[18-24, 1.00 GB]"),
        "ranges proportional to the announced RAM:\n{out}\n{err}"
    );
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&mesh).expect("mesh file")).expect("json");
    let chains = f["chains"].as_array().expect("chains");
    assert_eq!(chains.len(), 1, "{f}");
    let hops: Vec<(String, String)> = chains[0]
        .as_array()
        .expect("hops")
        .iter()
        .map(|h| {
            (
                h["url"].as_str().expect("url").to_string(),
                h["layers"].as_str().expect("layers").to_string(),
            )
        })
        .collect();
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    assert_eq!(
        hops,
        vec![
            (urls[0].clone(), "0-6".to_string()),
            (urls[1].clone(), "6-18".to_string()),
            (urls[2].clone(), "18-24".to_string()),
        ]
    );

    // 1) The stations as they are: the per-hop client runs each hop's assigned range.
    let got = greedy_json(&["--mesh", mesh_s]);
    assert_eq!(got, want, "assigned mesh (per hop) equals one station");

    // POST /chain needs stations that serve only their range: refused, not silently run.
    let o = moonshine(
        &[
            "mesh", "generate", "--mesh", mesh_s, "--tokens", PROMPT, "-n", "16",
        ],
        None,
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "full stations cannot pass as the split"
    );
    // Refused by the entry (it holds the head yet the route goes on) or, by a station that
    // lets it through, by the client comparing the trace with the assigned ranges.
    assert!(
        err.contains("route_past_exit")
            || err.contains("the chain ran 0-24 but the mesh assigns 0-6, 6-18, 18-24"),
        "{err}"
    );

    // 2) Restarted from the elector's manifests: each holds its range and forwards.
    nodes.clear();
    let nodes: Vec<Proc> = ["n0", "n1", "n2"]
        .iter()
        .map(|id| {
            let m = mdir.join(format!("{id}.json"));
            spawn_with_env(
                &bin,
                &["--manifest", m.to_str().expect("utf-8"), "--threads", "1"],
                &[],
            )
        })
        .collect();
    let served: Vec<String> = nodes.iter().map(|n| layers_of(&n.url)).collect();
    assert_eq!(served, vec!["0-6", "6-18", "18-24"]);
    let (out, err) = moonshine_ok(
        &[
            "mesh", "generate", "--mesh", mesh_s, "--tokens", PROMPT, "-n", "16",
        ],
        None,
    );
    assert_eq!(
        ids(&out),
        want,
        "assigned mesh (stations forwarding) equals one station\n{err}"
    );
}

/// `scripts/mesh-shootout.py --launch` starts its own six 1-thread stations, runs the three
/// configurations and reports each with every token counted; throughput itself is not
/// asserted (the machine is shared), only that the table is complete and consistent.
#[test]
fn shootout_launch_measures_chain_and_replicas() {
    let Some((knot, bin)) = setup() else { return };
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/mesh-shootout.py");
    let o = match Command::new("python3")
        .arg(&script)
        .args(["--launch", knot.to_str().expect("utf-8"), "--station-bin"])
        .arg(&bin)
        .args(["--repeat", "1", "--tokens", "4", "--json"])
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipping: python3: {e}");
            return;
        }
    };
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "shootout failed:\n{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(out.trim()).expect("json report");
    assert_eq!(r["threads_per_station"], 1);
    let rows = r["rows"].as_array().expect("rows");
    let got: Vec<(String, u64, u64, u64)> = rows
        .iter()
        .map(|x| {
            (
                x["config"].as_str().expect("config").to_string(),
                x["stations"].as_u64().expect("stations"),
                x["clients"].as_u64().expect("clients"),
                x["tokens"].as_u64().expect("tokens"),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("1 chain x 1 client".to_string(), 3, 1, 4),
            ("1 chain x 2 clients".to_string(), 3, 2, 8),
            ("2 replicas x 2 clients".to_string(), 6, 2, 8),
        ]
    );
    for x in rows {
        assert!(x["tokens_per_s"].as_f64().expect("tok/s") > 0.0, "{x}");
        assert!(x["p50_ms"].as_f64().expect("p50") <= x["p95_ms"].as_f64().expect("p95"));
    }
    let ratio = r["ratio_replicas_vs_chain_2_clients"]
        .as_f64()
        .expect("ratio");
    let by = |c: &str| {
        rows.iter()
            .find(|x| x["config"] == c)
            .and_then(|x| x["tokens_per_s"].as_f64())
            .expect("row")
    };
    let want = by("2 replicas x 2 clients") / by("1 chain x 2 clients");
    assert!((ratio - want).abs() < 0.01, "{ratio} vs {want}");
}
