//! Every binary's `--help` prints its examples as written, one command per line: clap reflows
//! a doc comment into one paragraph unless the command is `verbatim_doc_comment` or the
//! examples are an `after_help`, and `shard-knot --help` once printed its four examples as one
//! line. Checked on the clap definitions (always) and on the built binaries (when present).

use std::process::Command;

use clap::CommandFactory;

/// (binary, subcommand path, example lines its `--help` shows, each on a line of its own).
const EXAMPLES: &[(&str, &[&str], &[&str])] = &[
    (
        "knot",
        &[],
        &[
            "knot import MODEL.gguf -o MODEL.knot",
            "knot verify MODEL.knot",
            "knot inspect MODEL.knot",
        ],
    ),
    (
        "moonshine",
        &[],
        &[
            "moonshine --oneoff -c \"The capital of France is\" --mesh specs/mesh-3.json",
            "moonshine --oneoff --tokens 785,6722,315,9625,374 --station http://127.0.0.1:8080",
            "moonshine serve --listen 127.0.0.1:8000 --mesh specs/mesh-3.json",
        ],
    ),
    (
        "moonshine",
        &["mesh"],
        &[
            "moonshine mesh discover --timeout 2",
            "moonshine mesh form -o mesh.json          (then: moonshine --mesh mesh.json -c ...)",
            "moonshine mesh form --assign -o mesh.json --manifests nodes/ --shard model.knot",
            "moonshine mesh generate --discover -c \"The capital of France is\" -n 16",
        ],
    ),
    (
        "paris-probe",
        &[],
        &[
            "paris-probe --dense qwen.knot --tokens 785,6722,315,9625,374 --expected 12095",
            "paris-probe --dense qwen.knot --prompt \"The capital of France is\" --expect \" Paris\"",
        ],
    ),
    (
        "monster-guard",
        &["delegate"],
        &["monster-guard delegate qwen net,fs --ttl 1h --qspec specs/qwen-facts.json"],
    ),
    (
        "monster-guard",
        &["run"],
        &["monster-guard run --name qwen --caps fs --lease 10m -- fat-station --knot qwen.knot"],
    ),
    (
        "swerve",
        &[],
        &[
            "swerve admit base:scratch --rootfs /srv/slivers/scratch",
            "swerve cline base:scratch -- sh -c 'hostname; ls /'",
        ],
    ),
    (
        "shard-knot",
        &[],
        &[
            "shard-knot split M.knot --nodes 3 -o shards/",
            "shard-knot split M.knot --ranges 0..8,8..16,16..24 -o shards/",
            "shard-knot inspect shards/M.L08-16.knot",
            "fat-station --knot shards/M.L08-16.knot      (serves /forward for layers 8-16 only)",
        ],
    ),
    (
        "shard-knot",
        &["plan"],
        &[
            "shard-knot plan M.knot --node-ram 2.4G -o mesh/",
            "shard-knot plan M.knot --node-free 2.95G --kv-tokens 2048",
            "shard-knot plan M.knot --node phone=2.4G --node pi=1.6G",
            "shard-knot plan --model-bytes 7G --layers 32 --node-ram 2.4G",
        ],
    ),
    (
        "parity-station-handoff",
        &[],
        &[
            "TEST 1: 4 tokens in one pass: final residual rows and logits.",
            "parity-station-handoff qwen.knot --split 12",
            "parity-station-handoff qwen.knot --all-splits --step 4",
        ],
    ),
    (
        "foil-control",
        &[],
        &[
            "foil-control --port 8886 --data-dir /tmp/foil &",
            "curl -s 'http://127.0.0.1:8886/.aeon/model-forward-cache?key=m:dense:1,2'",
        ],
    ),
    ("aeon-docs", &[], &["aeon-docs /tmp/docs"]),
];

/// The binaries' names, for the check that no line runs two commands together.
const NAMES: &[&str] = &[
    "knot",
    "fat-station",
    "moonshine",
    "paris-probe",
    "monster-guard",
    "swerve",
    "shard-knot",
    "parity-station-handoff",
    "foil-control",
    "aeon-docs",
];

/// Every binary's clap definition, aeon-docs' own included.
fn commands() -> Vec<clap::Command> {
    let mut all = aeon_docs::binaries();
    all.push(aeon_docs::cli::Args::command().bin_name("aeon-docs"));
    all
}

/// `help` (what `bin path.. --help` prints) shows each of `examples` as a line of its own.
fn assert_examples(what: &str, help: &str, examples: &[&str]) {
    for ex in examples {
        assert!(
            help.lines().any(|l| l.trim() == *ex),
            "{what} --help does not show `{ex}` on a line of its own:\n{help}"
        );
    }
}

/// A line of `help` that starts two commands of the same binary (the text before any
/// parenthesis, where a comment may name another command), as reflowing does.
fn run_together(help: &str) -> Option<&str> {
    help.lines().find(|l| {
        let code = l.split('(').next().unwrap_or(l);
        let words: Vec<&str> = code.split_whitespace().collect();
        NAMES
            .iter()
            .any(|n| words.iter().filter(|w| *w == n).count() >= 2)
    })
}

/// Every command and subcommand under `cmd` (help left out), with its path.
fn walk(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, clap::Command)>) {
    out.push((path.clone(), cmd.clone()));
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut p = path.clone();
        p.push(sub.get_name().to_string());
        walk(sub, p, out);
    }
}

#[test]
fn every_help_prints_its_examples_one_command_per_line() {
    let mut all = Vec::new();
    for mut cmd in commands() {
        cmd.build();
        let name = cmd.get_name().to_string();
        walk(&cmd, vec![name], &mut all);
    }
    for (bin, path, examples) in EXAMPLES {
        let want: Vec<String> = std::iter::once(bin.to_string())
            .chain(path.iter().map(|s| s.to_string()))
            .collect();
        let (_, cmd) = all
            .iter()
            .find(|(p, _)| *p == want)
            .unwrap_or_else(|| panic!("no command {want:?}"));
        let help = cmd.clone().render_long_help().to_string();
        assert_examples(&want.join(" "), &help, examples);
    }
    for (path, cmd) in &all {
        let help = cmd.clone().render_long_help().to_string();
        if let Some(line) = run_together(&help) {
            panic!(
                "{} --help runs two commands into one line: {line}",
                path.join(" ")
            );
        }
    }
}

#[test]
fn the_built_binaries_print_the_same_examples() {
    for (bin, path, examples) in EXAMPLES {
        let exe = if *bin == "aeon-docs" {
            std::path::PathBuf::from(env!("CARGO_BIN_EXE_aeon-docs"))
        } else {
            let env = format!("{}_BIN", bin.to_uppercase().replace('-', "_"));
            let Some(exe) = test_support::need(
                test_support::release_bin(bin, &env),
                "cargo build --release --workspace --bins",
            ) else {
                continue;
            };
            exe
        };
        let o = Command::new(&exe)
            .args(*path)
            .arg("--help")
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", exe.display()));
        let help = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{bin} {path:?} --help: {o:?}");
        let what = format!("{bin} {}", path.join(" "));
        assert_examples(&what, &help, examples);
        assert_eq!(run_together(&help), None, "{what} --help");
    }
}
