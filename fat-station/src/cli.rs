//! The `fat-station` command line: its flags ([`Args`], also what the man page and shell
//! completions are generated from) and [`run`], which loads the model and serves;
//! `main.rs` parses and maps the result to an exit code.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::engine::{Holdings, KvDtype};
use crate::mesh::grant::GrantVerifier;
use crate::mesh::manifest::NodeManifest;
use crate::mesh::seal::MeshKey;
use crate::mesh::MeshNode;
use crate::station::weight_memory::PackWeights;
use crate::station::{self, Limits, Station};
use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use http_frame::conn::ConnLimits;
use knot_format::{Knot, LayerRange, Role};
use station_wire::beacon::{self, Announcement, Beacon};

/// Serve a KNOT model over HTTP: /embed, /forward (X-Layer-Range: a-b), /lm-head,
/// /tokenize, /detokenize, /health. See specs/station-wire.md.
///
/// A station holds either the whole model, the part a shard file carries, or the layer
/// range given by --role/--layers (original layer indices, half-open).
///
/// Exit codes: 0 clean shutdown, 2 bad arguments or model.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
pub struct Args {
    /// Model or shard file (.knot), or a GGUF: imported once into the model cache
    /// ($AEON_MODELS_DIR, else ~/.cache/aeon-shell/models/imported) and reused after.
    /// Not needed with --manifest. `-m/--model` as llama-server spells it.
    #[arg(
        long,
        short = 'm',
        visible_alias = "model",
        required_unless_present = "manifest"
    )]
    knot: Option<std::path::PathBuf>,
    /// Address to serve on; port 0 picks a free one (printed on stdout).
    /// Default: the manifest's `listen`, else 127.0.0.1:8080.
    #[arg(long, conflicts_with_all = ["host", "port"])]
    listen: Option<SocketAddr>,
    /// The IP address to serve on, as llama-server takes it (with --port; default 127.0.0.1).
    #[arg(long)]
    host: Option<std::net::IpAddr>,
    /// The port to serve on, as llama-server takes it (with --host; default 8080).
    #[arg(long)]
    port: Option<u16>,
    /// Serve as a mesh node from its manifest (written by `shard-knot plan -o DIR`): its
    /// shard, role, layers, listen address and successor. POST /chain then runs this node's
    /// layers and forwards the residual to the successor itself (specs/mesh.md).
    #[arg(long, conflicts_with_all = ["knot", "role", "layers"])]
    manifest: Option<std::path::PathBuf>,
    /// Mesh key file (32 random bytes: `head -c 32 /dev/urandom > mesh.key`, or 64 hex
    /// characters). Every residual between nodes is sealed with ChaCha20-Poly1305; unsealed,
    /// replayed or tampered ones are refused with a 4xx. Without a key the mesh is open.
    #[arg(long)]
    mesh_key: Option<std::path::PathBuf>,
    /// Require a monster-guard grant (hex in X-Grant) signed by this issuer for requests
    /// entering the mesh here: 64 hex characters or a file holding them (`node.pub`).
    #[arg(long, value_name = "ISSUER_PUBKEY")]
    require_grant: Option<String>,
    /// The issuer's signed revocation list (monster-guard's `revoked.json`): a grant on it,
    /// or attenuated from one on it, is refused with 403 `grant_revoked`. Re-read whenever the
    /// file changes, so `monster-guard revoke` takes effect at the next request. A list that
    /// does not verify, is older than the newest one seen, or is missing after one was seen,
    /// refuses every grant (503) until a valid list is back; a missing file is an empty list
    /// only while none was ever seen.
    #[arg(long, value_name = "FILE", requires = "require_grant")]
    revocations: Option<std::path::PathBuf>,
    /// The model grants must be minted for: the BLAKE3 of the whole model file monster-guard
    /// delegated (the grant's `model_hash`; `b3sum MODEL.knot`). Default: that of the served
    /// file (--knot), which is what `monster-guard delegate --knot FILE` mints. An entry shard
    /// needs it (a shard cannot be probed, so grants name the model it was cut from); a grant
    /// for any other model is refused with 403 `grant_refused`.
    #[arg(long, value_name = "BLAKE3", requires = "require_grant")]
    grant_model_hash: Option<String>,
    /// Where the station keeps state that must outlive it: the highest revocation-list
    /// sequence seen per issuer (`revocation-seq/ISSUER`). Default: $AEON_STATE_DIR, else
    /// $XDG_STATE_HOME/aeon-shell/fat-station, else ~/.local/state/aeon-shell/fat-station.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<std::path::PathBuf>,
    /// Announce this station by UDP beacon to ADDR (e.g. 127.255.255.255:7979 for simulated
    /// nodes on one host, 255.255.255.255:7979 on a LAN) for `moonshine mesh discover`.
    #[arg(long, value_name = "ADDR")]
    beacon: Option<SocketAddr>,
    /// Announce this station over mDNS / DNS-SD as `_aeon-station._tcp` (TXT: model hash,
    /// layers, role, url; see station_wire::mdns), for `moonshine mesh ls`, `avahi-browse`
    /// and other tools. Beside --beacon, not instead of it.
    #[arg(long)]
    mdns: bool,
    /// Milliseconds between beacons.
    #[arg(long, default_value_t = 1000)]
    beacon_interval_ms: u64,
    /// RAM budget this node announces in its beacons (`2.4G`, `512M`, `1Gi`), which
    /// `moonshine mesh form --assign` splits layers by. Default: $AEON_NODE_RAM, else none.
    #[arg(long, value_name = "SIZE", value_parser = parse_ram)]
    ram: Option<u64>,
    /// URL others reach this station at (default http://LISTEN-ADDRESS; `HOST:PORT` will do).
    #[arg(long, value_parser = crate::client::station_url)]
    advertise: Option<String>,
    /// Node id in traces, errors and beacons (default: the manifest's, else `station`).
    #[arg(long)]
    node_id: Option<String>,
    /// Seconds a forward to the next hop may take (connect + everything downstream).
    #[arg(long, default_value_t = 60)]
    hop_timeout_s: u64,
    /// Seconds either side of this station's clock a sealed residual is accepted.
    #[arg(long, default_value_t = 30)]
    replay_window_s: u64,
    /// Serve only this part of a full model: entry (embedding + layers), mid (layers),
    /// exit (layers + head), full. Needs --layers unless full.
    #[arg(long, value_enum)]
    role: Option<RoleArg>,
    /// Layers to serve, `a..b` or `a-b` (half-open, original indices).
    #[arg(long)]
    layers: Option<String>,
    /// A mesh node's promise (the seed report's `fat-station --sharded`): this station serves
    /// one part of a split model (a shard file from `shard-knot split`, a --manifest, or
    /// --layers of a full file) and refuses to start if it would hold the whole model.
    /// A station always maps only the tensors it serves; this makes the split a checked fact.
    #[arg(long)]
    sharded: bool,
    /// Compute threads (default: all cores).
    #[arg(long, short = 't')]
    threads: Option<usize>,
    /// Most live KV-cache sessions.
    #[arg(long, default_value_t = 64)]
    max_sessions: usize,
    /// Most positions per session (llama-server's `-c/--ctx-size`); also the context RoPE is
    /// set up for (Phi-3 LongRoPE: the long factors above the file's original context).
    #[arg(long, short = 'c', visible_alias = "ctx-size", default_value_t = 4096)]
    max_positions: usize,
    /// How sessions store keys and values: f32 (exact) or f16 (half the KV memory, llama.cpp's
    /// default; logits move slightly, see specs/station-wire.md "Sessions").
    #[arg(long, default_value = "f32", value_parser = parse_kv_dtype)]
    kv_dtype: KvDtype,
    /// Hybrids (lfm2, qwen35): keep a recurrent layer's state every N positions, so that a
    /// rewind (a new chat turn, a retried turn) restores it from there instead of position 0
    /// (0: none). See specs/station-wire.md "Hybrids" for what a checkpoint costs.
    #[arg(long, default_value_t = 256)]
    checkpoint_every: usize,
    /// Hybrids: also keep the state at the end of each of the last N multi-row forwards
    /// (prompts: the ends of chat turns).
    #[arg(long, default_value_t = 8)]
    checkpoint_turns: usize,
    /// Hybrids (short convolutions): every rewind among the last N positions is exact
    /// (rejected drafts). A Gated DeltaNet keeps the start of the latest forward instead.
    #[arg(long, default_value_t = 64)]
    checkpoint_window: usize,
    /// deepseek2 (Multi-head Latent Attention): sessions cache each position's latent row
    /// (kv_lora_rank + rope floats for all heads; V2-Lite: 576 against 5120) and attention
    /// runs in the absorbed form, instead of every head's decompressed key and value
    /// (llama.cpp's layout for attn_kv_b files). Same model up to rounding; other
    /// architectures ignore it; a file with split attn_k_b / attn_v_b always caches the
    /// latent. See specs/station-wire.md "Sessions".
    #[arg(long)]
    mla_latent_cache: bool,
    /// A replica of this node's layer range (base URL; repeat or comma-separate): after each
    /// multi-row forward (a prompt, a chat turn) and every --checkpoint-every positions, the
    /// node ships the session's state there (POST /checkpoint, sealed in a sealed mesh), so a
    /// replica chain taking over after a node loss replays from that position, not from 0.
    #[arg(long, value_name = "URL", value_delimiter = ',',
          value_parser = crate::client::station_url)]
    checkpoint_to: Vec<String>,
    /// Where the weights live: `always` packs them into interleaved copies for the fast
    /// kernels (anonymous memory, which without swap cannot be evicted); `never` keeps them in
    /// the mapped file, which the OS pages from storage when memory is short (slower, never
    /// OOM-killed for its weights); `auto` packs when the copies plus 256 MiB fit this
    /// process's memory cgroup limit and the available memory. Same logits either way.
    #[arg(long, value_enum, default_value_t = PackWeights::Auto)]
    pack_weights: PackWeights,
    /// Seconds an idle session is kept.
    #[arg(long, default_value_t = 600)]
    session_idle_s: u64,
    /// Most KV-cache memory of all sessions together (`4Gi`, `512M`); the least recently used
    /// idle sessions are evicted beyond it.
    #[arg(long, value_name = "SIZE", default_value = "4Gi", value_parser = parse_ram)]
    max_session_memory: u64,
    /// Most open connections. At the bound a new connection closes the one idle the longest;
    /// when all are busy it is answered 503 with Retry-After. Default: 1024, lowered to leave
    /// 64 file descriptors under the open-file limit (`ulimit -n`).
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a client has to send a request's headers, from the connection's start or the
    /// request's first byte (nginx client_header_timeout).
    #[arg(long, value_name = "SECONDS", default_value = "10", value_parser = parse_secs)]
    header_timeout: Duration,
    /// Seconds a keep-alive connection may wait for its next request.
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_secs)]
    idle_timeout: Duration,
    /// Seconds a response may wait on a client that stopped reading it before the connection
    /// is closed (nginx send_timeout).
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_secs)]
    send_timeout: Duration,
    /// Seconds to wait for the next piece of a request body before answering 408
    /// (nginx client_body_timeout).
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = parse_secs)]
    body_timeout: Duration,
    /// Largest request body (`64Mi`, `1G`): a larger Content-Length is refused with 413 before
    /// reading, a chunked body as soon as it grows past it.
    #[arg(long, value_name = "SIZE", default_value = "64Mi", value_parser = parse_ram)]
    max_body: u64,
    /// Most response bytes held at once for clients that have not read them yet (`256Mi`):
    /// a larger answer waiting for its client takes from this, and when it is spent a big
    /// answer is refused with 503 `responses_busy` and Retry-After (answers up to 64 KiB
    /// are not counted).
    #[arg(long, value_name = "SIZE", default_value = "256Mi", value_parser = parse_ram)]
    max_response_memory: u64,
    /// Most compute requests (and tokenizer calls) running at once; the rest wait in turn.
    /// Default: one per core.
    #[arg(long)]
    max_compute: Option<usize>,
    /// A next hop `X-Route` may name on POST /chain besides the manifest successor (base URL;
    /// repeat or comma-separate). Any other route is refused with 403 `route_refused`.
    #[arg(long, value_name = "URL", value_delimiter = ',',
          value_parser = crate::client::station_url)]
    route_to: Vec<String>,
    #[command(flatten)]
    pub verbosity: aeon_cli::Verbosity,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoleArg {
    Entry,
    Mid,
    Exit,
    Full,
}

