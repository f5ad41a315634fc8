//! Where a station keeps its weights: packed into interleaved copies (the fast kernels;
//! anonymous memory) or in the mapped file (the block kernels; pages the OS can drop and read
//! back). Same bits either way.
//!
//! Why it matters: without swap, as on the devices, anonymous memory cannot be evicted, so a
//! node whose memory limit is below its packed weights is killed by the OOM killer, while the
//! same node reading the mapped file keeps answering, paging the weights from storage
//! (slower: `scripts/bench/paged-bench.sh`). `auto` packs only when the copies fit.

use std::path::Path;

/// `--pack-weights`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum PackWeights {
    /// Pack when the packable weights plus [`RESERVE`] fit this process's memory budget
    /// (its cgroup's limit and the system's available memory).
    #[default]
    Auto,
    /// Always pack (fastest; needs the memory).
    Always,
    /// Never pack: weights stay in the mapped file (paged mode).
    Never,
}

/// Memory left beside the packed weights for KV caches, scratch and the runtime.
pub const RESERVE: u64 = 256 << 20;

/// In paged mode, memory left unpinned: KV caches, scratch, the runtime and the page cache
/// the unpinned weights stream through.
pub const PAGED_RESERVE: u64 = 128 << 20;

impl PackWeights {
    /// Whether to pack `packable` bytes of weights, given the memory `budget` (None: unknown,
    /// treated as enough).
    pub fn decide(self, packable: u64, budget: Option<u64>) -> bool {
        match self {
            PackWeights::Always => true,
            PackWeights::Never => false,
            PackWeights::Auto => budget.is_none_or(|b| packable.saturating_add(RESERVE) <= b),
        }
    }
}

/// This process's memory budget: the smaller of its memory cgroup's limit (v2 `memory.max`
/// or v1 `memory.limit_in_bytes`) and the system's `MemAvailable`; `None` when neither can
/// be read.
pub fn memory_budget() -> Option<u64> {
    let cgroup = cgroup_memory_limit();
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_available(&m));
    match (cgroup, available) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// This process's memory cgroup limit, `None` when unlimited or unknown.
pub fn cgroup_memory_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|c| cgroup_limit(&c, Path::new("/sys/fs/cgroup")))
}

/// The memory limit of the cgroup named in `proc_cgroup` (the text of /proc/self/cgroup)
/// under the cgroup mount `root`; `None` when unlimited or unreadable.
fn cgroup_limit(proc_cgroup: &str, root: &Path) -> Option<u64> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        let file = if controllers.is_empty() {
            root.join(rel).join("memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            root.join("memory").join(rel).join("memory.limit_in_bytes")
        } else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        // v2 says "max"; v1 says a page-rounded i64::MAX when unlimited.
        return text.trim().parse::<u64>().ok().filter(|&v| v < (1 << 60));
    }
    None
}

/// `MemAvailable` of /proc/meminfo's text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_packs_only_what_fits_beside_the_reserve() {
        let gib = 1u64 << 30;
        assert!(PackWeights::Auto.decide(2 * gib, Some(3 * gib)));
        assert!(!PackWeights::Auto.decide(3 * gib, Some(3 * gib)));
        assert!(PackWeights::Auto.decide(3 * gib, None));
        assert!(PackWeights::Always.decide(3 * gib, Some(gib)));
        assert!(!PackWeights::Never.decide(0, None));
    }

    #[test]
    fn reads_v1_and_v2_limits_and_ignores_unlimited() {
        let root = tempfile::tempdir().expect("tempdir");
        let v2 = root.path().join("user.slice/node0");
        std::fs::create_dir_all(&v2).expect("mkdir");
        std::fs::write(v2.join("memory.max"), "3167748096\n").expect("write");
        assert_eq!(
            cgroup_limit("0::/user.slice/node0\n", root.path()),
            Some(3_167_748_096)
        );
        std::fs::write(v2.join("memory.max"), "max\n").expect("write");
        assert_eq!(cgroup_limit("0::/user.slice/node0\n", root.path()), None);

        let v1 = root.path().join("memory/r1/node1");
        std::fs::create_dir_all(&v1).expect("mkdir");
        std::fs::write(v1.join("memory.limit_in_bytes"), "419430400\n").expect("write");
        let text = "12:cpu,cpuacct:/r1/node1\n4:memory:/r1/node1\n";
        assert_eq!(cgroup_limit(text, root.path()), Some(419_430_400));
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").expect("write");
        assert_eq!(cgroup_limit(text, root.path()), None);
        assert_eq!(cgroup_limit("garbage", root.path()), None);
    }

    #[test]
    fn reads_mem_available() {
        let m = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:    2880000 kB\n";
        assert_eq!(mem_available(m), Some(2_880_000 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
    }
}
