//! `moonshine up MODEL --nodes N`: one command for a mesh on this machine. Plans the layer
//! ranges with shard-knot's planner (balanced by bytes), starts N stations (`fat-station
//! --role --layers` over the one model file, each on a free loopback port, each forwarding to
//! the next with `--route-to`), writes their mesh
//! file, starts the gateway (`moonshine serve --mesh`) and prints its URL. SIGINT, SIGTERM or
//! SIGHUP stops every process it started, as does any of them exiting.
//!
//! The stations listen on 127.0.0.1 only: the gateway is the one door (`--host 0.0.0.0`
//! opens it, not the stations). Every station maps the same file, so the page cache holds the
//! weights once.

use std::io::{BufRead, BufReader};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use knot_format::{Knot, Role};
use shard_knot::plan::{plan, Budget, ModelCosts, PlanRequest};

/// `moonshine up` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct UpArgs {
    /// The model: a .knot, or a GGUF (imported once into the model cache, then reused).
    pub model: PathBuf,
    /// Stations to split the layers over (each gets a contiguous range; 1: one whole-model
    /// station).
    #[arg(long, short = 'n', default_value_t = 2)]
    pub nodes: u32,
    /// The gateway's IP address (llama-server's `--host`).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// The gateway's port (0 picks a free one; the URL line says which).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The station binary. Default: `fat-station` beside this moonshine, else on PATH.
    #[arg(long, value_name = "PATH")]
    pub station_bin: Option<PathBuf>,
    /// A flag for every station, repeatable (`--station-arg=--threads=2`).
    #[arg(long, value_name = "FLAG", allow_hyphen_values = true)]
    pub station_arg: Vec<String>,
    /// A flag for the gateway, repeatable (`--serve-arg=--api-key=K`).
    #[arg(long, value_name = "FLAG", allow_hyphen_values = true)]
    pub serve_arg: Vec<String>,
}

/// The processes started, stopped (TERM, then KILL after a grace) on drop whatever happens.
struct Fleet {
    procs: Vec<(String, Child)>,
    dir: PathBuf,
}

impl Fleet {
    /// Asks every process to stop (SIGTERM), waits up to `grace`, then kills what is left.
    fn stop(&mut self, grace: Duration) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        for (_, c) in &self.procs {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
        }
        let t = Instant::now();
        for (_, c) in &mut self.procs {
            while t.elapsed() < grace && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        self.procs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// The first process that has exited, with how.
    fn exited(&mut self) -> Option<String> {
        self.procs
            .iter_mut()
            .find_map(|(name, c)| match c.try_wait() {
                Ok(Some(s)) => Some(format!("{name} exited ({s})")),
                Ok(None) => None,
                Err(e) => Some(format!("{name}: {e}")),
            })
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// The station binary: the flag, else `fat-station` beside this executable, else PATH's.
fn station_bin(flag: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = flag {
        return Ok(p.to_path_buf());
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("fat-station")))
        .filter(|p| p.is_file());
    if let Some(p) = beside {
        return Ok(p);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("fat-station"))
        .find(|p| p.is_file())
        .context("fat-station not found beside moonshine or on PATH (give --station-bin)")
}

/// Starts `cmd`, waits for its first stdout line and returns the `http://` URL in it; the
/// rest of its stdout is drained on a thread (a closed pipe would fail its later prints).
fn start(fleet: &mut Fleet, name: String, cmd: &mut Command) -> Result<String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
    let out = child.stdout.take().context("child stdout")?;
    fleet.procs.push((name.clone(), child));
    let mut r = BufReader::new(out);
    let mut line = String::new();
    r.read_line(&mut line)
        .with_context(|| format!("reading {name}'s ready line"))?;
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    match line.split_whitespace().find(|w| w.starts_with("http://")) {
        Some(u) => Ok(u.trim_end_matches([',', ')']).to_string()),
        None if line.is_empty() => bail!("{name} exited before it was ready (its error is above)"),
        None => bail!("{name} printed no URL: {}", line.trim()),
    }
}

fn role_flag(r: Role) -> Option<&'static str> {
    match r {
        Role::Entry => Some("entry"),
        Role::Mid => Some("mid"),
        Role::Exit => Some("exit"),
        Role::Full => None,
    }
}

