//! `moonshine mesh discover|form|generate`: find stations by their UDP beacons, form chains
//! (the ephemeral elector: it validates that announced ranges tile the model, or with
//! `--assign` gives each node a range by its RAM budget and writes node manifests; then it
//! writes a chains file and exits), and generate through replica chains with failover. See
//! `specs/mesh.md`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use station_wire::beacon::{self, Announcement, AssignRequest, Heard};
use station_wire::client::StationClient;
use station_wire::mesh_file::MeshFile;
use station_wire::replicas::ReplicaSet;

/// Mesh discovery and forming.
///
/// Examples:
///   moonshine mesh discover --timeout 2
///   moonshine mesh ls --timeout 2              (stations announcing over mDNS: fat-station --mdns)
///   moonshine mesh form -o mesh.json          (then: moonshine --mesh mesh.json -c ...)
///   moonshine mesh form --assign -o mesh.json --manifests nodes/ --shard model.knot
///   moonshine mesh generate --discover -c "The capital of France is" -n 16
///
/// Stations announce with `fat-station --beacon ADDR` (and their RAM budget with
/// AEON_NODE_RAM=2.4G in their environment). Exit codes: 0 ok, 1 nothing found or no chain
/// could be formed, 2 bad arguments or I/O errors.
#[derive(Debug, Parser)]
// Verbatim: clap would reflow the examples into one line.
#[command(name = "moonshine mesh", about, long_about, verbatim_doc_comment)]
struct MeshArgs {
    #[command(subcommand)]
    cmd: MeshCmd,
}

/// The clap definition of `moonshine mesh` (parsed apart from moonshine's own flags), for
/// the man pages and completions (`aeon-docs`).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    MeshArgs::command()
}

#[derive(Debug, clap::Args)]
struct Listen {
    /// UDP address to listen for beacons on.
    #[arg(long, default_value_t = SocketAddr::from(([0, 0, 0, 0], beacon::DEFAULT_PORT)))]
    listen: SocketAddr,
    /// Seconds to listen.
    #[arg(long, default_value_t = 2.0)]
    timeout: f64,
}

