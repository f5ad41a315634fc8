//! The wall around a sliver (issue 32.5), tried from inside as an attacker would: the command
//! calls unshare(NEWUSER|NEWNS|NEWCGROUP) to mount the cgroup hierarchies and lift its own
//! `--pids` / `--mem` limits (or reach the host's tree through cgroup2), then forks past the
//! limit. Busybox applets only (`unshare`, whose busybox has no `-C`, and `mount`); the
//! CLONE_NEWCGROUP flag itself is tried in sandbox-wall's unit tests.

mod common;

use std::time::Duration;

use common::{field, have_root, rootfs, run_bounded, text, Node};

/// Issue 32.5: a sliver called unshare(NEWUSER|NEWNS|NEWCGROUP), mounted the cgroup v1 `pids`
/// (or `memory`) hierarchy, wrote `max` to its own limits and forked 100 processes past
/// `--pids 20`; it had no cgroup namespace of its own.
#[test]
fn a_sliver_cannot_make_namespaces_nor_lift_its_cgroup_limits() {
    if !have_root("a_sliver_cannot_make_namespaces_nor_lift_its_cgroup_limits") {
        return;
    }
    let node = Node::admit("scratch", rootfs());
    let script = "unshare -U -m true 2>/tmp/err; echo UNSHARE=$?; echo UNSHARE_ERR=$(cat /tmp/err); \
        unshare -U -r -m sh -c 'mkdir -p /tmp/c && mount -t cgroup -o pids none /tmp/c && echo max > /tmp/c/pids.max && echo RAISED' 2>/dev/null; \
        mkdir -p /tmp/c; \
        for fs in 'cgroup -o pids' 'cgroup -o memory' cgroup2; do mount -t $fs none /tmp/c 2>/dev/null && echo MOUNTED $fs; done; \
        echo CGROUPFS=$(ls /sys/fs/cgroup 2>/dev/null | wc -l); \
        echo CG=$(cut -d: -f3 /proc/self/cgroup | sort -u); \
        (i=0; while [ $i -lt 100 ]; do sleep 5 & i=$((i+1)); done) 2>/dev/null; \
        set -- /proc/[0-9]*; echo PROCS=$#";
    let out = run_bounded(
        node.cmd(&[
            "cline",
            "base:scratch",
            "--pids",
            "20",
            "--mem",
            "64M",
            "--",
            "sh",
            "-c",
            script,
        ]),
        Duration::from_secs(60),
    );
    let so = text(&out.stdout);
    let all = format!("{so}\n{}", text(&out.stderr));
    assert!(out.status.success(), "{all}");
    assert_eq!(field(&so, "UNSHARE"), "1", "unshare was allowed: {all}");
    assert!(
        field(&so, "UNSHARE_ERR").contains("Operation not permitted"),
        "{all}"
    );
    assert!(
        !so.contains("RAISED") && !so.contains("MOUNTED"),
        "a cgroup hierarchy was mounted: {all}"
    );
    assert_eq!(field(&so, "CGROUPFS"), "0", "a cgroupfs is in view: {all}");
    // Its own cgroup namespace: in every hierarchy its cgroup is the root of what it sees.
    assert_eq!(field(&so, "CG"), "/", "the host's cgroup paths show: {all}");
    // The fork loop runs in a subshell (ash exits at the first refused fork); counted with
    // builtins, since at the limit a command substitution cannot fork.
    let procs: usize = field(&so, "PROCS").parse().unwrap();
    assert!(procs <= 20, "{procs} processes despite --pids 20: {all}");
}