/// Runs `moonshine up` until a signal or a process exiting.
pub fn run(args: UpArgs) -> Result<ExitCode> {
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let model = knot_format::cli::runnable_model(&args.model, false)?;
    let (p, model_id) = {
        let knot = Knot::open(&model)?;
        let costs = ModelCosts::from_knot(&knot);
        let n = costs.layer_bytes.len() as u32;
        if args.nodes > n {
            bail!(
                "--nodes {}: {} has only {n} layers (one station needs one at least)",
                args.nodes,
                args.model.display()
            );
        }
        // Nodes as big as the whole model: the planner only balances the layers by bytes.
        let req = PlanRequest {
            node_ram: Some(costs.file_bytes()),
            budget: Budget::Weights,
            nodes: Some(args.nodes),
            node_list: Vec::new(),
            replicas: 1,
            disk_paged: false,
            kv_tokens: 0,
        };
        let p = plan(&costs, &req).context("planning the layer ranges")?;
        let id = p.model_id.clone();
        (p, id)
    };
    if p.nodes.len() != args.nodes as usize {
        bail!(
            "the plan has {} node(s), not {}: {}",
            p.nodes.len(),
            args.nodes,
            p.why
        );
    }
    let bin = station_bin(args.station_bin.as_deref())?;
    let dir = std::env::temp_dir().join(format!("moonshine-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut fleet = Fleet {
        procs: Vec::new(),
        dir: dir.clone(),
    };
    // From the exit back, so each station can be told its successor (`--route-to`): the
    // gateway then sends one POST /chain per token into the entry and the stations pass the
    // residual along themselves.
    let mut stations = Vec::new();
    let mut next: Option<String> = None;
    for (i, node) in p.nodes.iter().enumerate().rev() {
        let mut cmd = Command::new(&bin);
        cmd.arg("--knot").arg(&model);
        if let Some(role) = role_flag(node.role) {
            cmd.args(["--role", role, "--layers", &node.layers.to_string()]);
        }
        if let Some(n) = &next {
            cmd.args(["--route-to", n]);
        }
        // Errors only from the stations: their access lines would bury the gateway's.
        cmd.args([
            "--listen",
            "127.0.0.1:0",
            "--node-id",
            &format!("up-{i}"),
            "-q",
        ]);
        cmd.args(&args.station_arg);
        let url = start(&mut fleet, format!("station {i}"), &mut cmd)?;
        eprintln!("moonshine up: station {i} {url} layers {}", node.layers);
        stations.push(serde_json::json!({
            "url": url,
            "layers": format!("{}-{}", node.layers.start, node.layers.end),
        }));
        next = Some(url);
    }
    stations.reverse();
    let mesh = dir.join("mesh.json");
    let body = serde_json::json!({"model": model_id, "stations": stations});
    std::fs::write(&mesh, body.to_string())
        .with_context(|| format!("writing {}", mesh.display()))?;
    let me = std::env::current_exe().context("this executable's path")?;
    let mut gw = Command::new(me);
    gw.arg("serve")
        .arg("--mesh")
        .arg(&mesh)
        .args([
            "--host",
            &args.host.to_string(),
            "--port",
            &args.port.to_string(),
        ])
        .args(&args.serve_arg);
    let url = start(&mut fleet, "the gateway".into(), &mut gw)?;
    println!(
        "moonshine up: {url}/ ({} station(s), model {model_id}; Ctrl-C stops them all)",
        args.nodes
    );
    let why = wait(&mut fleet)?;
    eprintln!("moonshine up: {why}: stopping");
    fleet.stop(Duration::from_secs(5));
    Ok(if why.starts_with("got") {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// Waits for SIGINT/SIGTERM/SIGHUP (`got ...`) or a process of the fleet exiting.
fn wait(fleet: &mut Fleet) -> Result<String> {
    use tokio::signal::unix::{signal, SignalKind};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = int.recv() => return Ok("got SIGINT".to_string()),
                _ = term.recv() => return Ok("got SIGTERM".to_string()),
                _ = hup.recv() => return Ok("got SIGHUP".to_string()),
                _ = tick.tick() => {
                    if let Some(why) = fleet.exited() {
                        return Ok(why);
                    }
                }
            }
        }
    })
}
