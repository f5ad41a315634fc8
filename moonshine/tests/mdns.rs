//! Stations announce themselves over mDNS / DNS-SD (`fat-station --mdns`): inside a network
//! namespace of its own (`unshare -n`, loopback up with multicast and a 224.0.0.0/4 route, so
//! no other host's traffic gets in or out), two stations announce `_aeon-station._tcp`, and
//! python-zeroconf (a client that is not ours) and `moonshine mesh ls` both find them with
//! their TXT records (role, layers, model hash, URL).
//!
//! Needs root for `unshare -n` and PyPI `zeroconf` (scripts/test.sh installs it and sets
//! AEON_REQUIRE_ZEROCONF=1): otherwise the test skips with a line. Model: SmolLM2-135M
//! (test-support's model rule).

mod support;

use std::process::Command;

use serde_json::Value;
use support::*;

const BROWSE: &str = r#"
import json, sys, time
from zeroconf import ServiceBrowser, ServiceListener, Zeroconf

found = {}

class Listener(ServiceListener):
    def add_service(self, zc, type_, name):
        info = zc.get_service_info(type_, name, timeout=3000)
        if info:
            found[name] = {
                "port": info.port,
                "addresses": info.parsed_addresses(),
                "txt": {k.decode(): (v or b"").decode() for k, v in info.properties.items()},
            }

    update_service = add_service

    def remove_service(self, zc, type_, name):
        found.pop(name, None)

zc = Zeroconf(interfaces=["127.0.0.1"])
ServiceBrowser(zc, "_aeon-station._tcp.local.", Listener())
end = time.time() + 8
while time.time() < end and len(found) < 2:
    time.sleep(0.1)
zc.close()
print(json.dumps(found))
"#;

const NETNS: &str = r#"
set -e
ip link set lo up
ip link set lo multicast on
ip route add 224.0.0.0/4 dev lo
"$STATION" --knot "$KNOT" --role entry --layers 0..15 --listen 127.0.0.1:0 --mdns --node-id n-entry > "$DIR/s1.out" 2> "$DIR/s1.err" &
s1=$!
"$STATION" --knot "$KNOT" --role exit --layers 15..30 --listen 127.0.0.1:0 --mdns --node-id n-exit > "$DIR/s2.out" 2> "$DIR/s2.err" &
s2=$!
for _ in $(seq 200); do
  grep -q http "$DIR/s1.out" && grep -q http "$DIR/s2.out" && break
  sleep 0.05
done
python3 "$DIR/browse.py" > "$DIR/zeroconf.json"
"$MOONSHINE" mesh ls --json --timeout 3 > "$DIR/ls.json"
kill $s1 $s2
wait $s1 $s2 || true
"#;

fn require() -> bool {
    std::env::var("AEON_REQUIRE_ZEROCONF").as_deref() == Ok("1")
}

fn skip(why: &str) {
    assert!(!require(), "AEON_REQUIRE_ZEROCONF=1 but {why}");
    eprintln!("skipping: {why}");
}

#[test]
fn zeroconf_and_mesh_ls_find_the_stations_in_a_network_namespace() {
    let (Some(knot), Some(bin)) = (test_support::model(test_support::SMOLLM2), station_bin())
    else {
        return;
    };
    let has = |cmd: &mut Command| cmd.output().map(|o| o.status.success()).unwrap_or(false);
    if !has(Command::new("python3").args(["-c", "import zeroconf"])) {
        return skip("python3 has no zeroconf (pip install zeroconf)");
    }
    if !has(Command::new("unshare").args(["-n", "true"])) {
        return skip("unshare -n failed (needs root)");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("browse.py"), BROWSE).expect("write browse.py");
    let out = Command::new("unshare")
        .args(["-n", "bash", "-c", NETNS])
        .env("STATION", &bin)
        .env("KNOT", &knot)
        .env("MOONSHINE", env!("CARGO_BIN_EXE_moonshine"))
        .env("DIR", dir.path())
        .output()
        .expect("unshare");
    let read = |n: &str| std::fs::read_to_string(dir.path().join(n)).unwrap_or_default();
    assert!(
        out.status.success(),
        "netns script: {}\n{}\nstation: {}{}",
        String::from_utf8_lossy(&out.stderr),
        read("ls.json"),
        read("s1.err"),
        read("s2.err")
    );
    let url = |f: &str| {
        read(f)
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{f}: no URL"))
    };
    let (u1, u2) = (url("s1.out"), url("s2.out"));

    // python-zeroconf: both instances, resolved to loopback and the stations' ports.
    let zc: Value = serde_json::from_str(&read("zeroconf.json")).expect("zeroconf JSON");
    eprintln!("zeroconf found: {zc}");
    let zc = zc.as_object().expect("object");
    assert_eq!(zc.len(), 2, "{zc:?}");
    let by_role = |role: &str| {
        zc.values()
            .find(|v| v["txt"]["role"] == role)
            .unwrap_or_else(|| panic!("no {role} in {zc:?}"))
    };
    let (entry, exit) = (by_role("entry"), by_role("exit"));
    assert_eq!(entry["txt"]["layers"], "0-15");
    assert_eq!(exit["txt"]["layers"], "15-30");
    assert_eq!(entry["txt"]["url"], u1.as_str());
    assert_eq!(exit["txt"]["url"], u2.as_str());
    assert!(
        u1.ends_with(&format!(":{}", entry["port"])),
        "{u1} vs {entry}"
    );
    assert_eq!(entry["addresses"][0], "127.0.0.1");
    let hash = entry["txt"]["hash"].as_str().expect("hash");
    assert!(hash.len() >= 16, "{hash}");
    assert_eq!(exit["txt"]["hash"], hash, "one model");
    assert_eq!(entry["txt"]["proto"], "aeon-mesh/1");

    // moonshine mesh ls: the same two, the same records.
    let ls: Value = serde_json::from_str(&read("ls.json")).expect("ls JSON");
    let ls = ls.as_array().expect("array");
    assert_eq!(ls.len(), 2, "{ls:?}");
    let urls: Vec<&str> = ls
        .iter()
        .map(|f| f["txt"]["url"].as_str().unwrap_or(""))
        .collect();
    assert!(
        urls.contains(&u1.as_str()) && urls.contains(&u2.as_str()),
        "{urls:?}"
    );
    assert!(ls.iter().all(|f| f["txt"]["hash"] == hash));
}
