//! `aeon-docs OUT` writes every binary's man page and shell completions, each mentioning the
//! binary's own flags (so a binary whose clap definition were not wired in would show).

use std::path::Path;
use std::process::Command;

/// Each binary, a word its man page shows (a flag, or a subcommand for a binary that has
/// them) and a flag its bash completion offers.
const BINARIES: &[(&str, &str, &str)] = &[
    ("knot", "import", "--output"),
    ("fat-station", "--knot", "--knot"),
    ("moonshine", "--station", "--station"),
    ("paris-probe", "--dense", "--dense"),
    ("monster-guard", "delegate", "--force"),
    ("swerve", "cline", "--rootfs"),
    ("shard-knot", "split", "--nodes"),
    ("parity-station-handoff", "--all-splits", "--all-splits"),
    ("foil-control", "--data-dir", "--data-dir"),
];

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn every_binary_gets_a_man_page_and_completions_that_know_its_flags() {
    let out = tempfile::tempdir().expect("tempdir");
    let o = Command::new(env!("CARGO_BIN_EXE_aeon-docs"))
        .arg(out.path())
        .output()
        .expect("run aeon-docs");
    assert!(
        o.status.success(),
        "aeon-docs failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let d = out.path();
    for (bin, in_man, in_bash) in BINARIES {
        let man = read(&d.join(format!("man/{bin}.1")));
        // roff writes a literal hyphen as `\-`.
        let roff = in_man.replace('-', "\\-");
        assert!(
            man.contains(&roff),
            "{bin}.1 does not mention {in_man}:\n{man}"
        );
        assert!(man.starts_with(".ie \\n(.g .ds Aq"), "{bin}.1 is not roff");
        assert!(man.contains(&format!(".TH {bin} 1")), "{bin}.1 title");
        let bash = read(&d.join(format!("completions/bash/{bin}.bash")));
        assert!(bash.contains(in_bash), "{bin}.bash lacks {in_bash}");
        assert!(
            bash.contains("complete -F"),
            "{bin}.bash registers no completion"
        );
        let zsh = read(&d.join(format!("completions/zsh/_{bin}")));
        assert!(zsh.starts_with(&format!("#compdef {bin}")), "_{bin}");
        let fish = read(&d.join(format!("completions/fish/{bin}.fish")));
        assert!(fish.contains(&format!("complete -c {bin}")), "{bin}.fish");
    }
    // A subcommand has its own page (as git-commit.1), with its own flags.
    let import = read(&d.join("man/knot-import.1"));
    assert!(import.contains("\\-\\-output"), "{import}");
    assert!(d.join("man/monster-guard-run.1").exists());
    assert!(!d.join("man/knot-help.1").exists());
}
