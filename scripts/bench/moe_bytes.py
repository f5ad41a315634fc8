#!/usr/bin/env python3
"""Bytes of the model a decoded token reads, measured, against the active parameters' bytes.

usage: moe_bytes.py KNOT [--station-bin BIN] [--tokens N] [--threads T] [--warm R] [--json]

Starts one fat-station over KNOT (the whole model) with `--pack-weights never`, so that every
weight is read from the mapped file (packed, the kernels read interleaved anonymous copies of
the same blocks, which smaps cannot tell from the KV cache and scratch), prefills a 12-token
prompt repeated R times (--warm, default 1) in a session,
then for each of N greedy decode steps (POST /chain, one token, X-Return: token): clears the
station's page referenced bits (`echo 1 > /proc/PID/clear_refs`), runs the step, and sums
`Referenced:` over the station's mappings of KNOT in /proc/PID/smaps: the model bytes that
step touched, at page (4 KiB) granularity, whatever the kernels do. The arithmetic it is
compared with, from the KNOT's tensor table (`knot inspect --json`): every tensor's bytes but
the embedding's (one row of it) and the stacked experts' (`ffn_*_exps`, k/E of them per
layer: the chosen experts' rows). Prints the median and range over the N steps and their ratio
to the arithmetic (goal: within 15%).
Warm-up matters for a mixture of experts: an expert first used in a measured step is mapped
then, and the page fault maps (and marks referenced) its neighbouring pages too; a long
prefill (--warm 60: 720 tokens) has used nearly every expert first. Measured on the 4-layer
Qwen3-30B-A3B shape: 1.20x the arithmetic after 12 tokens, 1.10x after 240, 1.09x after 720;
the dense Qwen 0.5B reads 1.001x its weights either way.
What the rest is: not reads. The kernels read exactly the arithmetic (aeon-bench counts the
bytes every matrix product reads, `kernels::count_weight_bytes`: 1087.0 MB per decoded token on
the 24-layer shape against 1087.4 MB of active parameters, the 0.4 MB the norms). smaps counts
a page as referenced when its folio is (`folio_test_young` / `folio_test_referenced`), and this
kernel keeps the file in large folios (up to MiBs) whose PTE accessed bits DAMON and reclaim
fold into folio flags: touching one 4 KiB page of a mapped, cached file after clear_refs showed
284-647 KiB referenced (stride 1 and 4 MiB). An expert matrix that starts or ends inside a
folio drags in its neighbours' pages: about 6 matrix ends per chosen expert per block, ~7 MB a
block at the 4-layer shape's 1.09x. The measured figure is an upper bound at folio granularity.

Needs root (clear_refs of another process) and Linux's smaps. Exit: 0 measured, 1 a failed
step, 2 bad usage.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import urllib.request

PROMPT = [785, 6722, 315, 9625, 374, 12095, 13, 576, 6722, 315, 9856, 374]


def die(msg, code=2):
    print(f"moe_bytes: {msg}", file=sys.stderr)
    sys.exit(code)


def active_bytes(knot_bin, knot):
    d = json.loads(subprocess.run([knot_bin, "inspect", "--json", knot], check=True,
                                  stdout=subprocess.PIPE, text=True).stdout)
    moe = d["arch"].get("moe") or {}
    e, k = moe.get("n_experts", 1), moe.get("n_experts_used", 1)
    total = experts = embd = 0
    vocab = d["arch"]["vocab"]
    for t in d["tensors"]:
        total += t["len"]
        if "_exps." in t["name"]:
            experts += t["len"]
        elif t["name"] == "token_embd.weight":
            embd = t["len"]
    rest = total - experts - embd
    tied = d["arch"].get("tied_embeddings", False)
    # Tied: the head reads the whole embedding; untied: one row of it.
    row = embd if tied else embd / vocab
    return dict(total=total, experts=experts, rest=rest, embd_row=row, n_experts=e, used=k,
                active=rest + row + experts * k / e)


def referenced(pid, knot):
    """Sum of Referenced (bytes) over the mappings of `knot` in /proc/PID/smaps."""
    real = os.path.realpath(knot)
    n, inside = 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
                inside = len(parts) >= 6 and os.path.realpath(parts[5]) == real
            elif inside and parts and parts[0] == "Referenced:":
                n += int(parts[1]) * 1024
    return n


def post(url, tokens, session, pos):
    req = urllib.request.Request(
        url + "/chain", data=json.dumps({"tokens": tokens}).encode(), method="POST",
        headers={"Content-Type": "application/json", "X-Return": "token",
                 "X-Session": session, "X-Pos": str(pos)})
    # A long warm prefill of many layers on a loaded box takes over 10 minutes (24 layers, --warm
    # 60, load ~15: timed out at 600 s).
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)["token"]


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("knot")
    ap.add_argument("--station-bin", default=os.path.join(root, "target/release/fat-station"))
    ap.add_argument("--knot-bin", default=os.path.join(root, "target/release/knot"))
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warm", type=int, default=1,
                    help="the 12-token prompt repeated this many times in the prefill")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.tokens < 1:
        die("--tokens must be positive")
    if not os.path.isfile(a.knot):
        die(f"no {a.knot}")
    if os.geteuid() != 0:
        die("needs root (/proc/PID/clear_refs)")
    want = active_bytes(a.knot_bin, a.knot)
    st = subprocess.Popen([a.station_bin, "--knot", a.knot, "--listen", "127.0.0.1:0",
                           "--threads", str(a.threads), "--pack-weights", "never"], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
    try:
        line = st.stdout.readline()
        url = next((w for w in line.split() if w.startswith("http://")), None)
        if not url:
            die(f"the station printed no URL: {line!r}", 1)
        prompt = PROMPT * a.warm
        t = post(url, prompt, "bytes", 0)
        seen = []
        for i in range(a.tokens):
            with open(f"/proc/{st.pid}/clear_refs", "w") as f:
                f.write("1")
            t = post(url, [t], "bytes", len(prompt) + i)
            seen.append(referenced(st.pid, a.knot))
    finally:
        st.kill()
        st.wait()
    med = statistics.median(seen)
    out = dict(knot=a.knot, threads=a.threads, steps=len(seen), measured_median=med,
               measured_min=min(seen), measured_max=max(seen), ratio=med / want["active"], **want)
    if a.json:
        print(json.dumps(out))
    else:
        mb = 1e6
        print(f"bytes per decoded token: measured {med / mb:.1f} MB [{min(seen) / mb:.1f}-"
              f"{max(seen) / mb:.1f}] over {len(seen)} tokens; active parameters "
              f"{want['active'] / mb:.1f} MB (non-expert {want['rest'] / mb:.1f} + embedding row + "
              f"{want['used']}/{want['n_experts']} of {want['experts'] / mb:.1f} MB experts; whole "
              f"model {want['total'] / mb:.1f} MB): ratio {out['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
