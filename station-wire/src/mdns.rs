//! mDNS / DNS-SD: stations announce themselves as `_aeon-station._tcp.local.` (RFC 6762/6763,
//! through the `mdns-sd` crate), so `avahi-browse`, a Python zeroconf client or
//! `moonshine mesh ls` see them. It stands beside the UDP beacon ([`crate::beacon`]), which
//! the elector still forms chains from; the TXT records carry the same facts.
//!
//! TXT keys: `proto` (`aeon-mesh/1`), `node`, `model` (id), `hash` (the model's header hash),
//! `role`, `layers` (`a-b`), `n_layers`, `url`, `mesh` (`open`/`sealed`), `chain` (when
//! planned into one).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use mdns_sd::{IfKind, ServiceDaemon, ServiceEvent, ServiceInfo};

use crate::beacon::Announcement;

/// The DNS-SD service type stations register.
pub const SERVICE_TYPE: &str = "_aeon-station._tcp.local.";

/// What can go wrong announcing or browsing.
#[derive(Debug, thiserror::Error)]
pub enum MdnsError {
    #[error("mDNS: {0}")]
    Daemon(#[from] mdns_sd::Error),
}

/// A running announcement; withdrawn (a goodbye packet) on drop.
pub struct Announcer {
    daemon: ServiceDaemon,
    fullname: String,
}

impl Drop for Announcer {
    fn drop(&mut self) {
        if let Ok(rx) = self.daemon.unregister(&self.fullname) {
            // The goodbye goes out before the daemon stops; not waiting longer than a moment.
            let _ = rx.recv_timeout(Duration::from_millis(500));
        }
        let _ = self.daemon.shutdown();
    }
}

/// A DNS label from `s`: letters, digits and `-`, at most 63 bytes.
fn label(s: &str) -> String {
    let l: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(40)
        .collect();
    if l.is_empty() {
        "station".into()
    } else {
        l
    }
}

/// The TXT records of `ann`.
pub fn txt(ann: &Announcement) -> HashMap<String, String> {
    let mut t = HashMap::from([
        ("proto".to_string(), ann.proto.clone()),
        ("node".into(), ann.node_id.clone()),
        ("model".into(), ann.model_id.clone()),
        ("hash".into(), ann.model_hash.clone()),
        ("role".into(), ann.role.clone()),
        ("layers".into(), ann.layers.clone()),
        ("n_layers".into(), ann.n_layers.to_string()),
        ("url".into(), ann.address.clone()),
        ("mesh".into(), ann.mesh.clone()),
    ]);
    if let Some(c) = ann.chain {
        t.insert("chain".into(), c.to_string());
    }
    t
}

impl Announcer {
    /// Registers the station listening on `ip:port` (all interfaces' addresses when `ip` is
    /// unspecified; the loopback interface too when it is a loopback address).
    pub fn spawn(ann: &Announcement, ip: IpAddr, port: u16) -> Result<Announcer, MdnsError> {
        let daemon = ServiceDaemon::new()?;
        if ip.is_loopback() {
            daemon.enable_interface(if ip.is_ipv4() {
                IfKind::LoopbackV4
            } else {
                IfKind::LoopbackV6
            })?;
        }
        let instance = format!("{}-{port}", label(&ann.node_id));
        let host = format!("{instance}.local.");
        let info = if ip.is_unspecified() {
            ServiceInfo::new(SERVICE_TYPE, &instance, &host, "", port, txt(ann))?.enable_addr_auto()
        } else {
            ServiceInfo::new(SERVICE_TYPE, &instance, &host, ip, port, txt(ann))?
        };
        let fullname = info.get_fullname().to_string();
        daemon.register(info)?;
        Ok(Announcer { daemon, fullname })
    }
}

/// One station found by [`browse`].
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Found {
    /// The DNS-SD instance name (`NODE-PORT._aeon-station._tcp.local.`).
    pub instance: String,
    /// The addresses it resolved to, and its port.
    pub addresses: Vec<IpAddr>,
    pub port: u16,
    /// Its TXT records.
    pub txt: HashMap<String, String>,
}

/// Listens for `wait` (with loopback included when `loopback`) and returns every station
/// resolved in that time, by instance name.
pub fn browse(wait: Duration, loopback: bool) -> Result<Vec<Found>, MdnsError> {
    let daemon = ServiceDaemon::new()?;
    if loopback {
        daemon.enable_interface(IfKind::LoopbackV4)?;
    }
    let rx = daemon.browse(SERVICE_TYPE)?;
    let t0 = Instant::now();
    let mut found: Vec<Found> = Vec::new();
    while let Some(left) = wait.checked_sub(t0.elapsed()) {
        let Ok(ev) = rx.recv_timeout(left) else { break };
        match ev {
            ServiceEvent::ServiceResolved(info) => {
                let mut addresses: Vec<IpAddr> = info.get_addresses().iter().copied().collect();
                addresses.sort();
                let f = Found {
                    instance: info.get_fullname().to_string(),
                    addresses,
                    port: info.get_port(),
                    txt: info
                        .get_properties()
                        .iter()
                        .map(|p| (p.key().to_string(), p.val_str().to_string()))
                        .collect(),
                };
                found.retain(|x| x.instance != f.instance);
                found.push(f);
            }
            ServiceEvent::ServiceRemoved(_, name) => found.retain(|x| x.instance != name),
            _ => {}
        }
    }
    let _ = daemon.shutdown();
    found.sort_by(|a, b| a.instance.cmp(&b.instance));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_dns_safe() {
        assert_eq!(label("up-0"), "up-0");
        assert_eq!(label("node 1/ä"), "node-1--");
        assert_eq!(label(""), "station");
    }
}
