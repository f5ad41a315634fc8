//! Which stations to drive: the `--station` / `--mesh` / `--discover` flags that the command
//! line and `moonshine serve` share, and the chain they connect to.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

use crate::generate::{Backend, Target};

/// Which stations to drive.
#[derive(clap::Args, Debug, Clone)]
pub struct TargetArgs {
    /// One station serving every layer (`http://HOST:PORT`, or `HOST:PORT`).
    #[arg(long, default_value = "http://127.0.0.1:8080", conflicts_with = "mesh",
          value_parser = station_wire::client::station_url)]
    pub station: String,
    /// A mesh file: `{"model": .., "stations": [{"url": .., "layers": "a-b"}, ..]}` in layer
    /// order; the first station embeds (and tokenizes), the last runs the LM head.
    #[arg(long)]
    pub mesh: Option<PathBuf>,
    /// Build the chain from stations heard on their UDP beacons (`fat-station --beacon`)
    /// instead of a mesh file.
    #[arg(long, conflicts_with = "mesh")]
    pub discover: bool,
    /// UDP address to hear beacons on, with --discover.
    #[arg(long, default_value_t = std::net::SocketAddr::from(([0, 0, 0, 0], station_wire::beacon::DEFAULT_PORT)))]
    pub discover_listen: std::net::SocketAddr,
    /// Seconds to listen for beacons, with --discover.
    #[arg(long, default_value_t = 2.0)]
    pub discover_timeout: f64,
    /// Seconds one station call may take.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Drive every hop from here (`/embed`, `/forward` per station, `/lm-head`: the logits
    /// of every token cross this link) instead of one `POST /chain` per token into the
    /// chain's entry. For comparison and for stations that may not forward to each other.
    #[arg(long)]
    pub per_hop: bool,
}

impl TargetArgs {
    /// The chain to connect to.
    pub fn target(&self) -> Target {
        match (&self.mesh, self.discover) {
            (Some(m), _) => Target::Mesh(m.clone()),
            (None, true) => Target::Discover {
                listen: self.discover_listen,
                wait: Duration::from_secs_f64(self.discover_timeout.clamp(0.01, 600.0)),
            },
            (None, false) => Target::Station(self.station.clone()),
        }
    }

    /// Connects to the chain. No context added: every error names the station's URL, the
    /// mesh file or the discovery address itself.
    pub fn connect(&self) -> Result<Backend> {
        let b = Backend::connect(&self.target(), Duration::from_secs(self.timeout))?;
        if self.per_hop {
            b.chain.set_relay(false);
        }
        Ok(b)
    }
}