/// `--state-dir`, else the default documented there.
fn state_dir(arg: Option<&std::path::Path>) -> Result<std::path::PathBuf> {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(d) = arg
        .map(|d| d.to_path_buf())
        .or_else(|| env("AEON_STATE_DIR").map(Into::into))
    {
        return Ok(d);
    }
    if let Some(x) = env("XDG_STATE_HOME") {
        return Ok(std::path::PathBuf::from(x).join("aeon-shell/fat-station"));
    }
    match env("HOME") {
        Some(h) => Ok(std::path::PathBuf::from(h).join(".local/state/aeon-shell/fat-station")),
        None => {
            bail!("--revocations needs a state directory: give --state-dir DIR (HOME is unset)")
        }
    }
}

fn holdings(args: &Args, n_layers: u32) -> Result<Option<Holdings>> {
    let layers = match &args.layers {
        Some(s) => {
            Some(LayerRange::parse(s).with_context(|| format!("--layers {s:?}: expected a..b"))?)
        }
        None => None,
    };
    Ok(match (args.role, layers) {
        (None, None) => None,
        (Some(RoleArg::Full), None) => Some(Holdings::full(n_layers as usize)),
        (Some(r), None) => bail!("--role {r:?} needs --layers a..b"),
        (role, Some(l)) => {
            if l.end > n_layers || l.is_empty() {
                bail!("--layers {l} is outside the model's 0..{n_layers}");
            }
            let (embed, head) = match role {
                Some(RoleArg::Entry) => (true, false),
                Some(RoleArg::Mid) => (false, false),
                Some(RoleArg::Exit) => (false, true),
                Some(RoleArg::Full) => (true, true),
                None => (l.start == 0, l.end == n_layers),
            };
            Some(Holdings {
                embed,
                layers: l,
                head,
            })
        }
    })
}

