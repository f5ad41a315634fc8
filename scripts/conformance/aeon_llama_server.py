"""pytest plugin: llama.cpp's server tests against fat-station + `moonshine serve`.

Loaded by scripts/conformance/llama-server-tests.sh (`pytest -p aeon_llama_server`) in a copy
of the suite. It replaces only how the suite's `utils.ServerProcess` starts and stops a server:
instead of llama-server with a model from the hub, a station over one of our cached models
(kept across tests, one per model and context size) and a `moonshine serve` gateway per
start() with the flags the preset's fields map to. Everything else (requests, asserts) is the
suite's own.

A preset field that asks for a llama-server-only feature (LoRA, a draft model, the router,
slot saving, context shift, a chat template other than the model's own, ...) or a model we do
not have skips the test with that reason; the skip list file (AEON_SKIP_LIST) names the tests
whose asserts depend on the exact text of llama.cpp's test model or on a feature we do not
build, each with its reason.
"""

import fnmatch
import os
import subprocess
import time

import pytest
import requests

import utils

BIN = os.environ.get("AEON_BIN_DIR", "")
STATION_BIN = os.environ.get("AEON_STATION_BIN") or os.path.join(BIN, "fat-station")
MOONSHINE_BIN = os.environ.get("AEON_MOONSHINE_BIN") or os.path.join(BIN, "moonshine")
MODELS = os.environ.get("AEON_MODELS_DIR", os.path.expanduser("~/.cache/aeon-shell/models"))

# The suite's models (hub repo, file) -> our cached ones. stories260K (a 260K-parameter toy) is
# replaced by the smallest real chat model we have; the infill one needs FIM tokens (Qwen2.5-Coder).
OUR_MODEL = {
    ("ggml-org/test-model-stories260K", None): "smollm2-135m-instruct-q4_1.knot",
    ("ggml-org/test-model-stories260K-infill", None): "qwen2.5-coder-0.5b-instruct-q4_k_m.knot",
    # A BERT embedding model: we run no encoder-only architecture, so the embedding tests run on
    # a generative model, pooled as llama-server pools one (--pooling).
    ("ggml-org/models", "bert-bge-small/ggml-model-f16.gguf"): "smollm2-135m-instruct-q4_1.knot",
    # The tool-call tests' Qwen2.5 instruct models: the same chat template and tool-call format
    # as our Qwen2.5-Coder-0.5B (a smaller model: its answers are checked, not assumed).
    ("bartowski/Qwen2.5-1.5B-Instruct-GGUF:Q4_K_M", None): "qwen2.5-coder-0.5b-instruct-q4_k_m.knot",
    ("bartowski/Qwen2.5-Coder-3B-Instruct-GGUF:Q4_K_M", None): "qwen2.5-coder-0.5b-instruct-q4_k_m.knot",
    ("bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M", None): "qwen2.5-coder-0.5b-instruct-q4_k_m.knot",
}

# Preset fields that ask for what only llama-server has: (field, reason).
LLAMA_SERVER_ONLY = [
    ("model_draft", "speculative decoding with a draft model"),
    ("spec_type", "llama-server's speculative decoding modes"),
    ("lora_files", "LoRA adapters"),
    ("slot_save_path", "slot save/restore"),
    ("enable_ctx_shift", "context shift"),
    ("n_ga", "group attention (self-extend)"),
    ("mmproj_url", "vision (mmproj)"),
    ("models_dir", "the multi-model router"),
    ("models_preset", "the multi-model router"),
    ("server_tools", "built-in server tools"),
    ("mcp_servers_config", "MCP servers"),
    ("mcp_servers_json", "MCP servers"),
    ("ui_mcp_proxy", "MCP proxy"),
    ("gcp_compat", "Vertex AI (AIP) mode"),
    ("sleep_idle_seconds", "sleeping when idle (unloading the model)"),
    ("server_reranking", "reranking"),
    ("chat_template", "a chat template other than the model's own"),
    ("chat_template_file", "a chat template other than the model's own"),
    ("reasoning_format", "reasoning-format parsing"),
    ("kv_unified", "one KV cache shared by all slots (--kv-unified)"),
]

_stations = {}  # (knot, positions) -> (Popen, url)


def _read_url(proc, log_path, what, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        with open(log_path) as f:
            for word in f.read().split():
                if word.startswith("http://"):
                    return word.rstrip(")").rstrip(",")
        if proc.poll() is not None:
            with open(log_path) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"{what} exited with {proc.returncode}: {tail}")
        time.sleep(0.05)
    raise TimeoutError(f"{what} printed no URL in {timeout} s")


def _station(knot, positions, sessions):
    key = (knot, positions, sessions)
    if key in _stations and _stations[key][0].poll() is None:
        return _stations[key][1]
    for k, (p, _) in list(_stations.items()):
        # One station at a time: two cores do not hold several models' compute.
        p.terminate()
        p.wait(timeout=10)
        del _stations[k]
    log = os.path.join(utils.TMP_DIR, f"station-{len(_stations)}-{os.getpid()}.log")
    os.makedirs(utils.TMP_DIR, exist_ok=True)
    args = [STATION_BIN, "--knot", knot, "--listen", "127.0.0.1:0",
            "--max-sessions", str(max(8, sessions * 2))]
    if positions:
        args += ["--max-positions", str(positions)]
    out = open(log, "w")
    p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    url = _read_url(p, log, "fat-station")
    _stations[key] = (p, url)
    return url


