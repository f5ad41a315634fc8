//! The `swerve` command line: its commands and flags ([`Cli`], also what the man page and shell
//! completions are generated from) and [`run`], which calls the library; `main.rs` parses and
//! maps the result to an exit code.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::cert::{parse_base, swerve_home, CertStore, Certificate, NodeKey};
use crate::manifest::Manifest;
use crate::overlay;
use crate::plan::{
    command_env, parse_cap, parse_env_name, parse_setenv, parse_size, Bind, NetMode, Overlay, Plan,
    SliverSpec,
};

const AFTER_HELP: &str = "\
Workflow:
  scripts/make-rootfs.sh /srv/slivers/scratch         # busybox + bash rootfs (or --arch arm64)
  swerve admit base:scratch --rootfs /srv/slivers/scratch
  swerve cline base:scratch -- sh -c 'hostname; ls /'

Exit codes:
  cline: the command's own status; 128+N if it was killed by signal N;
         125 the sliver could not be set up (nothing ran); 126 the command could not be
         executed; 127 it was not found in the rootfs.
  all:   1 refused or failed (no certificate, rootfs mismatch, I/O error); 2 usage error.

Environment:
  SWERVE_HOME          certificates and the node key (default ~/.swerve)
  MONSTER_GUARD_HOME   if $MONSTER_GUARD_HOME/node.key exists, it is the node key
  SWERVE_LOG           log filter (default: warn), e.g. SWERVE_LOG=info
  None of swerve's environment reaches the command: it gets PATH, HOME=/root, TERM (if set)
  and what --keep-env and --setenv name.";

