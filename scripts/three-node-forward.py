#!/usr/bin/env python3
"""Drive a chain of stations over the wire by hand (Python stdlib only).

tokens -> entry POST /embed -> POST /forward (X-Layer-Range: a-b) on each station in order
-> exit POST /lm-head -> argmax, checked against --expect. Prints, per hop, the bytes sent
and received, the layer range and the station's X-Compute-Ms. Wire: specs/station-wire.md.

    scripts/three-node-forward.py http://10.0.0.1:8080=0-8 http://10.0.0.2:8080=8-16 \
        http://10.0.0.3:8080=16-24
    scripts/three-node-forward.py --mesh specs/mesh-3.json
    scripts/two-node-forward.py http://127.0.0.1:8081=0-12 http://127.0.0.1:8082=12-24

A hop given as a bare URL runs the layers its /health reports. Exit codes: 0 PASS, 1 the
argmax is not --expect, 2 usage or wire errors.
"""

import argparse
import json
import struct
import sys
import time
import urllib.error
import urllib.request

# Qwen2.5 "The capital of France is" -> " Paris".
DEFAULT_TOKENS = [785, 6722, 315, 9625, 374]
DEFAULT_EXPECT = 12095


class WireError(Exception):
    """A station refused a request or answered something unreadable."""


def call(url, body=None, headers=None, timeout=120.0):
    """One request; returns (body bytes, response headers). Raises WireError on 4xx/5xx."""
    req = urllib.request.Request(url, data=body, headers=headers or {},
                                 method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        text = e.read().decode("utf-8", "replace")
        try:
            j = json.loads(text)
            text = "%s: %s" % (j.get("error"), j.get("message"))
        except ValueError:
            pass
        raise WireError("%s -> %d %s" % (url, e.code, text)) from None
    except (urllib.error.URLError, OSError) as e:
        raise WireError("%s -> %s" % (url, e)) from None


def f32(b):
    if len(b) % 4:
        raise WireError("%d bytes is not a whole number of f32" % len(b))
    return list(struct.unpack("<%df" % (len(b) // 4), b))


def parse_range(s):
    a, sep, b = s.partition("-")
    if not sep:
        a, sep, b = s.partition("..")
    try:
        r = (int(a), int(b))
    except ValueError:
        raise WireError("bad layer range %r (expected a-b)" % s) from None
    if r[0] >= r[1]:
        raise WireError("empty layer range %r" % s)
    return r


def hops_from_args(specs, mesh, timeout):
    """[(url, (a, b))] from URL=a-b arguments or a mesh file; bare URLs ask /health."""
    if mesh:
        with open(mesh, encoding="utf-8") as f:
            m = json.load(f)
        specs = ["%s=%s" % (s["url"], s["layers"]) for s in m["stations"]]
    hops = []
    for s in specs:
        url, sep, rng = s.rpartition("=")
        if not sep:
            url = s
            h = json.loads(call(url.rstrip("/") + "/health", timeout=timeout)[0])
            rng = h["layers"]
        hops.append((url.rstrip("/"), parse_range(rng)))
    nxt = 0
    for url, (a, b) in hops:
        if a != nxt:
            raise WireError("%s runs %d-%d but the chain is at layer %d" % (url, a, b, nxt))
        nxt = b
    h = json.loads(call(hops[-1][0] + "/health", timeout=timeout)[0])
    if h.get("n_layers") is not None and nxt != h["n_layers"]:
        raise WireError("the chain ends at layer %d but the model has %d layers" % (nxt, h["n_layers"]))
    return hops


def ms(headers):
    return headers.get("X-Compute-Ms", "?")


def run(hops, tokens, expect, f16=False, timeout=120.0, out=sys.stdout, save_logits=None):
    """Drives the chain once; returns (argmax, logit, logits)."""
    entry, exit_ = hops[0][0], hops[-1][0]
    t0 = time.perf_counter()
    body = json.dumps({"tokens": tokens}).encode()
    x, h = call(entry + "/embed", body, {"Content-Type": "application/json"}, timeout)
    print("embed    %-28s %d tokens          -> %8d B  X-Compute-Ms %s"
          % (entry, len(tokens), len(x), ms(h)), file=out)
    for i, (url, (a, b)) in enumerate(hops, 1):
        hdr = {"Content-Type": "application/octet-stream", "X-Layer-Range": "%d-%d" % (a, b)}
        if f16:
            hdr["X-Dtype"] = "f16"
            if h.get("X-Dtype") != "f16":  # the embed answer is f32: halve it for the wire
                v = f32(x)
                x = struct.pack("<%de" % len(v), *v)
        sent = len(x)
        x, h = call(url + "/forward", x, hdr, timeout)
        print("hop %d    %-28s layers %2d-%-2d  %8d B -> %8d B  X-Compute-Ms %s"
              % (i, url, a, b, sent, len(x), ms(h)), file=out)
    hdr = {"Content-Type": "application/octet-stream"}
    if f16:
        hdr["X-Dtype"] = "f16"
    sent = len(x)
    lb, h = call(exit_ + "/lm-head", x, hdr, timeout)
    print("lm-head  %-28s                %8d B -> %8d B  X-Compute-Ms %s"
          % (exit_, sent, len(lb), ms(h)), file=out)
    if save_logits:
        with open(save_logits, "wb") as f:
            f.write(lb)
    logits = f32(lb)
    best = max(range(len(logits)), key=logits.__getitem__)
    wall = (time.perf_counter() - t0) * 1e3
    verdict = "PASS" if best == expect else "FAIL"
    print("argmax %d logit %.3f (expect %d) in %.1f ms wall: %s"
          % (best, logits[best], expect, wall, verdict), file=out)
    return best, logits[best], logits


def main(argv=None, nodes=None, prog=None):
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("hops", nargs="*", metavar="URL[=a-b]",
                   help="stations in layer order, e.g. http://127.0.0.1:8081=0-8")
    p.add_argument("--mesh", help="mesh file: {\"stations\": [{\"url\", \"layers\": \"a-b\"}]}")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                   help="comma-separated token ids (default: %(default)s)")
    p.add_argument("--expect", type=int, default=DEFAULT_EXPECT,
                   help="expected argmax id (default: %(default)s, ' Paris')")
    p.add_argument("--f16", action="store_true", help="send residuals as f16 (X-Dtype: f16)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--save-logits", metavar="FILE", help="write the raw f32 logits here")
    a = p.parse_args(argv)
    if bool(a.hops) == bool(a.mesh):
        p.error("give the stations as URL=a-b arguments or --mesh FILE (not both)")
    try:
        tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
        if not tokens:
            raise ValueError("no tokens")
    except ValueError as e:
        p.error("--tokens: %s" % e)
    try:
        hops = hops_from_args(a.hops, a.mesh, a.timeout)
        if nodes is not None and len(hops) != nodes:
            raise WireError("this driver runs %d stations, got %d" % (nodes, len(hops)))
        best, _, _ = run(hops, tokens, a.expect, a.f16, a.timeout, save_logits=a.save_logits)
    except (WireError, OSError, KeyError, ValueError) as e:
        print("error: %s" % e, file=sys.stderr)
        return 2
    return 0 if best == a.expect else 1


if __name__ == "__main__":
    try:
        sys.exit(main(nodes=3))
    except BrokenPipeError:
        sys.exit(0)
