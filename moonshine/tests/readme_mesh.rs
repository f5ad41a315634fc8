//! The README's "A 3-station mesh" block, run as written on the files `shard-knot split`
//! makes: only the ports (free ones instead of 8081-8083), the shard folder and the mesh file
//! (the same file with those ports) are substituted. Each shard station reports the parent
//! model's hash, so the client sees one model along the chain.

mod support;

use std::path::Path;
use std::process::Command;

/// The first ```sh block after `heading` in `readme`.
fn sh_block_after(readme: &str, heading: &str) -> String {
    let after = &readme[readme.find(heading).expect("README heading")..];
    let start = after.find("```sh\n").expect("sh block") + "```sh\n".len();
    let len = after[start..].find("```").expect("block end");
    after[start..start + len].to_string()
}

#[test]
fn the_readme_mesh_runs_on_shard_files() {
    let Some((knot, _)) = support::setup() else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let mut block = sh_block_after(&readme, "## A 3-station mesh");
    let dir = tempfile::tempdir().expect("tempdir");
    let shards = dir.path().join("shards");
    let mut mesh = std::fs::read_to_string(root.join("specs/mesh-3.json")).expect("mesh-3.json");
    for old in ["8081", "8082", "8083"] {
        let new = test_support::free_port().to_string();
        block = block.replace(old, &new);
        mesh = mesh.replace(old, &new);
    }
    let mesh_path = dir.path().join("mesh-3.json");
    std::fs::write(&mesh_path, mesh).expect("write mesh");
    let models = knot.parent().expect("models dir").to_str().expect("utf-8");
    block = block
        .replace("~/.cache/aeon-shell/models", models)
        .replace("/tmp/shards", shards.to_str().expect("utf-8"))
        .replace("specs/mesh-3.json", mesh_path.to_str().expect("utf-8"));
    // The stations run in the background: stop them whatever happens.
    let script = format!("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null' EXIT\n{block}");
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(&root)
        .output()
        .expect("bash");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success(),
        "the README block failed ({}):\n{script}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("The capital of France is -> Paris"),
        "moonshine over the shards:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains("PASS"),
        "three-node-forward.py over the shards:\n{stdout}\n{stderr}"
    );
}