def _start(self, timeout_seconds=utils.DEFAULT_HTTP_TIMEOUT):
    for field, why in LLAMA_SERVER_ONLY:
        if getattr(self, field, None):
            pytest.skip(f"llama-server only: {why} ({field})")
    if self.model_file is None and self.model_hf_repo is None:
        pytest.skip("llama-server only: the multi-model router (no model)")
    name = OUR_MODEL.get((self.model_hf_repo, self.model_hf_file))
    if name is None:
        pytest.skip(f"model {self.model_hf_repo}/{self.model_hf_file} is not cached here (no hub)")
    knot = os.path.join(MODELS, name)
    if not os.path.exists(knot):
        raise RuntimeError(f"{knot} missing (scripts/fetch-model.sh all)")
    if self.pooling == "none" or self.pooling == "rank":
        pytest.skip(f"llama-server only: --pooling {self.pooling} (per-token vectors / reranking)")
    slots = self.n_slots or 1
    positions = self.n_ctx // slots if self.n_ctx else None
    station = _station(knot, positions, slots)
    host = self.server_host.split(",")[0].strip()
    args = [MOONSHINE_BIN, "serve", "--station", station, "-q",
            "--listen", f"{host}:{self.server_port}", "--max-concurrent", str(slots)]
    if self.model_alias:
        args += ["--served-model-name", self.model_alias]
    if self.api_key:
        args += ["--api-key", self.api_key]
    if self.n_predict and self.n_predict > 0:
        args += ["--default-max-tokens", str(self.n_predict)]
    if self.pooling:
        args += ["--pooling", self.pooling]
    if self.seed is not None and self.seed >= 0:
        args += ["--seed", str(self.seed)]
    # llama-server answers any origin unless --cors-origins narrows it; ours answers none
    # unless --allowed-origins lists it.
    args += ["--allowed-origins", self.cors_origins or "*"]
    if not self.server_slots:
        args.append("--no-slots")
    log = os.path.join(utils.TMP_DIR, f"gateway-{os.getpid()}.log")
    self._log = open(log, "w")
    self._log_path = log
    print(f"tests: starting moonshine with: {' '.join(args)}")
    env = {k: v for k, v in os.environ.items() if k != "MOONSHINE_API_KEY"}
    self.process = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, env=env)
    utils.server_instances.add(self)
    t0 = time.time()
    while time.time() - t0 < timeout_seconds:
        try:
            r = requests.get(self.make_url("/health"), timeout=2)
            if r.status_code == 200:
                self.ready = True
                return
        except requests.RequestException:
            pass
        if self.process.poll() is not None:
            with open(log) as f:
                tail = f.read()[-2000:]
            raise RuntimeError(f"moonshine serve exited with {self.process.returncode}: {tail}")
        time.sleep(0.02)
    raise TimeoutError(f"moonshine serve did not answer /health within {timeout_seconds} s")


def _stop(self):
    utils.server_instances.discard(self)
    if self.process:
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self.process = None
    if getattr(self, "_log", None):
        self._log.close()
        self._log = None


utils.ServerProcess.start = _start
utils.ServerProcess.stop = _stop
# The suite's session fixture starts every preset once to download its model: nothing to fetch.
utils.ServerPreset.load_all = staticmethod(lambda: None)


def _skip_list():
    path = os.environ.get("AEON_SKIP_LIST")
    out = []
    if not path:
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            pattern, _, reason = line.partition(" | ")
            out.append((pattern.strip(), reason.strip() or "listed"))
    return out


def pytest_collection_modifyitems(config, items):
    listed = _skip_list()
    for item in items:
        for pattern, reason in listed:
            if fnmatch.fnmatchcase(item.nodeid, pattern):
                item.add_marker(pytest.mark.skip(reason=f"skip list: {reason}"))
                break


def pytest_terminal_summary(terminalreporter):
    table = {}
    for outcome in ("passed", "failed", "skipped", "error"):
        for rep in terminalreporter.stats.get(outcome, []):
            nodeid = getattr(rep, "nodeid", "") or ""
            if not nodeid and getattr(rep, "location", None):
                nodeid = rep.location[0]
            f = nodeid.split("::")[0]
            if outcome == "passed" and getattr(rep, "when", "call") != "call":
                continue
            row = table.setdefault(f, {"passed": 0, "failed": 0, "skipped": 0, "error": 0})
            row[outcome] += 1
    w = terminalreporter
    w.write_line("")
    w.write_line(f"{'file':40} {'passed':>7} {'failed':>7} {'skipped':>8} {'error':>6}")
    total = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    for f in sorted(table):
        r = table[f]
        for k in total:
            total[k] += r[k]
        w.write_line(f"{f:40} {r['passed']:7} {r['failed']:7} {r['skipped']:8} {r['error']:6}")
    w.write_line(f"{'total':40} {total['passed']:7} {total['failed']:7} {total['skipped']:8} {total['error']:6}")
    out = os.environ.get("AEON_CONFORMANCE_JSON")
    if out:
        import json
        with open(out, "w") as fh:
            json.dump({"files": table, "total": total}, fh, indent=1)


def pytest_unconfigure(config):
    for p, _ in _stations.values():
        p.terminate()
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
    _stations.clear()
