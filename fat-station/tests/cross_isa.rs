//! Cross-ISA bit identity on the real Qwen: a chain of an x86 station (this build) and an
//! aarch64 station (the cross build, under `qemu-aarch64 -cpu cortex-a53`: plain NEON, the
//! R1's cores) gives exactly the logits of one x86 process, for a prompt and a few greedy
//! decode steps, with the aarch64 station as the exit and then as the entry. The same for the
//! recurrent layers on tiny synthetic hybrids (Mamba's and Mamba2's scans, LFM2's short
//! convolution, Qwen3.5's Gated DeltaNet): their state carried across the split and the steps.
//!
//! Needs `qemu-aarch64` (Debian qemu-user) and the aarch64 fat-station
//! (`scripts/cross/build-aarch64.sh -p fat-station`, or `$AEON_ARM64_STATION_BIN`); without
//! them the test prints why on stderr and passes, unless `AEON_REQUIRE_CROSS=1` (then it
//! fails). scripts/test.sh runs it that way right after the cross build.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use fat_station::client::{Chain, StationClient, StepTrace};
use fat_station::engine::Model;
use knot_format::{Knot, LayerRange};
use support::*;

/// "The capital of France is" in Qwen2.5's vocabulary.
const PROMPT: [u32; 5] = [785, 6722, 315, 9625, 374];
/// Greedy steps decoded through the chain after the prompt.
const DECODE: usize = 3;

/// The aarch64 station binary and the qemu to run it with, or why the test cannot run.
fn cross_tools() -> Result<(PathBuf, PathBuf), String> {
    let given = std::env::var_os("AEON_ARM64_STATION_BIN").map(PathBuf::from);
    let bin = given.clone().unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../target/aarch64-unknown-linux-musl/release/fat-station")
    });
    if !bin.is_file() {
        return Err(format!(
            "no aarch64 fat-station at {} (scripts/cross/build-aarch64.sh -p fat-station)",
            bin.display()
        ));
    }
    // The cross build left from an earlier checkout is not this code: a station that refuses
    // today's files would fail the test for nothing (scripts/test.sh builds it anew after
    // the workspace's tests and runs this test again then).
    if given.is_none() {
        if let Some(newer) = source_newer_than(&bin) {
            return Err(format!(
                "the aarch64 fat-station at {} predates its source {} \
                 (scripts/cross/build-aarch64.sh -p fat-station)",
                bin.display(),
                newer.display()
            ));
        }
    }
    let qemu = ["qemu-aarch64", "qemu-aarch64-static"]
        .iter()
        .find_map(|q| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join(q))
                    .find(|f| f.is_file())
            })
        })
        .ok_or("qemu-aarch64 not found (Debian: apt-get install qemu-user)")?;
    Ok((bin, qemu))
}

/// A source file that changed after `bin` was built, by the list of sources cargo wrote
/// beside it (`BIN.d`, copied there by build-aarch64.sh; a Makefile rule, spaces escaped as
/// `\ `); `None` when none did or there is no list to tell by.
fn source_newer_than(bin: &Path) -> Option<PathBuf> {
    let built = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let bin_time = built(bin)?;
    let mut rule = bin.as_os_str().to_owned();
    rule.push(".d");
    let rule = std::fs::read_to_string(rule).ok()?;
    let (_, sources) = rule.lines().next()?.split_once(": ")?;
    sources
        .replace("\\ ", "\0")
        .split_whitespace()
        .map(|s| PathBuf::from(s.replace('\0', " ")))
        .find(|s| built(s).is_none_or(|t| t > bin_time))
}

/// Greedy logits of the prompt and `DECODE` steps through `chain` in one session.
fn run_chain(chain: &Chain, session: &str) -> Vec<Vec<f32>> {
    run_chain_on(chain, session, &PROMPT)
}

/// Greedy logits of `prompt` and `DECODE` steps through `chain` in one session.
fn run_chain_on(chain: &Chain, session: &str, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut trace = StepTrace::default();
    let mut out = vec![chain
        .step(prompt, Some((session, 0)), &mut trace)
        .expect("prefill through the chain")];
    for i in 0..DECODE {
        let next = argmax(&out[i]) as u32;
        let pos = prompt.len() + i;
        out.push(
            chain
                .step(&[next], Some((session, pos)), &mut trace)
                .expect("decode through the chain"),
        );
    }
    out
}

/// The aarch64 tools, or `None` (skip, with the reason on stderr) unless `AEON_REQUIRE_CROSS=1`.
fn cross_tools_or_skip(what: &str) -> Option<(PathBuf, PathBuf)> {
    match cross_tools() {
        Ok(t) => Some(t),
        Err(why) if std::env::var("AEON_REQUIRE_CROSS").as_deref() == Ok("1") => {
            panic!("AEON_REQUIRE_CROSS=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIP {what}: {why}");
            None
        }
    }
}

