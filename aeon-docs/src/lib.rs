//! Man pages and shell completions for every binary of the workspace, generated from each
//! binary's own clap definition (the `cli` module of its crate), so they never drift from
//! `--help`. `make docs` runs `aeon-docs target/docs`:
//!
//! ```text
//! target/docs/man/NAME.1, NAME-SUBCOMMAND.1   (clap_mangen; `man -l target/docs/man/knot.1`)
//! target/docs/completions/bash/NAME.bash      (clap_complete; `source` it)
//! target/docs/completions/zsh/_NAME           (put the folder on $fpath)
//! target/docs/completions/fish/NAME.fish      (copy to ~/.config/fish/completions/)
//! ```

pub mod cli;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Command, CommandFactory};
use clap_complete::Shell;

/// The shells completions are written for, with the folder each goes in.
pub const SHELLS: &[(Shell, &str)] = &[
    (Shell::Bash, "bash"),
    (Shell::Zsh, "zsh"),
    (Shell::Fish, "fish"),
];

/// Every binary's clap definition, named as it is installed (`knot`, not the crate's name).
/// Aliases of the same programs (`gnosis-foil-control`, `paris-probe-rknot`) and the
/// benchmarks are left out.
pub fn binaries() -> Vec<Command> {
    [
        ("knot", knot_format::cli::Args::command()),
        ("fat-station", fat_station::cli::Args::command()),
        // `moonshine mesh` is parsed apart (its arguments are passed through): its own
        // definition replaces the placeholder, so its page and completions show its commands.
        (
            "moonshine",
            moonshine::cli::Args::command()
                .mut_subcommand("mesh", |_| moonshine::mesh_cmd::command().name("mesh")),
        ),
        ("paris-probe", paris_probe::cli::Args::command()),
        ("monster-guard", monster_guard::cli::Cli::command()),
        ("swerve", swerve::cli::Cli::command()),
        ("shard-knot", shard_knot::cli::Args::command()),
        (
            "parity-station-handoff",
            parity_station_handoff::cli::Args::command(),
        ),
        ("foil-control", foil_control::cli::Args::command()),
    ]
    .into_iter()
    .map(|(name, cmd)| cmd.name(name).bin_name(name))
    .collect()
}

/// Writes every binary's man pages (one per command and subcommand) to `out/man` and its
/// completions to `out/completions/SHELL`; returns the files written.
pub fn generate(out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let man = out.join("man");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    for cmd in binaries() {
        let name = cmd.get_name().to_string();
        files.extend(man_pages(cmd.clone(), &man).with_context(|| format!("man page of {name}"))?);
        for (shell, folder) in SHELLS {
            let dir = out.join("completions").join(folder);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let mut cmd = cmd.clone();
            let path = clap_complete::generate_to(*shell, &mut cmd, &name, &dir)
                .with_context(|| format!("{shell} completion of {name}"))?;
            files.push(path);
        }
    }
    Ok(files)
}

/// `cmd`'s page and, recursively, one per visible subcommand (`monster-guard-run.1`, as
/// git's `git-commit.1`), `help` left out.
fn man_pages(mut cmd: Command, dir: &Path) -> Result<Vec<PathBuf>> {
    // Building fills in the subcommands' display names (`monster-guard-run`) and usage.
    cmd.build();
    let mut files = Vec::new();
    let page = clap_mangen::Man::new(cmd.clone());
    let path = dir.join(page.get_filename());
    let mut text = Vec::new();
    page.render(&mut text)
        .with_context(|| format!("rendering {}", path.display()))?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    files.push(path);
    for sub in cmd.get_subcommands() {
        if sub.is_hide_set() || sub.get_name() == "help" {
            continue;
        }
        files.extend(man_pages(sub.clone(), dir)?);
    }
    Ok(files)
}