#[derive(Debug, Subcommand)]
enum MeshCmd {
    /// List the stations announcing themselves over mDNS / DNS-SD (`_aeon-station._tcp`,
    /// `fat-station --mdns`): the same service avahi-browse and other tools see.
    Ls {
        /// Seconds to listen.
        #[arg(long, default_value_t = 2.0)]
        timeout: f64,
        /// Leave the loopback interface out (it is included: stations on this host often
        /// listen on 127.0.0.1).
        #[arg(long)]
        no_loopback: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the stations announcing themselves.
    Discover {
        #[command(flatten)]
        l: Listen,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Collect announcements, group stations into chains that tile the model (replicas when
    /// there are enough), write the chains file and exit. With --assign, give each node a
    /// contiguous layer range proportional to its announced RAM budget instead (within what
    /// it holds: a full-model station can run any range).
    Form {
        #[command(flatten)]
        l: Listen,
        /// Only stations of this model hash (needed when several models announce).
        #[arg(long)]
        model: Option<String>,
        /// Where to write the chains file (a valid `--mesh` file: its `stations` is chain 0).
        /// With --assign its hops carry the assigned ranges: `moonshine --mesh FILE` runs them
        /// on the stations as they are (per-hop X-Layer-Range); `moonshine mesh generate`
        /// (POST /chain) needs the stations restarted from --manifests.
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// Assign ranges by RAM budget rather than take the announced ones.
        #[arg(long)]
        assign: bool,
        /// With --assign: how many independent chains (replicas) to make.
        #[arg(long, default_value_t = 1, requires = "assign")]
        replicas: u32,
        /// With --assign: RAM budget assumed for a node that announced none (`2.4G`, `512M`;
        /// default: the smallest announced, or equal shares when none was).
        #[arg(long, value_name = "SIZE", requires = "assign")]
        default_ram: Option<String>,
        /// With --assign: write one manifest per node, DIR/NODE_ID.json, to restart each
        /// station as its assigned part (`fat-station --manifest`, `scripts/equip.sh`); the
        /// stations then forward to each other (POST /chain).
        #[arg(long, value_name = "DIR", requires_all = ["assign", "shard"])]
        manifests: Option<PathBuf>,
        /// With --manifests: the model or shard file each node serves from, as the node sees
        /// it (relative to its manifest, or absolute); `{node_id}` is replaced by the node id.
        #[arg(long, value_name = "FILE", requires = "manifests")]
        shard: Option<String>,
    },
    /// Greedy generation through a formed mesh, one request per token, failing over to a
    /// replica chain when a node dies.
    Generate {
        /// A chains file from `mesh form` (or a plain mesh file).
        #[arg(long, required_unless_present = "discover")]
        mesh: Option<PathBuf>,
        /// Form the mesh from beacons instead of a file.
        #[arg(long)]
        discover: bool,
        #[command(flatten)]
        l: Listen,
        /// The prompt (tokenized by the entry station).
        #[arg(short = 'c', long, required_unless_present = "tokens")]
        prompt: Option<String>,
        /// Token ids instead of a prompt, comma-separated.
        #[arg(long, value_delimiter = ',')]
        tokens: Option<Vec<u32>>,
        /// Tokens to generate.
        #[arg(short = 'n', long, default_value_t = 16)]
        max_tokens: usize,
        /// Seconds one token step may take across the whole chain.
        #[arg(long, default_value_t = 60)]
        step_timeout: u64,
        /// A monster-guard grant file to present to the entry (X-Grant).
        #[arg(long)]
        grant: Option<PathBuf>,
        /// The mesh key of a sealed mesh (the stations' `--mesh-key` file): seal each token
        /// request to the entry and open the sealed answer (a keyed entry refuses unsealed
        /// requests with 401).
        #[arg(long, value_name = "FILE")]
        mesh_key: Option<PathBuf>,
    },
}

/// Runs `moonshine mesh ARGS...`; `args` are everything after `mesh`.
pub fn run(args: Vec<String>) -> ExitCode {
    let parsed =
        match MeshArgs::try_parse_from(std::iter::once("moonshine mesh".to_string()).chain(args)) {
            Ok(a) => a,
            Err(e) => {
                let _ = e.print();
                return if e.use_stderr() {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
        };
    match exec(parsed) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("moonshine mesh: error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn listen(l: &Listen) -> Result<Vec<Announcement>> {
    Ok(hear(l)?.into_iter().map(|h| h.ann).collect())
}

fn hear(l: &Listen) -> Result<Vec<Heard>> {
    beacon::hear(l.listen, Duration::from_secs_f64(l.timeout.max(0.01)))
        .with_context(|| format!("listening for beacons on {}", l.listen))
}

/// `1.23 GB` style (decimal).
fn human(b: u64) -> String {
    let b = b as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else {
        format!("{:.0} MB", b / 1e6)
    }
}

/// Writes `text` to `path` through a temporary file and a rename.
fn write_atomic(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

fn exec(a: MeshArgs) -> Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    match a.cmd {
        MeshCmd::Ls {
            timeout,
            no_loopback,
            json,
        } => {
            let wait = Duration::from_secs_f64(timeout.clamp(0.01, 600.0));
            let found = station_wire::mdns::browse(wait, !no_loopback)
                .context("browsing mDNS for _aeon-station._tcp")?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&found)?)?;
            } else {
                for f in &found {
                    let t = |k: &str| f.txt.get(k).map_or("-", String::as_str);
                    let hash = t("hash");
                    writeln!(
                        out,
                        "{:<12} {:<6} layers {:<6} {:<28} {} ({})",
                        t("node"),
                        t("role"),
                        t("layers"),
                        t("url"),
                        t("model"),
                        &hash[..hash.len().min(12)],
                    )?;
                }
                if found.is_empty() {
                    eprintln!("moonshine mesh: no station answered over mDNS in {timeout} s");
                }
            }
            Ok(if found.is_empty() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        MeshCmd::Discover { l, json } => {
            let heard = hear(&l)?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&heard)?)?;
            } else {
                for Heard { ann: h, ram_bytes } in &heard {
                    writeln!(
                        out,
                        "{:<12} {:<6} layers {:<6} ram {:<9} {:<28} {} ({}, {})",
                        h.node_id,
                        h.role,
                        h.layers,
                        ram_bytes.map(human).unwrap_or_else(|| "-".into()),
                        h.address,
                        h.model_id,
                        &h.model_hash[..h.model_hash.len().min(12)],
                        h.mesh
                    )?;
                }
                if heard.is_empty() {
                    eprintln!(
                        "moonshine mesh: no beacons heard on {} in {} s",
                        l.listen, l.timeout
                    );
                }
            }
            Ok(if heard.is_empty() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        MeshCmd::Form {
            l,
            model,
            output,
            assign,
            replicas,
            default_ram,
            manifests,
            shard,
        } => {
            let default_ram = match default_ram.as_deref() {
                Some(s) => Some(aeon_cli::size::parse_size_nonzero(s).context("--default-ram")?),
                None => None,
            };
            let heard = hear(&l)?;
            let result = if assign {
                let req = AssignRequest {
                    model_hash: model,
                    replicas,
                    default_ram,
                };
                beacon::assign(&heard, &req).map(|a| (a.chains_file(), Some(a)))
            } else {
                let anns: Vec<Announcement> = heard.into_iter().map(|h| h.ann).collect();
                beacon::form(&anns, model.as_deref()).map(|f| (f, None))
            };
            let (formed, assigned) = match result {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("moonshine mesh: {e}");
                    return Ok(ExitCode::from(1));
                }
            };
            match &assigned {
                Some(a) => {
                    for (i, c) in a.chains.iter().enumerate() {
                        let hops: Vec<String> = c
                            .iter()
                            .map(|h| {
                                format!(
                                    "{}[{}-{}, {}{}]",
                                    h.node_id,
                                    h.layers.start,
                                    h.layers.end,
                                    human(h.ram_bytes),
                                    if h.ram_announced { "" } else { " assumed" }
                                )
                            })
                            .collect();
                        writeln!(out, "chain {i}: {}", hops.join(" -> "))?;
                    }
                }
                None => {
                    for (i, c) in formed.chains.iter().enumerate() {
                        let hops: Vec<String> = c
                            .iter()
                            .map(|h| format!("{}[{}]", h.node_id, h.layers))
                            .collect();
                        writeln!(out, "chain {i}: {}", hops.join(" -> "))?;
                    }
                }
            }
            if let (Some(a), Some(dir), Some(shard)) = (&assigned, &manifests, &shard) {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                for m in a.manifests(shard) {
                    let p = dir.join(format!("{}.json", m.node_id));
                    write_atomic(&p, &format!("{}\n", serde_json::to_string_pretty(&m)?))?;
                    writeln!(out, "wrote {}", p.display())?;
                }
            }
            let json = serde_json::to_string_pretty(&formed)?;
            match output {
                Some(p) => {
                    write_atomic(&p, &format!("{json}\n"))?;
                    writeln!(out, "wrote {}", p.display())?;
                }
                None => writeln!(out, "{json}")?,
            }
            Ok(ExitCode::SUCCESS)
        }
        MeshCmd::Generate {
            mesh,
            discover,
            l,
            prompt,
            tokens,
            max_tokens,
            step_timeout,
            grant,
            mesh_key,
        } => {
            let formed: MeshFile = match (mesh, discover) {
                (Some(p), false) => {
                    let t = std::fs::read_to_string(&p)
                        .with_context(|| format!("reading {}", p.display()))?;
                    serde_json::from_str(&t).with_context(|| format!("parsing {}", p.display()))?
                }
                (None, true) => beacon::form(&listen(&l)?, None)?,
                _ => bail!("give --mesh FILE or --discover"),
            };
            let timeout = Duration::from_secs(step_timeout.max(1));
            let mut rs =
                ReplicaSet::from_file(&formed, timeout, &format!("ms{}", std::process::id()))?;
            if let Some(g) = grant {
                let b =
                    std::fs::read(&g).with_context(|| format!("reading grant {}", g.display()))?;
                let grant_hex = aeon_grant::encoding::hex(&b);
                for c in rs.chains_mut() {
                    c.grant_hex = Some(grant_hex.clone());
                }
            }
            if let Some(k) = mesh_key {
                let key = station_wire::seal::MeshKey::load(&k)?;
                for c in rs.chains_mut() {
                    c.mesh_key = Some(key.clone());
                }
            }
            let entry = StationClient::new(&rs.chains()[0].hops[0].url, timeout);
            let prompt_ids = match (tokens, &prompt) {
                (Some(t), _) => t,
                (None, Some(p)) => entry.tokenize(p, None).context("tokenizing at the entry")?,
                (None, None) => bail!("give -c PROMPT or --tokens"),
            };
            let got = rs.generate_greedy(&prompt_ids, max_tokens, &[], &mut |_, s| {
                let per: Vec<String> = s
                    .trace
                    .iter()
                    .map(|(n, r, ms, _)| format!("{n}[{r}] {ms:.1}"))
                    .collect();
                tracing::info!(
                    "token {} ({:.1} ms): {}",
                    s.token,
                    s.wall_ms,
                    per.join(", ")
                );
            })?;
            for f in &rs.failovers {
                eprintln!(
                    "moonshine mesh: failover from chain {} to {} ({} tokens re-prefilled): {}",
                    f.from_chain, f.to_chain, f.reprefilled, f.error
                );
            }
            let text = rs.chains()[rs.active()]
                .hops
                .first()
                .map(|h| StationClient::new(&h.url, timeout).detokenize(&got));
            match (prompt, text) {
                (Some(p), Some(Ok(t))) => writeln!(out, "{p} -> {t}")?,
                _ => writeln!(
                    out,
                    "{}",
                    got.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                )?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