/// The sliver launcher: runs a command in fresh namespaces + pivot_root, only for an admitted base.
#[derive(Parser)]
#[command(name = "swerve", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once per run
enum Cmd {
    /// Certify a rootfs: hash every path (type, mode, owner, content, symlink target) into a
    /// BLAKE3 manifest and sign it with the node's ed25519 key.
    Admit {
        /// The base to admit, as base:NAME.
        base: String,
        /// The rootfs directory.
        #[arg(long)]
        rootfs: PathBuf,
    },
    /// Enter a sliver of an admitted base and run CMD as the child of its PID 1.
    ///
    /// The rootfs is re-hashed first; a rootfs that does not match its certificate (or has none)
    /// is refused, naming the first differing path. Inside: new mount, UTS, IPC, PID and network
    /// namespaces (plus a user namespace when not root), a new session (no controlling
    /// terminal), only fds 0-2 (and --pass-fd ones), a fresh session keyring, a read-only
    /// nosuid+nodev rootfs, fresh /proc (runc's read-only and masked paths applied), /sys, a
    /// tmpfs /tmp, a tmpfs /dev with null, zero, full, random, urandom and tty bound in, no
    /// capabilities unless --cap asks, no_new_privs, keyctl/add_key/request_key denied by
    /// seccomp, a clean environment (PATH, HOME, TERM, and what --keep-env and --setenv name).
    /// The sliver dies with swerve.
    Cline {
        /// The base, as base:NAME.
        base: String,
        /// The rootfs directory (default: the one recorded at admission).
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// Hostname inside the sliver (default: sliver-NAME).
        #[arg(long)]
        hostname: Option<String>,
        /// Bind a host path (and every mount under it) into the sliver: SRC:DST[:OPTS], OPTS a
        /// comma-separated list of `ro` (read-only, every submount included), `rw` (default)
        /// and `dev` (device nodes under it may be opened; default nodev). Always nosuid. DST
        /// must exist in the rootfs, or lie under /tmp or /dev (swerve's tmpfs mounts), where it
        /// is created.
        #[arg(long = "bind", value_name = "SRC:DST[:ro,dev]")]
        binds: Vec<String>,
        /// Keep this open file descriptor (above 2) open, at the same number, in the command;
        /// repeatable. Every other fd above 2 is closed.
        #[arg(long = "pass-fd", value_name = "N", value_parser = parse_pass_fd)]
        pass_fds: Vec<i32>,
        /// Networking: `loopback` (default: a new namespace with only lo up), `host` (share the
        /// host's), or `veth:IP/PREFIX[,HOSTIP]` (a veth pair: eth0 inside with IP, sw<PID> on
        /// the host with HOSTIP, default the network's first address). veth shells out to the
        /// host's iproute2 `ip`; inside, no `ip` is needed.
        #[arg(long, default_value = "loopback", value_name = "MODE")]
        net: String,
        /// Memory limit (e.g. 512M, 2G): memory cgroup limit plus RLIMIT_DATA.
        #[arg(long, value_name = "SIZE")]
        mem: Option<String>,
        /// Most processes the sliver may hold at once (pids cgroup; required to work, since
        /// root ignores RLIMIT_NPROC).
        #[arg(long, value_name = "N")]
        pids: Option<u64>,
        /// CPU seconds the command may use (RLIMIT_CPU; SIGXCPU then SIGKILL).
        #[arg(long, value_name = "N")]
        cpu_secs: Option<u64>,
        /// Keep this capability (e.g. CAP_SYS_ADMIN or net_bind_service); repeatable.
        /// All others are dropped, from the bounding set too.
        #[arg(long = "cap", value_name = "CAP")]
        caps: Vec<String>,
        /// Comma-separated syscalls that fail with EPERM inside (seccomp), e.g. ptrace,kexec_load.
        #[arg(long, value_name = "SYSCALLS", value_delimiter = ',')]
        seccomp_deny: Vec<String>,
        /// Make the rootfs writable through a copy-on-write layer (overlayfs): the sliver sees
        /// its writes, the certified base never does, and they are gone when it exits (unless
        /// --upper keeps them). Still nosuid, nodev. Without overlayfs in the kernel, the base is
        /// written in place (with a warning; it will no longer match its certificate) and only
        /// while no other sliver of it runs.
        #[arg(long)]
        rw: bool,
        /// With --rw: keep the writes in DIR (DIR/upper, with DIR/work beside it) instead of a
        /// tmpfs that dies with the sliver; a later --rw --upper DIR sliver starts from them.
        /// DIR must lie outside the rootfs and on a nosuid,nodev mount (what a sliver leaves
        /// there, a setuid file or a device node, must do nothing on the host); one sliver at a
        /// time.
        #[arg(long, value_name = "DIR", requires = "rw", value_parser = overlay::parse_upper)]
        upper: Option<PathBuf>,
        /// Set NAME=VALUE in the command's environment (repeatable; overrides the defaults and
        /// --keep-env). The command's environment is otherwise only PATH (the usual sbin/bin
        /// directories), HOME=/root and the caller's TERM.
        #[arg(long = "setenv", value_name = "NAME=VALUE", value_parser = parse_setenv)]
        setenv: Vec<(String, String)>,
        /// Pass the caller's NAME (if set) into the command's environment; repeatable.
        #[arg(long = "keep-env", value_name = "NAME", value_parser = parse_env_name)]
        keep_env: Vec<String>,
        /// Print the setup steps in order, after verifying the certificate, and exit.
        #[arg(long)]
        dry_run: bool,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
    /// List admitted bases and check each certificate's signature.
    Certs {
        /// Also re-hash each rootfs and report whether it still matches.
        #[arg(long)]
        verify: bool,
        /// Print JSON (one object per base) instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `--pass-fd N`: N above 2 and open in this process.
fn parse_pass_fd(s: &str) -> Result<i32, String> {
    let fd: i32 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a file descriptor number"))?;
    if fd <= 2 {
        return Err("fds 0-2 are always passed".into());
    }
    nix::fcntl::fcntl(fd, nix::fcntl::F_GETFD).map_err(|e| format!("fd {fd} is not open ({e})"))?;
    Ok(fd)
}

pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let home = swerve_home();
    let store = CertStore::new(&home);
    match cli.cmd {
        Cmd::Admit { base, rootfs } => {
            let name = parse_base(&base)?;
            let rootfs = std::fs::canonicalize(&rootfs)
                .with_context(|| format!("rootfs {}", rootfs.display()))?;
            let key = NodeKey::load_or_create(&home).context("loading the node key")?;
            let t = Instant::now();
            let manifest = Manifest::build(&rootfs).context("hashing the rootfs")?;
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let cert = Certificate::sign(&name, &rootfs, &manifest, &key);
            let path = store.save(&cert).context("saving the certificate")?;
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "admitted base:{name}: {} entries, {} bytes, manifest blake3 {}, hashed in {ms:.1} ms\ncertificate {} (key {})",
                cert.entries,
                cert.total_bytes,
                cert.manifest_blake3,
                path.display(),
                key.path.display()
            )?;
            Ok(0)
        }
        Cmd::Cline {
            base,
            rootfs,
            hostname,
            binds,
            pass_fds,
            net,
            mem,
            pids,
            cpu_secs,
            caps,
            seccomp_deny,
            rw,
            upper,
            setenv,
            keep_env,
            dry_run,
            cmd,
        } => {
            let name = parse_base(&base)?;
            let cert = store.load(&name)?;
            let rootfs = rootfs.unwrap_or_else(|| cert.rootfs.clone());
            let rootfs = std::fs::canonicalize(&rootfs)
                .with_context(|| format!("rootfs {}", rootfs.display()))?;
            let overlay = match (rw, overlay::available()) {
                (true, true) => Some(Overlay { upper }),
                (true, false) if upper.is_some() => {
                    bail!("--upper needs overlayfs, which this kernel lacks (not in /proc/filesystems)")
                }
                _ => None,
            };
            if let Some(dir) = overlay.as_ref().and_then(|o| o.upper.as_deref()) {
                overlay::check_upper_apart(dir, &rootfs)?;
            }
            let in_place = rw && overlay.is_none();
            // Held until swerve exits, before verification: every sliver of the base shares the
            // lock; writing the base in place takes it alone, so no sliver runs (or verifies) a
            // tree that is being written under it.
            let _base_lock = if dry_run {
                None
            } else {
                Some(overlay::lock_dir(
                    &rootfs,
                    in_place,
                    &format!("base:{name}"),
                    if in_place {
                        "another sliver runs it, and without overlayfs --rw would write it in place under that sliver; retry when it has exited"
                    } else {
                        "a --rw sliver is writing it in place (this kernel has no overlayfs); retry when it has exited"
                    },
                )?)
            };
            let _upper_lock = match overlay.as_ref().and_then(|o| o.upper.as_deref()) {
                Some(dir) if !dry_run => Some(overlay::lock_dir(
                    dir,
                    true,
                    &format!("--upper {}", dir.display()),
                    "another sliver writes to it",
                )?),
                _ => None,
            };
            let key = NodeKey::load_or_create(&home).context("loading the node key")?;
            let t = Instant::now();
            cert.verify_rootfs(&key, &rootfs)
                .with_context(|| format!("refusing base:{name}"))?;
            tracing::info!(
                "verified base:{name} ({} entries) in {:.1} ms",
                cert.entries,
                t.elapsed().as_secs_f64() * 1e3
            );

            if in_place && !dry_run {
                eprintln!(
                    "swerve: warning: this kernel has no overlayfs: --rw writes base:{name} in place ({}); it will no longer match its certificate",
                    rootfs.display()
                );
            }
            let hostname = hostname.unwrap_or_else(|| format!("sliver-{name}"));
            if hostname.is_empty() || hostname.len() > 64 || hostname.contains(['/', '\0']) {
                bail!("bad --hostname {hostname:?}: 1-64 characters, no '/'");
            }
            let spec = SliverSpec {
                base: name,
                rootfs,
                hostname,
                binds: binds
                    .iter()
                    .map(|b| Bind::parse(b))
                    .collect::<Result<_, _>>()?,
                net: NetMode::parse(&net)?,
                mem: mem.as_deref().map(parse_size).transpose()?,
                pids: match pids {
                    Some(0) => bail!("--pids must be at least 1"),
                    p => p,
                },
                cpu_secs,
                caps_keep: caps
                    .iter()
                    .map(|c| parse_cap(c))
                    .collect::<Result<_, _>>()?,
                seccomp_deny: seccomp_deny.into_iter().filter(|s| !s.is_empty()).collect(),
                pass_fds,
                rw,
                overlay,
                user_ns: !nix::unistd::geteuid().is_root(),
                argv: cmd,
                env: command_env(&keep_env, &setenv, |n| std::env::var_os(n)),
            };
            let plan = Plan::new(spec);
            if dry_run {
                crate::sliver::Filters::new(&plan)?;
                let mut out = std::io::stdout().lock();
                writeln!(
                    out,
                    "# swerve cline base:{} --rootfs {} (certificate verified)",
                    plan.spec.base,
                    plan.spec.rootfs.display()
                )?;
                write!(out, "{plan}")?;
                return Ok(0);
            }
            Ok(crate::sliver::run(&plan).context("starting the sliver")?)
        }
        Cmd::Certs { verify, json } => {
            let key = NodeKey::load_or_create(&home).context("loading the node key")?;
            let mut out = std::io::stdout().lock();
            let names = store.list()?;
            if !json {
                writeln!(
                    out,
                    "{:<20} {:>8} {:>12} {:<10} {:<16} ROOTFS",
                    "BASE", "ENTRIES", "BYTES", "SIGNATURE", "ROOTFS-MATCH"
                )?;
            }
            let mut bad = false;
            for name in names {
                let (sig, matched, cert) = match store.load(&name) {
                    Err(e) => (format!("unreadable: {e}"), "-".to_string(), None),
                    Ok(c) => {
                        let sig = match c.verify_signature(&key) {
                            Ok(()) => "ok".to_string(),
                            Err(e) => format!("BAD: {e}"),
                        };
                        let matched = if !verify {
                            "-".to_string()
                        } else {
                            match c.verify_rootfs(&key, &c.rootfs) {
                                Ok(_) => "ok".to_string(),
                                Err(crate::SwerveError::RootfsMismatch { path, .. }) => {
                                    format!("CHANGED {path}")
                                }
                                Err(e) => format!("ERROR {e}"),
                            }
                        };
                        (sig, matched, Some(c))
                    }
                };
                bad |= sig != "ok" || (verify && matched != "ok");
                if json {
                    let v = serde_json::json!({
                        "base": name,
                        "entries": cert.as_ref().map(|c| c.entries),
                        "total_bytes": cert.as_ref().map(|c| c.total_bytes),
                        "rootfs": cert.as_ref().map(|c| c.rootfs.display().to_string()),
                        "created_unix": cert.as_ref().map(|c| c.created_unix),
                        "manifest_blake3": cert.as_ref().map(|c| c.manifest_blake3.clone()),
                        "signature": sig,
                        "rootfs_match": matched,
                    });
                    writeln!(out, "{v}")?;
                } else {
                    let (entries, bytes, root) = cert
                        .as_ref()
                        .map(|c| {
                            (
                                c.entries.to_string(),
                                c.total_bytes.to_string(),
                                c.rootfs.display().to_string(),
                            )
                        })
                        .unwrap_or_default();
                    let sig_short = if sig == "ok" {
                        "ok".to_string()
                    } else {
                        "BAD".to_string()
                    };
                    writeln!(out, "base:{name:<15} {entries:>8} {bytes:>12} {sig_short:<10} {matched:<16} {root}")?;
                    if sig != "ok" {
                        writeln!(out, "  {sig}")?;
                    }
                }
            }
            Ok(if bad { 1 } else { 0 })
        }
    }
}
