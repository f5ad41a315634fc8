//! The `monster-guard` command line: its commands and flags ([`Cli`], also what the man page
//! and shell completions are generated from) and [`run`], which calls [`crate::commands`].
//! See the library docs (`monster-guard/src/lib.rs`) for the exit statuses.

use std::path::PathBuf;

use crate::commands::{self, DelegateArgs, RunArgs, VerifyArgs};
use crate::fsutil::Home;
use crate::grant::Caps;
use crate::lease::parse_duration;
use anyhow::Context;
use clap::{Parser, Subcommand};

/// Quality-gated admission, signed capability grants, leases and revocation.
///
/// A model earns a grant only by passing its quality spec (`delegate`); commands then run
/// under a grant's capabilities for a bounded lease (`run`). State lives in
/// $MONSTER_GUARD_HOME (default ~/.monster-guard).
///
/// Capabilities: `net` = network access (absent: a new, empty network namespace, else IP
/// sockets denied); `fs` = writable filesystem (absent: a private mount namespace with the root
/// mount read-only). A grant's caps are a ceiling: the leased command keeps at most the Linux
/// capabilities they map to (specs/caps.md), under no_new_privs, and its whole process tree
/// ends with the lease.
///
/// Exit status: 0 ok (`run`: the command's status, 128+N for signal N), 2 error, 3 refused
/// (quality failed; grant invalid, expired, revoked, caps not covered, model changed),
/// 124 lease expired, 125 grant revoked during the lease, 130 interrupted.
#[derive(Parser, Debug)]
#[command(name = "monster-guard", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Create this node's ed25519 identity (node.key, mode 0600).
    Init {
        /// Replace an existing identity (every grant it signed stops verifying).
        #[arg(long)]
        force: bool,
    },
    /// Run a quality spec; only if every probe passes, mint a signed grant NAME with CAPS.
    ///
    /// The first delegation of a fresh home creates the node key (as `init` would) and says so
    /// on stderr.
    #[command(after_help = "Example:\n  \
        monster-guard delegate qwen net,fs --ttl 1h --qspec specs/qwen-facts.json")]
    Delegate {
        /// Grant name (1-64 of A-Z a-z 0-9 . _ -).
        name: String,
        /// Comma-separated capabilities: net, fs (or `none`).
        caps: String,
        /// Grant lifetime: seconds, or with s, m, h, d (e.g. 3600, 1h). Default: 1h.
        #[arg(long, default_value = "1h")]
        ttl: String,
        /// The quality spec (JSON, see specs/qspec.md).
        #[arg(long)]
        qspec: PathBuf,
        /// Probe this model file instead of the spec's `knot`.
        #[arg(long)]
        knot: Option<PathBuf>,
        /// The probe program, trusted as given (default: $PARIS_PROBE, else the qspec's `probe`
        /// name, default `paris-probe`, found in $MONSTER_GUARD_HOME/probes/ or beside
        /// monster-guard; a qspec never supplies a program of its own).
        #[arg(long)]
        probe: Option<PathBuf>,
    },
    /// Run CMD under a grant for a bounded lease, with only the requested capabilities.
    #[command(after_help = "Example:\n  \
        monster-guard run --name qwen --caps fs --lease 10m -- fat-station --knot qwen.knot")]
    Run {
        /// Stored grant name.
        #[arg(long, required_unless_present = "grant")]
        name: Option<String>,
        /// A grant file instead (e.g. from `attenuate`).
        #[arg(long)]
        grant: Option<PathBuf>,
        /// Capabilities for this run, a subset of the grant's (default: none).
        #[arg(long, default_value = "")]
        caps: String,
        /// Lease: the command is stopped after this long (seconds, or with s, m, h, d).
        #[arg(long)]
        lease: String,
        /// Seconds between SIGTERM and SIGKILL when the lease ends.
        #[arg(long, default_value = "2")]
        grace: String,
        /// How the command's whole process tree is contained: `auto` (a PID namespace whose
        /// pid 1 is monster-guard's reaper; where none can be made, e.g. inside a sliver
        /// without CAP_SYS_ADMIN or user namespaces, a subreaper, said on stderr), `pidns`
        /// (a PID namespace or refuse), `subreaper`.
        #[arg(long, default_value = "auto")]
        contain: String,
        /// Run even where seccomp filters cannot be installed (a kernel without
        /// CONFIG_SECCOMP_FILTER, or an emulator such as qemu-user): the command then runs
        /// without the syscall filter that denies namespaces, mounts, bpf and keyrings.
        /// Without this flag such a run is refused.
        #[arg(long)]
        allow_no_seccomp: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// Revoke the stored grant NAME (and every grant attenuated from it).
    Revoke {
        /// Grant name.
        name: String,
    },
    /// List stored grants: name, caps, expiry, status.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Verify a grant file offline: signatures, expiry, revocation list.
    Verify {
        /// The grant file.
        grant: PathBuf,
        /// Issuer public key file (default: this node's node.pub).
        #[arg(long)]
        pubkey: Option<PathBuf>,
        /// Signed revocation list (default: this node's revoked.json, if present).
        #[arg(long)]
        revocations: Option<PathBuf>,
        /// Also re-hash the model file and compare with the admitted hash.
        #[arg(long)]
        check_model: bool,
    },
    /// Derive a narrower child grant: fewer caps and/or an earlier expiry, never wider.
    Attenuate {
        /// The parent grant file.
        grant: PathBuf,
        /// Capabilities of the child, a subset of the parent's (default: the same).
        #[arg(long)]
        caps: Option<String>,
        /// Lifetime of the child from now; must end no later than the parent.
        #[arg(long)]
        ttl: Option<String>,
        /// Write the child here (mode 0600) instead of stdout.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Public key operations.
    Pubkey {
        #[command(subcommand)]
        cmd: PubkeyCmd,
    },
}

#[derive(Subcommand, Debug)]
enum PubkeyCmd {
    /// Print this node's public key (hex), or write it to --out.
    Export {
        /// Write the key to this file.
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
}

pub fn run(cli: Cli) -> anyhow::Result<u8> {
    let home = Home::from_env()?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli.cmd {
        Cmd::Init { force } => commands::init(&home, force, &mut out).context("init")?,
        Cmd::Delegate {
            name,
            caps,
            ttl,
            qspec,
            knot,
            probe,
        } => {
            let caps = Caps::parse(&caps)?;
            let ttl = parse_duration(&ttl).context("--ttl")?;
            let a = DelegateArgs {
                name: &name,
                caps: &caps,
                ttl,
                qspec: &qspec,
                knot: knot.as_deref(),
                probe: probe.as_deref(),
            };
            commands::delegate(&home, &a, &mut out)?;
        }
        Cmd::Run {
            name,
            grant,
            caps,
            lease,
            grace,
            contain,
            allow_no_seccomp,
            cmd,
        } => {
            let caps = Caps::parse(&caps)?;
            let lease = parse_duration(&lease).context("--lease")?;
            let grace = parse_duration(&grace).context("--grace")?;
            drop(out);
            let a = RunArgs {
                name: name.as_deref(),
                grant: grant.as_deref(),
                caps: &caps,
                lease,
                grace,
                contain: contain.parse()?,
                allow_no_seccomp,
                cmd: &cmd,
            };
            return Ok(commands::run(&home, &a)?);
        }
        Cmd::Revoke { name } => commands::revoke(&home, &name, &mut out)?,
        Cmd::List { json } => commands::list(&home, json, &mut out)?,
        Cmd::Verify {
            grant,
            pubkey,
            revocations,
            check_model,
        } => {
            let a = VerifyArgs {
                grant: &grant,
                pubkey: pubkey.as_deref(),
                revocations: revocations.as_deref(),
                check_model,
            };
            commands::verify(&home, &a, &mut out)?;
        }
        Cmd::Attenuate {
            grant,
            caps,
            ttl,
            out: dest,
        } => {
            let caps = caps.as_deref().map(Caps::parse).transpose()?;
            let ttl = ttl
                .as_deref()
                .map(parse_duration)
                .transpose()
                .context("--ttl")?;
            commands::attenuate(&home, &grant, caps.as_ref(), ttl, dest.as_deref(), &mut out)?;
        }
        Cmd::Pubkey {
            cmd: PubkeyCmd::Export { out: dest },
        } => commands::pubkey_export(&home, dest.as_deref(), &mut out)?,
    }
    Ok(0)
}
