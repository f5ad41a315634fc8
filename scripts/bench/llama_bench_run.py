#!/usr/bin/env python3
"""llama.cpp's own llama-bench on the GGUF, set up like aeon-bench's run, as table.py's JSON.

Usage: llama_bench_run.py LLAMA_BENCH GGUF --aeon-json AEON.json [--reps N] [--threads 1,2]

Two llama-bench invocations per run, both with the prompt length and decode count of
aeon-bench's JSON (64 and 64 by default):
  prefill:  -p P -n 0            (pp P: one batch of P tokens on an empty context)
  decode:   -p 0 -n D -d P       (tg D at depth P: D one-token steps after a P-token context,
                                  as ours decodes after its prompt)
with -t THREADS -r REPS. llama-bench feeds random token ids, not our prompt: speed does not
depend on which ids they are. Reported per thread count: the mean (llama-bench's avg_ts), the
standard deviation and every sample, for prefill and decode.

When llama-bench dies of a signal with its default weight repacking (llama.cpp 0.3.36's
CPU_REPACK path segfaults on this AVX-512 VM, in llama-bench and in llama-cpp-python alike), the
run is repeated with `--repack 0` and the JSON says so ("repack": false): those figures are
llama.cpp without its repacked (interleaved) weights, a handicap mostly to its prefill.

Exit 0 with one JSON object on stdout; 2 when llama-bench fails or prints no JSON.
"""

import argparse
import json
import subprocess
import sys


class Crashed(RuntimeError):
    """llama-bench was killed by a signal."""


def run(bench, gguf, threads, extra, reps):
    cmd = [bench, "-m", gguf, "-t", ",".join(map(str, threads)), "-r", str(reps), "-o", "json"] + extra
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode < 0:
        raise Crashed(f"{' '.join(cmd)}: killed by signal {-p.returncode}")
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()[-400:]}")
    try:
        return json.loads(p.stdout), cmd
    except ValueError as e:
        raise RuntimeError(f"{' '.join(cmd)}: no JSON ({e})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bench")
    ap.add_argument("gguf")
    ap.add_argument("--aeon-json", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default=None, help="default: aeon-bench's thread counts")
    a = ap.parse_args()
    with open(a.aeon_json) as f:
        aeon = json.load(f)
    p = len(aeon["prompt_tokens"])
    d = int(aeon["decode_tokens"])
    threads = [int(t) for t in a.threads.split(",")] if a.threads else [r["threads"] for r in aeon["runs"]]
    repack = []
    try:
        try:
            pp, pp_cmd = run(a.bench, a.gguf, threads, ["-p", str(p), "-n", "0"], a.reps)
        except Crashed as e:
            print(f"llama_bench_run: {e}; again with --repack 0", file=sys.stderr)
            repack = ["--repack", "0"]
            pp, pp_cmd = run(a.bench, a.gguf, threads, ["-p", str(p), "-n", "0"] + repack, a.reps)
        tg, tg_cmd = run(a.bench, a.gguf, threads, ["-p", "0", "-n", str(d), "-d", str(p)] + repack, a.reps)
    except (RuntimeError, OSError) as e:
        print(f"llama_bench_run: {e}", file=sys.stderr)
        return 2
    runs = []
    for t in threads:
        rp = next((r for r in pp if r.get("n_threads") == t), None)
        rd = next((r for r in tg if r.get("n_threads") == t), None)
        if rp is None or rd is None:
            print(f"llama_bench_run: no result for {t} thread(s)", file=sys.stderr)
            return 2
        runs.append({
            "threads": t,
            "prefill_tok_s": rp["avg_ts"],
            "prefill_stddev": rp.get("stddev_ts"),
            "prefill_samples": rp.get("samples_ts", []),
            "decode_tok_s": rd["avg_ts"],
            "decode_stddev": rd.get("stddev_ts"),
            "decode_samples": rd.get("samples_ts", []),
        })
    first = pp[0] if pp else {}
    out = {
        "tool": "llama-bench",
        "llama_cpp_version": f"llama-bench build {first.get('build_number', '?')} ({first.get('build_commit', '?')}), "
                             f"{first.get('cpu_info', '?')}, {first.get('backends', '?')}",
        "commands": [" ".join(pp_cmd), " ".join(tg_cmd)],
        "repack": not repack,
        "runs": runs,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
