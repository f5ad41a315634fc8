#!/usr/bin/env python3
"""Where time goes in one mesh token step: per-node X-Compute-Ms (from X-Chain-Trace), sealing
cost, and the network/relay remainder (wall - sum of compute - sealing).

  scripts/mesh-timeprofile.py --chain http://127.0.0.1:7750,http://127.0.0.1:7751 --steps 8 [--vary]

Without --vary every step re-sends the same prompt statelessly (the prefill path); with --vary
each step is a decode step in one session with a different token, defeating any caching of
repeated inputs. Python stdlib only. See specs/mesh.md.
"""
import argparse, http.client, json, statistics, sys, time, urllib.parse

PROMPT = [785, 6722, 315, 9625, 374]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", required=True, help="comma-separated hop URLs")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--vary", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    hops = a.chain.split(",")
    u = urllib.parse.urlparse(hops[0])
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    per, walls, sess = {}, [], f"prof{int(time.time()*1000)%10**9}"
    pos, nxt = 0, list(PROMPT)
    for i in range(a.steps + 1):
        h = {"content-type": "application/json", "x-return": "token"}
        if len(hops) > 1:
            h["x-route"] = ",".join(hops[1:])
        if a.vary:
            h.update({"x-session": sess, "x-pos": str(pos)})
            toks = nxt
        else:
            toks = PROMPT
        t = time.perf_counter()
        c.request("POST", "/chain", body=json.dumps({"tokens": toks}), headers=h)
        r = c.getresponse()
        body = r.read()
        wall = (time.perf_counter() - t) * 1e3
        if r.status != 200:
            print(f"mesh-timeprofile: {r.status} {body[:300]!r}", file=sys.stderr)
            return 1
        if a.vary:
            pos += len(toks)
            nxt = [(json.loads(body)["token"] + i) % 151000]
        if i == 0:
            continue  # warm-up (page-in)
        walls.append(wall)
        for item in r.getheader("x-chain-trace", "").split(","):
            node, rest = item.split("=", 1)
            rng, ms, seal = rest.split(":")
            # Keyed by node and range: stations started without --node-id all say `station`.
            d = per.setdefault((node, rng), {"node": node, "layers": rng, "compute": [], "seal": []})
            d["compute"].append(float(ms))
            d["seal"].append(float(seal))
    med = statistics.median
    rows = [{"node": d["node"], "layers": d["layers"], "compute_ms": round(med(d["compute"]), 3), "seal_ms": round(med(d["seal"]), 4)} for d in per.values()]
    wall = med(walls)
    other = wall - sum(x["compute_ms"] + x["seal_ms"] for x in rows)
    if a.json:
        print(json.dumps({"hops": len(hops), "vary": a.vary, "wall_ms": round(wall, 3), "nodes": rows, "network_relay_ms": round(other, 3)}))
        return 0
    print(f"{len(hops)}-node chain, {'decode (--vary)' if a.vary else 'stateless prefill of 5 tokens'}, median of {len(walls)} steps")
    for x in rows:
        print(f"  {x['node']:<10} layers {x['layers']:<6} compute {x['compute_ms']:8.2f} ms  seal {x['seal_ms']:.4f} ms")
    print(f"  network + relay + HTTP   {other:8.2f} ms")
    print(f"  wall                     {wall:8.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
