#!/usr/bin/env python3
"""Cut one hot loop out of an LLVM-generated aarch64 .s file and model it with llvm-mca.

Usage: mca-loop.py ASM SYMBOL_REGEX --mcpu CPU [--loop N] [--depth D] [--inner-trips M]
                   [--per K] [--mattr ATTRS] [--dump]

The function is the first whose label matches SYMBOL_REGEX (a Rust mangled name contains the
path, e.g. `neon10q8_0_plain`). A loop is a block label with a branch back to it from below
(rustc's asm has no loop comments, so both sides are read the same way): loop N (0-based, in
layout order, among the loops at depth D, default 1: outermost) runs from its label to the
last branch back to it. Only instructions and labels go to llvm-mca; branches stay (llvm-mca
models no control flow, so a loop with inner loops that were not unrolled, or with calls,
would be under-counted: it is refused). Except with --inner-trips M: each inner loop (one
level down, none deeper) is then known to run M times per iteration (a rolled loop over a
constant count, e.g. the tokens of a multi-token kernel) and its body goes to llvm-mca M
times over.

Prints one JSON object: cycles per iteration (llvm-mca `Total Cycles` / iterations, the
steady state of its in-order model for Cortex-A53/A55: a proxy, not a measurement),
instructions per iteration, and both divided by --per (blocks the loop handles per iteration).
Exit codes: 0 ok, 1 function or loop not found / nested loop or call / llvm-mca failed,
2 usage.
"""
import argparse
import json
import re
import subprocess
import sys

ITER = 300


def function_lines(lines, sym_re):
    pat = re.compile(sym_re)
    for i, line in enumerate(lines):
        m = re.match(r"^([^\s:#/]+):", line)
        if m and pat.search(m.group(1)) and not m.group(1).startswith(".L"):
            name = m.group(1)
            body = []
            for line2 in lines[i + 1:]:
                if line2.startswith(".Lfunc_end") or re.match(r"^\s*\.size\s+" + re.escape(name), line2):
                    break
                body.append(line2)
            return name, body
    return None, None


def is_insn(line):
    s = line.strip()
    return bool(s) and not s.startswith((".", "//", "#", ";", "@")) and not s.endswith(":") and ":" not in s.split()[0]


def clean(line):
    return re.split(r"\s//|\s;|\s@", line.rstrip("\n"), maxsplit=1)[0].rstrip()


def loops(body):
    """(header label, start index, end index inclusive, depth) of every loop: a label with a
    branch back to it from below; depth 1 when no other loop's range holds it."""
    found = []
    for i, line in enumerate(body):
        m = re.match(r"^(\.?L?BB[\w]+):", line)
        if not m:
            continue
        label = m.group(1)
        last = None
        for j in range(i + 1, len(body)):
            if is_insn(body[j]) and re.search(r"[\s,]" + re.escape(label) + r"\s*$", clean(body[j])):
                last = j
        if last is not None:
            found.append((label, i, last))
    out = []
    for label, s, e in found:
        depth = 1 + sum(1 for _, s2, e2 in found if (s2, e2) != (s, e) and s2 <= s and e <= e2)
        out.append((label, s, e, depth))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("asm")
    ap.add_argument("symbol")
    ap.add_argument("--mcpu", required=True)
    ap.add_argument("--mattr", default="")
    ap.add_argument("--loop", type=int, default=0)
    ap.add_argument("--depth", type=int, default=1, help="count loops at this depth (1: outermost)")
    ap.add_argument("--inner-trips", type=int, default=0,
                    help="inner loops run this many times per iteration (their bodies repeated)")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--dump", action="store_true", help="print the loop text instead")
    a = ap.parse_args()
    with open(a.asm, encoding="utf-8", errors="replace") as f:
        lines = f.readlines()
    name, body = function_lines(lines, a.symbol)
    if name is None:
        print(f"mca-loop: no function matching {a.symbol!r} in {a.asm}", file=sys.stderr)
        return 1
    top = [lp for lp in loops(body) if lp[3] == a.depth]
    if a.loop >= len(top):
        print(f"mca-loop: {name}: {len(top)} loops at depth {a.depth}, no loop {a.loop}", file=sys.stderr)
        return 1
    label, s, e, depth = top[a.loop]
    inner = [lp for lp in loops(body) if lp[3] > depth and s < lp[1] <= e]
    if inner and (a.inner_trips < 1 or any(lp[3] > depth + 1 for lp in inner)):
        print(f"mca-loop: {name}: loop {label} holds inner loop(s) {[x[0] for x in inner]}; "
              "llvm-mca would count their bodies once", file=sys.stderr)
        return 1
    calls = [clean(x).strip() for x in body[s:e + 1] if is_insn(x) and re.match(r"\s*(bl|blr)\s", clean(x))]
    if calls:
        print(f"mca-loop: {name}: loop {label} makes calls ({calls[0]}, ...); "
              "llvm-mca would not see the callee", file=sys.stderr)
        return 1
    # Each inner loop's lines M times over (see --inner-trips).
    seq = []
    i = s
    while i <= e:
        lp = next((x for x in inner if x[1] == i), None)
        if lp is None:
            seq.append(body[i])
            i += 1
        else:
            seq.extend(body[lp[1]:lp[2] + 1] * a.inner_trips)
            i = lp[2] + 1
    text = []
    for line in seq:
        c = clean(line)
        if re.match(r"^\.?L?BB[\w]+:", c):
            text.append(c.split(":")[0] + ":")
        elif is_insn(c):
            text.append("\t" + c.strip())
    if a.dump:
        print("\n".join(text))
        return 0
    cmd = ["llvm-mca", "-mtriple=aarch64", f"-mcpu={a.mcpu}", f"-iterations={ITER}"]
    if a.mattr:
        cmd.append(f"-mattr={a.mattr}")
    r = subprocess.run(cmd, input="\n".join(text) + "\n", capture_output=True, text=True)
    if r.returncode != 0:
        print(f"mca-loop: llvm-mca failed on {name}: {r.stderr.strip()[:500]}", file=sys.stderr)
        return 1
    cyc = int(re.search(r"Total Cycles:\s+(\d+)", r.stdout).group(1))
    ins = int(re.search(r"Instructions:\s+(\d+)", r.stdout).group(1))
    out = {
        "function": name,
        "loop": label,
        "mcpu": a.mcpu,
        "cycles_per_iter": cyc / ITER,
        "insns_per_iter": ins / ITER,
        "per": a.per,
        "cycles_per_unit": cyc / ITER / a.per,
        "insns_per_unit": ins / ITER / a.per,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