/// Each tiny hybrid (preset, blocks, cut): an x86 station and an aarch64 one, split at `cut`
/// so that recurrent blocks sit on both sides, in both orders, give one x86 process's logits
/// bit for bit for a 12-token prompt (the scans' chunked prefill) and 3 greedy steps (their
/// token-by-token update).
#[test]
fn recurrent_layers_on_aarch64_give_x86_bits() {
    let Some((arm_bin, qemu)) = cross_tools_or_skip("cross-ISA recurrences") else {
        return;
    };
    const HYBRIDS: [(&str, u32, u32); 5] = [
        ("mamba-tiny", 3, 1),
        ("mamba2-tiny", 3, 2),
        ("granitehybrid-tiny", 4, 2),
        ("lfm2-tiny", 5, 3),
        ("qwen35-tiny", 4, 2),
    ];
    let prompt = [
        785, 6722, 315, 9625, 374, 12095, 13, 576, 6722, 315, 9856, 374,
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for (preset, blocks, cut) in HYBRIDS {
        let Some((_, path)) = test_support::synthetic_model(dir.path(), preset, &[]) else {
            return;
        };
        let knot = Knot::open(&path).expect("open");
        assert_eq!(knot.arch().n_layers, blocks, "{preset}");
        let m = Model::load(&knot, None).expect("load");
        let mut s = m.new_session(64);
        let mut want = vec![m.logits(&mut s, &prompt).expect("prefill")];
        for i in 0..DECODE {
            let next = argmax(&want[i]) as u32;
            want.push(m.logits(&mut s, &[next]).expect("decode"));
        }
        let knot_arg = path.to_str().expect("utf-8 model path");
        let x86 = spawn_station(&["--knot", knot_arg, "--listen", "127.0.0.1:0"]);
        let arm = spawn_url(
            Command::new(&qemu)
                .args(["-cpu", "cortex-a53"])
                .arg(&arm_bin)
                .args(["--knot", knot_arg, "--listen", "127.0.0.1:0"]),
        );
        let client = |url: &str| StationClient::new(url, Duration::from_secs(600));
        let (first, second) = (LayerRange::new(0, cut), LayerRange::new(cut, blocks));
        for (order, session, hops) in [
            (
                "x86 -> aarch64",
                "x86-arm",
                vec![(client(&x86.url), first), (client(&arm.url), second)],
            ),
            (
                "aarch64 -> x86",
                "arm-x86",
                vec![(client(&arm.url), first), (client(&x86.url), second)],
            ),
        ] {
            let chain = Chain::new(hops).expect("chain");
            let got = run_chain_on(&chain, &format!("{session}-{blocks}-{cut}"), &prompt);
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                let (rms, max) = rms_max(g, w);
                assert!(
                    bits(g) == bits(w),
                    "{preset} {order}, step {step}: logits differ from one x86 process \
                     (rms {rms:e}, max {max:e})"
                );
            }
            eprintln!(
                "{preset} {order} at block {cut}: {} steps bit-identical",
                got.len()
            );
        }
    }
}

#[test]
fn x86_and_aarch64_stations_chained_give_one_x86_process_bits() {
    let Some(path) = model(QWEN) else { return };
    let (arm_bin, qemu) = match cross_tools() {
        Ok(t) => t,
        Err(why) if std::env::var("AEON_REQUIRE_CROSS").as_deref() == Ok("1") => {
            panic!("AEON_REQUIRE_CROSS=1 but {why}")
        }
        Err(why) => {
            eprintln!("SKIP cross-ISA chain: {why}");
            return;
        }
    };

    // Reference: one x86 process (this test's own engine), greedy.
    let knot = Knot::open(&path).expect("open qwen");
    let m = Model::load(&knot, None).expect("load qwen");
    let mut s = m.new_session(64);
    let mut want = vec![m.logits(&mut s, &PROMPT).expect("prefill")];
    for i in 0..DECODE {
        let next = argmax(&want[i]) as u32;
        want.push(m.logits(&mut s, &[next]).expect("decode"));
    }
    assert_eq!(
        argmax(&want[0]),
        12095,
        "the reference starts with \" Paris\""
    );

    let knot_arg = path.to_str().expect("utf-8 model path");
    let x86 = spawn_station(&["--knot", knot_arg, "--listen", "127.0.0.1:0"]);
    let arm = spawn_url(
        Command::new(&qemu)
            .args(["-cpu", "cortex-a53"])
            .arg(&arm_bin)
            .args(["--knot", knot_arg, "--listen", "127.0.0.1:0"]),
    );
    // qemu runs the aarch64 station some 10-30x slower than native.
    let client = |url: &str| StationClient::new(url, Duration::from_secs(600));
    let health = client(&arm.url).health().expect("aarch64 station health");
    eprintln!("aarch64 station: {health:?}");

    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let (first, second) = (LayerRange::new(0, 12), LayerRange::new(12, 24));
    for (name, session, hops) in [
        (
            "x86 0-12 -> aarch64 12-24 + head",
            "x86-arm",
            vec![(client(&x86.url), first), (client(&arm.url), second)],
        ),
        (
            "aarch64 embed + 0-12 -> x86 12-24 + head",
            "arm-x86",
            vec![(client(&arm.url), first), (client(&x86.url), second)],
        ),
    ] {
        let chain = Chain::new(hops).expect("chain");
        let got = run_chain(&chain, session);
        for (step, (g, w)) in got.iter().zip(&want).enumerate() {
            let (rms, max) = rms_max(g, w);
            assert!(
                bits(g) == bits(w),
                "{name}, step {step}: logits differ from one x86 process (rms {rms:e}, max {max:e})"
            );
        }
        eprintln!("{name}: {} steps bit-identical", got.len());
    }
}
