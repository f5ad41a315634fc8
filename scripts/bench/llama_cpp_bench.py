#!/usr/bin/env python3
"""llama.cpp's prefill and decode speed on a GGUF, measured the way aeon-bench measures ours.

Same prompt token ids (read from aeon-bench's JSON or given with --tokens), greedy decoding,
one fresh llama context per thread count (n_threads = n_threads_batch = N). For each thread
count: one untimed warm-up pass, then --reps timed passes; the best is reported.

- prefill tok/s: the prompt evaluated in one batch (n_batch >= prompt length), wall clock of
  the decode call, logits of the last position only (as ours);
- decode tok/s: --decode greedy tokens, one llama_decode per token, wall clock of those
  calls only (the argmax is outside the timer, as in aeon-bench).

llama.cpp's own counters (llama_perf_context: t_p_eval_ms / t_eval_ms) are reported next to
the wall-clock figures when the binding exposes them.

Output: one JSON object on stdout (--json) or a short summary. Exit 0 on success, 3 when
llama_cpp is not installed (the caller prints a note and carries on), 2 on other errors.
"""

import argparse
import ctypes
import json
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True, help="the GGUF model file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--aeon-json", help="aeon-bench --json output: prompt_tokens and decode_tokens come from it")
    src.add_argument("--tokens", help="prompt token ids, comma separated")
    p.add_argument("--decode", type=int, default=None, help="greedy tokens to decode (default: aeon-bench's, else 64)")
    p.add_argument("--threads", default="1,2", help="thread counts, comma separated (default 1,2)")
    p.add_argument("--reps", type=int, default=3, help="timed passes per thread count; best is reported")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p.parse_args()


def main():
    args = parse_args()
    try:
        import llama_cpp  # noqa: F401
        import numpy as np
    except ImportError as e:
        print(f"llama_cpp_bench: {e}; install with `pip install llama-cpp-python`", file=sys.stderr)
        return 3

    if args.aeon_json:
        with open(args.aeon_json) as f:
            aeon = json.load(f)
        tokens = [int(t) for t in aeon["prompt_tokens"]]
        n_decode = args.decode if args.decode is not None else int(aeon.get("decode_tokens", 64))
    else:
        tokens = [int(t) for t in args.tokens.split(",") if t.strip()]
        n_decode = args.decode if args.decode is not None else 64
    if not tokens:
        print("llama_cpp_bench: empty prompt", file=sys.stderr)
        return 2
    if not os.path.exists(args.gguf):
        print(f"llama_cpp_bench: {args.gguf} not found", file=sys.stderr)
        return 2
    threads = [int(t) for t in args.threads.split(",") if t.strip()]

    from llama_cpp import Llama

    runs = []
    system_info = ""
    try:
        system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    except Exception:  # older or newer bindings: informative only
        pass

    for n in threads:
        n_ctx = len(tokens) + n_decode + 8
        llm = Llama(
            model_path=args.gguf,
            n_ctx=max(n_ctx, 256),
            n_batch=max(512, len(tokens)),
            n_ubatch=max(512, len(tokens)),
            n_threads=n,
            n_threads_batch=n,
            logits_all=False,
            verbose=False,
        )
        ctx = llm._ctx.ctx
        n_vocab = llm.n_vocab()

        def last_logits():
            ptr = llama_cpp.llama_get_logits_ith(ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,))

        def perf():
            try:
                d = llama_cpp.llama_perf_context(ctx)
                return d.t_p_eval_ms, d.n_p_eval, d.t_eval_ms, d.n_eval
            except Exception:
                return None

        def reset_perf():
            try:
                llama_cpp.llama_perf_context_reset(ctx)
            except Exception:
                pass

        best_p, best_d, greedy, own = float("inf"), float("inf"), [], None
        best_pc, best_dc = float("inf"), float("inf")
        for rep in range(args.reps + 1):
            llm.reset()
            reset_perf()
            t, c = time.perf_counter(), time.process_time()
            llm.eval(tokens)
            tp, tpc = time.perf_counter() - t, time.process_time() - c
            ids, td, tdc = [], 0.0, 0.0
            for _ in range(n_decode):
                nxt = int(np.argmax(last_logits()))
                ids.append(nxt)
                t, c = time.perf_counter(), time.process_time()
                llm.eval([nxt])
                td += time.perf_counter() - t
                tdc += time.process_time() - c
            if rep == 0:
                continue  # warm-up
            if tp < best_p:
                best_p = tp
            if td < best_d:
                best_d = td
                own = perf()
            best_pc, best_dc = min(best_pc, tpc), min(best_dc, tdc)
            greedy = ids
        run = {
            "threads": n,
            "prefill_tok_s": len(tokens) / best_p,
            "decode_tok_s": n_decode / best_d if n_decode else None,
            # Tokens per CPU-second of the process (all threads, OpenMP spinning included).
            "prefill_tok_per_cpu_s": len(tokens) / best_pc if best_pc > 0 else None,
            "decode_tok_per_cpu_s": n_decode / best_dc if n_decode and best_dc > 0 else None,
            "greedy": greedy[:16],
        }
        if own is not None:
            tpe, npe, te, ne = own
            run["own_timings"] = {
                "prompt_eval_ms": tpe,
                "prompt_tokens": npe,
                "eval_ms": te,
                "eval_tokens": ne,
                "eval_tok_s": ne / te * 1e3 if te else None,
            }
        runs.append(run)
        del llm

    out = {
        "llama_cpp_version": getattr(llama_cpp, "__version__", "?"),
        "system_info": system_info,
        "gguf": args.gguf,
        "prompt_len": len(tokens),
        "decode_tokens": n_decode,
        "runs": runs,
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"llama.cpp {out['llama_cpp_version']} on {args.gguf}")
        for r in runs:
            print(f"  threads {r['threads']}: prefill {r['prefill_tok_s']:.1f} tok/s, decode {r['decode_tok_s']:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