/// The model hash grants are bound to (issue 32.4: a grant for a tiny model opened a large
/// model's station): `--grant-model-hash`, else the served file's own, as monster-guard hashes
/// it for a grant. An entry shard has no grant of its own (it cannot pass a probe alone), so
/// it must be told which whole model its grants name.
fn grant_model(flag: Option<&str>, knot: &Knot, path: &std::path::Path) -> Result<String> {
    if let Some(h) = flag {
        return Ok(h.to_string());
    }
    if knot.shard().is_some_and(|s| s.role == Role::Entry) {
        bail!(
            "{} is an entry shard: with --require-grant give --grant-model-hash, the BLAKE3 of \
             the whole model file its grants were minted for (their model_hash)",
            path.display()
        );
    }
    aeon_grant::model_file_hash(path)
        .with_context(|| format!("hashing {} for --require-grant", path.display()))
}

pub fn run(args: Args) -> Result<()> {
    let t0 = Instant::now();
    if let Some(n) = args.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .context("configuring compute threads")?;
    }
    let manifest = match &args.manifest {
        Some(p) => Some(NodeManifest::load(p).map_err(anyhow::Error::new)?),
        None => None,
    };
    let knot_path = match (&manifest, &args.knot) {
        (Some((_, shard)), _) => shard.clone(),
        (None, Some(k)) => knot_format::cli::runnable_model(k, args.verbosity.quiet)?,
        (None, None) => bail!("give --knot FILE or --manifest NODE.json"),
    };
    let knot = Knot::open(&knot_path)?;
    let held = match &manifest {
        Some((m, _)) => {
            m.check_file(&knot).map_err(anyhow::Error::msg)?;
            let h = m.holdings().context("manifest layers")?;
            if h.layers.end > knot.arch().n_layers {
                bail!(
                    "manifest layers {} are outside the model's 0..{}",
                    m.layers,
                    knot.arch().n_layers
                );
            }
            Some(h)
        }
        None => holdings(&args, knot.arch().n_layers)?,
    };
    let key = match &args.mesh_key {
        Some(p) => Some(MeshKey::load(p)?),
        None => None,
    };
    let grant = match &args.require_grant {
        Some(g) => {
            let v = GrantVerifier::from_arg(g)?.for_model(&grant_model(
                args.grant_model_hash.as_deref(),
                &knot,
                &knot_path,
            )?)?;
            match &args.revocations {
                Some(p) => Some(v.with_revocations(p, &state_dir(args.state_dir.as_deref())?)?),
                None => Some(v),
            }
        }
        None => None,
    };
    let node_id = args
        .node_id
        .clone()
        .or_else(|| manifest.as_ref().map(|(m, _)| m.node_id.clone()))
        .unwrap_or_else(|| "station".into());
    let listen: SocketAddr = match (args.listen, &manifest) {
        (Some(l), _) => l,
        (None, _) if args.host.is_some() || args.port.is_some() => SocketAddr::new(
            args.host.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into()),
            args.port.unwrap_or(8080),
        ),
        (None, Some((m, _))) => m
            .listen
            .parse()
            .with_context(|| format!("manifest listen {:?}", m.listen))?,
        (None, None) => SocketAddr::from(([127, 0, 0, 1], 8080)),
    };
    let defaults = Limits::default();
    let limits = Limits {
        max_sessions: args.max_sessions,
        session_idle: Duration::from_secs(args.session_idle_s),
        max_positions: args.max_positions,
        kv_dtype: args.kv_dtype,
        checkpoints: crate::engine::Checkpoints {
            window: args.checkpoint_window,
            every: args.checkpoint_every,
            turns: args.checkpoint_turns,
        },
        mla_latent_cache: args.mla_latent_cache,
        pack_weights: args.pack_weights,
        max_session_bytes: usize::try_from(args.max_session_memory).unwrap_or(usize::MAX),
        max_body: usize::try_from(args.max_body).unwrap_or(usize::MAX),
        max_response_bytes: usize::try_from(args.max_response_memory).unwrap_or(usize::MAX),
        body_timeout: args.body_timeout,
        max_compute: args.max_compute.unwrap_or(defaults.max_compute).max(1),
        conn: ConnLimits {
            max_connections: args
                .max_connections
                .unwrap_or(defaults.conn.max_connections)
                .max(1),
            header_timeout: args.header_timeout,
            idle_timeout: args.idle_timeout,
            send_timeout: args.send_timeout,
            shutdown_grace: defaults.conn.shutdown_grace,
        },
        ..defaults
    };
    let station = Station::open(knot, held, limits).context("loading the model")?;
    if args.sharded {
        let n = station.health_report().n_layers;
        if station.model().holdings() == Holdings::full(n as usize) {
            bail!(
                "--sharded: {} would hold the whole model (layers 0-{n}, embedding and head); \
                 give a shard file (shard-knot split), --manifest, or --layers a..b",
                knot_path.display()
            );
        }
    }
    let successor = manifest.as_ref().and_then(|(m, _)| m.successor.clone());
    let chain = manifest.as_ref().map(|(m, _)| m.chain);
    station.set_mesh(
        MeshNode::new(
            node_id.clone(),
            successor,
            key,
            grant,
            Duration::from_secs(args.hop_timeout_s.max(1)),
            Duration::from_secs(args.replay_window_s.max(1)),
        )
        .with_routes(args.route_to.clone())
        .with_replicas(args.checkpoint_to.clone(), args.checkpoint_every)
        .context("starting the checkpoint shipping thread")?,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async move {
        let (listener, addr) = station::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let h = station.model().holdings();
        let health = station.health_report();
        let announcement = || Announcement {
            proto: beacon::PROTO.into(),
            node_id: node_id.clone(),
            model_id: health.model_id.clone(),
            model_hash: health.model_hash.clone(),
            role: health.role.clone(),
            layers: health.layers.clone(),
            n_layers: health.n_layers,
            address: args
                .advertise
                .clone()
                .unwrap_or_else(|| format!("http://{addr}")),
            chain,
            mesh: health.mesh.clone().unwrap_or_default(),
        };
        let _mdns = if args.mdns {
            Some(
                station_wire::mdns::Announcer::spawn(&announcement(), addr.ip(), addr.port())
                    .context("announcing over mDNS")?,
            )
        } else {
            None
        };
        let _beacon = match args.beacon {
            Some(target) => {
                let ann = announcement();
                let ram_bytes = match args.ram {
                    Some(r) => Some(r),
                    None => ram_from_env().context("the RAM budget")?,
                };
                Some(
                    Beacon::spawn(
                        &beacon::Heard { ann, ram_bytes },
                        target,
                        Duration::from_millis(args.beacon_interval_ms.max(10)),
                    )
                    .with_context(|| format!("beacon to {target}"))?,
                )
            }
            None => None,
        };
        // Two lines in one write (a reader that takes the first line and closes the pipe
        // must not make a second write fail): the URL line, then the seed report's
        // `pipeline ready in N ms` (process start to accepting).
        // (`print!` with arguments writes piece by piece, and a line-buffered stdout then
        // writes each line alone: the second write failed and panicked. One buffer, one
        // write_all; an error there is the reader's choice, not the station's.)
        let ready_ms = t0.elapsed().as_secs_f64() * 1e3;
        let ready = format!(
            "fat-station: serving {} layers {}-{}{}{} on http://{addr} (ready in {ready_ms:.1} ms)\n\
             pipeline ready in {} ms ({ready_ms:.2} ms: model mapped, nothing copied)\n",
            station.model().knot().header().model_id,
            h.layers.start,
            h.layers.end,
            if h.embed { " +embed" } else { "" },
            if h.head { " +lm-head" } else { "" },
            ready_ms.round() as u64,
        );
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(ready.as_bytes()).and_then(|()| out.flush());
        }
        station::serve(listener, station, shutdown_signal()).await;
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// A duration in seconds (decimals allowed), more than zero.
fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0 && *v < 1e9)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{s:?}: expected seconds, more than 0"))
}

/// `--kv-dtype`: `f32` or `f16`.
fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    KvDtype::parse(s).ok_or_else(|| format!("{s:?}: expected f32 or f16"))
}

/// Environment variable holding the RAM budget a station announces when `--ram` is not given.
const RAM_ENV: &str = "AEON_NODE_RAM";

/// The RAM budget from [`RAM_ENV`]: `None` when unset, an error when it does not parse.
fn ram_from_env() -> anyhow::Result<Option<u64>> {
    match std::env::var(RAM_ENV) {
        Err(_) => Ok(None),
        Ok(v) => aeon_cli::size::parse_size_nonzero(&v)
            .map(Some)
            .with_context(|| format!("{RAM_ENV}={v}")),
    }
}

/// `--ram`: a positive size (`2.4G`, `1GiB`; the workspace's rule, `aeon_cli::size`).
fn parse_ram(s: &str) -> Result<u64, aeon_cli::size::SizeError> {
    aeon_cli::size::parse_size_nonzero(s)
}
