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
    // `moonshine mesh` is parsed apart; its page and completions show its own commands.
    let mesh = read(&d.join("man/moonshine-mesh.1"));
    assert!(mesh.contains("discover"), "{mesh}");
    assert!(d.join("man/moonshine-mesh-form.1").exists());
    let bash = read(&d.join("completions/bash/moonshine.bash"));
    assert!(
        bash.contains("--manifests"),
        "moonshine.bash lacks mesh form's flags"
    );
}

/// Runs aeon-docs with `args` in `cwd`.
fn aeon_docs(cwd: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_aeon-docs"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run aeon-docs")
}

/// The entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Issue 39: `aeon-docs --help` wrote 56 files into a folder named `--help`. A flag is a
/// flag: --help and --version print and write nothing, an unknown flag is refused (exit 2).
#[test]
fn flags_are_never_taken_for_the_output_folder() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let o = aeon_docs(cwd.path(), &["--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{o:?}");
    assert!(out.contains("Usage: aeon-docs [OUT_DIR]"), "{out}");
    assert!(out.contains("[default: target/docs]"), "{out}");
    let o = aeon_docs(cwd.path(), &["--version"]);
    assert!(o.status.success(), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("aeon-docs "));
    for bad in [&["--bogus"][..], &["-x"], &["a", "b"]] {
        let o = aeon_docs(cwd.path(), bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("error:") && err.contains("Usage:"),
            "{bad:?}: {err}"
        );
    }
    assert_eq!(
        entries(cwd.path()),
        Vec::<String>::new(),
        "a flag wrote files"
    );
}

/// Without an argument the pages go to target/docs (what `make docs` passes explicitly).
#[test]
fn the_default_folder_is_target_docs() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let o = aeon_docs(cwd.path(), &[]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(entries(cwd.path()), ["target"]);
    assert!(cwd.path().join("target/docs/man/knot.1").exists());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("files in target/docs"), "{out}");
}
