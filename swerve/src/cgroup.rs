//! Per-sliver cgroups: v1 controllers where mounted (this machine kind is a v1 hybrid), else the
//! v2 unified hierarchy when it offers the controller. The sliver's cgroup is created under
//! swerve's own cgroup (from `/proc/self/cgroup`), so the host's limits still apply above it.
//!
//! The limits are written on `swerve-<name>`; the sliver's processes live in its child
//! `swerve-<name>/sliver`, which becomes the root of the sliver's cgroup namespace: the cgroup
//! whose limits bind it is outside anything it could name or mount.

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Result, SwerveError};

/// The sliver's cgroup directories (one per v1 controller, or one v2 directory).
#[derive(Debug, Default)]
pub struct Cgroups {
    /// Every directory made, parents before their children (removed in reverse).
    dirs: Vec<PathBuf>,
    /// The `sliver` child of each limited directory: where the processes go.
    leaves: Vec<PathBuf>,
}

/// The child of each limited cgroup that holds the sliver's processes.
const LEAF: &str = "sliver";

struct Mount {
    point: PathBuf,
    root: String,
    fstype: String,
    superopts: String,
}

fn mounts() -> Vec<Mount> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            Some(Mount {
                root: pre.get(3)?.to_string(),
                point: PathBuf::from(pre.get(4)?),
                fstype: post.first()?.to_string(),
                superopts: post.get(2).unwrap_or(&"").to_string(),
            })
        })
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect()
}

/// swerve's own cgroup path for a v1 controller (`Some(ctrl)`) or v2 (`None`).
fn own_path(controller: Option<&str>) -> String {
    let text = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for l in text.lines() {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next(), it.next().unwrap_or(""), it.next().unwrap_or("/"));
        let hit = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        if hit {
            return path.to_string();
        }
    }
    "/".to_string()
}

fn join(m: &Mount, own: &str) -> PathBuf {
    let rel = if m.root == "/" {
        own
    } else {
        own.strip_prefix(m.root.as_str()).unwrap_or("/")
    };
    m.point.join(rel.trim_start_matches('/'))
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|e| SwerveError::io("write cgroup file", path, e))
}

