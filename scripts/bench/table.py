#!/usr/bin/env python3
"""Prints the bench table from aeon-bench's JSON and (optionally) llama_bench_run.py's JSON.

Usage: table.py AEON.json [LLAMA.json]

Ours: the best repetition (prefill), the best decode against the bandwidth read around it, and
the spread (min-max) of every repetition. llama.cpp (llama-bench): the mean and standard
deviation of its repetitions, and their min-max.

Columns per thread count: our prefill and decode tok/s, llama.cpp's, the ratios ours/llama.cpp,
the bandwidth roofline and ours/roofline; then the targets of issue 9 with PASS/FAIL, the
station figures and peak RSS. Exit 0 always when the inputs parse (the table is a report, not a
gate); 2 when they do not.
"""

import json
import sys


def fmt(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return None if a is None or not b else a / b


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            ours = json.load(f)
        peer = None
        if len(argv) > 2:
            with open(argv[2]) as f:
                peer = json.load(f)
    except (OSError, ValueError) as e:
        print(f"table.py: {e}", file=sys.stderr)
        return 2
    peer_runs = {r["threads"]: r for r in (peer or {}).get("runs", [])}

    print(f"model: {ours['model']}  kernels: {ours['kernels']}")
    print(
        f"prompt {len(ours['prompt_tokens'])} tokens, decode {ours['decode_tokens']} greedy tokens; "
        f"weights read per decoded token {ours['bytes_per_token'] / 1e6:.1f} MB"
    )
    if peer:
        print(f"llama.cpp: {peer.get('llama_cpp_version', '?')}")
        if peer.get("repack") is False:
            print("  NOTE: llama.cpp ran with --repack 0 (its repacked-weights path crashed here)")
        for c in peer.get("commands", []):
            print(f"  {c}")
    else:
        print("llama.cpp: not measured (scripts/bench/build-llama-bench.sh builds llama-bench)")
    print()
    hdr = (
        f"{'thr':>3} | {'bw GB/s':>7} {'roof t/s':>8} | {'prefill':>8} {'llama':>7} {'ratio':>6} | "
        f"{'decode':>7} {'llama':>7} {'ratio':>6} | {'of roof':>7} {'llama%':>6}"
    )
    print(hdr)
    print("-" * len(hdr))
    checks = []
    for r in ours["runs"]:
        t = r["threads"]
        p = peer_runs.get(t, {})
        lp, ld = p.get("prefill_tok_s"), p.get("decode_tok_s")
        rp, rd = ratio(r["prefill_tok_s"], lp), ratio(r["decode_tok_s"], ld)
        lroof = ratio(ld, r["roofline_tok_s"])
        print(
            f"{t:>3} | {r['bandwidth_gbs']:>7.1f} {r['roofline_tok_s']:>8.1f} | "
            f"{r['prefill_tok_s']:>8.1f} {fmt(lp):>7} {fmt(rp, '.2f'):>6} | "
            f"{r['decode_tok_s']:>7.1f} {fmt(ld):>7} {fmt(rd, '.2f'):>6} | "
            f"{r['decode_vs_roofline'] * 100:>6.0f}% {fmt(lroof * 100 if lroof is not None else None, '.0f'):>5}%"
        )
        if rd is not None:
            checks.append((f"decode >= 1.2x llama.cpp at {t} thread(s)", rd >= 1.2, f"{rd:.2f}x"))
        if rp is not None:
            checks.append((f"prefill >= llama.cpp at {t} thread(s)", rp >= 1.0, f"{rp:.2f}x"))
        checks.append(
            (f"decode >= 60% of roofline at {t} thread(s)", r["decode_vs_roofline"] >= 0.6, f"{r['decode_vs_roofline'] * 100:.0f}%")
        )
        if p.get("greedy") and r.get("greedy"):
            same = sum(1 for a, b in zip(p["greedy"], r["greedy"]) if a == b)
            print(f"    greedy ids agree with llama.cpp on {same}/{min(len(p['greedy']), len(r['greedy']))} of the first tokens")
    print()
    print("spreads over repetitions (tok/s): ours min-max | llama.cpp mean +- sd (min-max)")
    for r in ours["runs"]:
        t = r["threads"]
        p = peer_runs.get(t, {})
        reps = r.get("reps") or []
        def mm(vals):
            return f"{min(vals):.1f}-{max(vals):.1f}" if vals else "-"
        def peer_spread(kind):
            if not p:
                return "-"
            sd = p.get(f"{kind}_stddev")
            return f"{p[f'{kind}_tok_s']:.1f} +- {fmt(sd)} ({mm(p.get(f'{kind}_samples') or [])})"
        ours_p = [x["prefill_tok_s"] for x in reps]
        ours_d = [x["decode_tok_s"] for x in reps]
        ratio_lo = ratio(min(ours_d), max(p.get("decode_samples") or [0]) or None) if ours_d and p else None
        ratio_hi = ratio(max(ours_d), min(p.get("decode_samples") or [0]) or None) if ours_d and p else None
        print(
            f"{t:>3} thr: prefill {mm(ours_p)} | {peer_spread('prefill')};  "
            f"decode {mm(ours_d)} | {peer_spread('decode')}"
            + (f";  decode ratio range {ratio_lo:.2f}-{ratio_hi:.2f}" if ratio_lo and ratio_hi else "")
        )
    print()
    s = ours.get("station")
    if s:
        print(
            f"station: start-to-ready {s['start_to_ready_ms']:.1f} ms (median of {len(s['starts_ms'])}); "
            f"decode hop adds {s['hop_overhead_ms'] * 1e3:.0f} us over compute "
            f"(round trip {s['hop_round_trip_ms']:.2f} ms, compute {s['hop_compute_ms']:.2f} ms, {s['hop_bytes']} B body); "
            f"station peak RSS {s['station_peak_rss_mib']:.0f} MiB"
        )
        checks.append(("station start-to-ready < 50 ms", s["start_to_ready_ms"] < 50, f"{s['start_to_ready_ms']:.1f} ms"))
        checks.append(("decode hop < 1 ms over compute", s["hop_overhead_ms"] < 1.0, f"{s['hop_overhead_ms'] * 1e3:.0f} us"))
    print(f"bench peak RSS (incl. touched mmapped weights): {ours['peak_rss_mib']:.0f} MiB")
    if "first_prefill_ms" in ours:
        print(f"first prefill after load (pages weights in, builds interleaved copies): {ours['first_prefill_ms']:.0f} ms")
    load = ours.get("loadavg")
    if load:
        busy = max(load) > 0.5
        print(
            f"load average before/after aeon-bench: {load[0]:.2f} / {load[1]:.2f}"
            + ("  <- the CPUs were shared: wall-clock rates are pessimistic; see the per-CPU-second table" if busy else "")
        )
    print()
    print("per CPU-second of the process (all its threads; robust to other load at 1 thread, spin-waits count at 2):")
    print(f"{'thr':>3} | {'prefill':>8} {'llama':>7} {'ratio':>6} | {'decode':>7} {'llama':>7} {'ratio':>6}")
    for r in ours["runs"]:
        p = peer_runs.get(r["threads"], {})
        lp, ld = p.get("prefill_tok_per_cpu_s"), p.get("decode_tok_per_cpu_s")
        op, od = r.get("prefill_tok_per_cpu_s"), r.get("decode_tok_per_cpu_s")
        print(
            f"{r['threads']:>3} | {fmt(op):>8} {fmt(lp):>7} {fmt(ratio(op, lp), '.2f'):>6} | "
            f"{fmt(od):>7} {fmt(ld):>7} {fmt(ratio(od, ld), '.2f'):>6}"
        )
    print()
    for name, ok, val in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