impl Cgroups {
    /// Creates `swerve-<name>` for the requested limits. A pids limit that cannot be enforced is
    /// an error (root ignores RLIMIT_NPROC, so nothing else would bound a fork bomb); a memory
    /// limit that cannot be set is a warning (RLIMIT_DATA still applies).
    pub fn create(name: &str, pids: Option<u64>, mem: Option<u64>) -> Result<Cgroups> {
        let mounts = mounts();
        let mut cg = Cgroups::default();
        let leaf = format!("swerve-{name}");
        let v1 = |ctrl: &str| {
            mounts
                .iter()
                .find(|m| m.fstype == "cgroup" && m.superopts.split(',').any(|o| o == ctrl))
        };
        let v2 = mounts.iter().find(|m| m.fstype == "cgroup2");
        let v2_has = |ctrl: &str| {
            v2.map(|m| {
                let dir = join(m, &own_path(None));
                fs::read_to_string(dir.join("cgroup.controllers"))
                    .map(|s| s.split_whitespace().any(|c| c == ctrl))
                    .unwrap_or(false)
            })
            .unwrap_or(false)
        };
        let mut v2_dir: Option<PathBuf> = None;
        let mut v2_dir_for = |ctrl: &str, cg: &mut Cgroups| -> Result<PathBuf> {
            let m = v2.ok_or_else(|| SwerveError::StepOther {
                step: format!("cgroup {ctrl}"),
                reason: "no cgroup mount offers this controller".into(),
            })?;
            let parent = join(m, &own_path(None));
            write(&parent.join("cgroup.subtree_control"), &format!("+{ctrl}"))?;
            if v2_dir.is_none() {
                let d = parent.join(&leaf);
                fs::create_dir(&d).map_err(|e| SwerveError::io("create cgroup", &d, e))?;
                cg.dirs.push(d.clone());
                v2_dir = Some(d);
            }
            Ok(v2_dir.clone().unwrap_or_default())
        };

        if let Some(p) = pids {
            let r: Result<()> = (|| {
                let dir = if let Some(m) = v1("pids") {
                    let d = join(m, &own_path(Some("pids"))).join(&leaf);
                    fs::create_dir(&d).map_err(|e| SwerveError::io("create cgroup", &d, e))?;
                    cg.dirs.push(d.clone());
                    d
                } else if v2_has("pids") {
                    v2_dir_for("pids", &mut cg)?
                } else {
                    return Err(SwerveError::StepOther {
                        step: "cgroup pids".into(),
                        reason: "the host has no pids controller".into(),
                    });
                };
                write(&dir.join("pids.max"), &p.to_string())
            })();
            if let Err(e) = r {
                cg.remove();
                return Err(SwerveError::StepOther {
                    step: format!("--pids {p}"),
                    reason: format!("{e} (RLIMIT_NPROC is per user and root ignores it, so only a pids cgroup bounds a fork bomb)"),
                });
            }
        }
        if let Some(m) = mem {
            let r: Result<()> = (|| {
                if let Some(mt) = v1("memory") {
                    let d = join(mt, &own_path(Some("memory"))).join(&leaf);
                    fs::create_dir(&d).map_err(|e| SwerveError::io("create cgroup", &d, e))?;
                    cg.dirs.push(d.clone());
                    write(&d.join("memory.limit_in_bytes"), &m.to_string())?;
                    // Cap swap too where the kernel accounts it; absent without swap accounting.
                    let _ = fs::write(d.join("memory.memsw.limit_in_bytes"), m.to_string());
                    Ok(())
                } else if v2_has("memory") {
                    let d = v2_dir_for("memory", &mut cg)?;
                    write(&d.join("memory.max"), &m.to_string())?;
                    let _ = fs::write(d.join("memory.swap.max"), "0");
                    Ok(())
                } else {
                    Err(SwerveError::StepOther {
                        step: "cgroup memory".into(),
                        reason: "the host has no memory controller".into(),
                    })
                }
            })();
            if let Err(e) = r {
                tracing::warn!("--mem: no memory cgroup ({e}); only RLIMIT_DATA applies");
            }
        }
        for d in cg.dirs.clone() {
            let leaf = d.join(LEAF);
            if let Err(e) = fs::create_dir(&leaf) {
                cg.remove();
                return Err(SwerveError::io("create cgroup", &leaf, e));
            }
            cg.dirs.push(leaf.clone());
            cg.leaves.push(leaf);
        }
        Ok(cg)
    }

    /// Moves `pid` into the `sliver` child of every limited directory.
    pub fn attach(&self, pid: i32) -> Result<()> {
        for d in &self.leaves {
            write(&d.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// How often the pids limit refused a fork (from `pids.events`), where the host reports it
    /// (older kernels count on the forking task's cgroup, newer ones on the limited one).
    pub fn pids_max_hits(&self) -> Option<u64> {
        self.dirs
            .iter()
            .filter_map(|d| {
                let text = fs::read_to_string(d.join("pids.events")).ok()?;
                text.lines()
                    .find_map(|l| l.strip_prefix("max "))
                    .and_then(|n| n.trim().parse().ok())
            })
            .max()
    }

    /// The directories, parents before children (for logs and tests).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Removes the directories (retrying briefly while the last processes exit).
    pub fn remove(&mut self) {
        for d in self.dirs.drain(..).rev() {
            let mut ok = false;
            for _ in 0..50 {
                match fs::remove_dir(&d) {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        ok = true;
                        break;
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
                }
            }
            if !ok {
                tracing::warn!("could not remove cgroup {}", d.display());
            }
        }
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.remove();
    }
}
