#!/usr/bin/env python3
"""Mesh shootout: latency and throughput of POST /chain with N concurrent clients.

Each client generates --tokens greedy tokens (X-Return: token, one request per token) in its
own session on a chain; clients are spread round-robin over the chains given. Reports per-token
latency (p50/p95) and aggregate tokens/s per configuration.

  scripts/mesh-shootout.py --chains mesh.json --clients 4 --tokens 16
  scripts/mesh-shootout.py --chain http://127.0.0.1:7750,http://127.0.0.1:7751,http://127.0.0.1:7752 \
                           --chain http://127.0.0.1:7753,...   (two replicas)

A chain is its hops' base URLs in order (X-Route carries the rest). --chains reads the
`chains` of a `moonshine mesh form` file. Python stdlib only. See specs/mesh.md.
"""
import argparse, http.client, json, statistics, sys, threading, time, urllib.parse

PROMPT = [785, 6722, 315, 9625, 374]


def step(conns, hops, tokens, session, pos, vary):
    u = urllib.parse.urlparse(hops[0])
    key = (u.hostname, u.port)
    if key not in conns:
        conns[key] = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    c = conns[key]
    h = {"content-type": "application/json", "x-return": "token", "x-session": session, "x-pos": str(pos)}
    if len(hops) > 1:
        h["x-route"] = ",".join(hops[1:])
    t = time.perf_counter()
    c.request("POST", "/chain", body=json.dumps({"tokens": tokens}), headers=h)
    r = c.getresponse()
    body = r.read()
    ms = (time.perf_counter() - t) * 1e3
    if r.status != 200:
        raise RuntimeError(f"{hops[0]}: {r.status} {body[:300]!r}")
    return json.loads(body)["token"], ms, r.getheader("x-chain-trace", "")


def client(idx, hops, n, out, vary):
    conns, lat = {}, []
    toks = list(PROMPT) if not vary else [785 + idx] + PROMPT[1:]
    session = f"shoot{int(time.time()*1000)%10**9}-{idx}"
    pos = 0
    new = toks
    for _ in range(n):
        tok, ms, _ = step(conns, hops, new, session, pos, vary)
        lat.append(ms)
        pos += len(new)
        new = [tok]
    out[idx] = lat


def run(chains, clients, n, vary):
    out = {}
    th = [threading.Thread(target=client, args=(i, chains[i % len(chains)], n, out, vary)) for i in range(clients)]
    t = time.perf_counter()
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.perf_counter() - t
    lat = [m for v in out.values() for m in v[1:]]  # decode steps only
    total = sum(len(v) for v in out.values())
    return {
        "chains": len(chains), "hops": len(chains[0]), "clients": clients, "tokens": total,
        "wall_s": round(wall, 3), "tokens_per_s": round(total / wall, 2),
        "p50_ms": round(statistics.median(lat), 1) if lat else None,
        "p95_ms": round(sorted(lat)[int(0.95 * (len(lat) - 1))], 1) if lat else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", action="append", default=[], help="comma-separated hop URLs of one chain (repeat for replicas)")
    ap.add_argument("--chains", help="chains file from `moonshine mesh form`")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--vary", action="store_true", help="give each client a different first token")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    chains = [c.split(",") for c in a.chain]
    if a.chains:
        f = json.load(open(a.chains))
        chains += [[h["url"] for h in c] for c in (f.get("chains") or [f["stations"]])]
    if not chains:
        ap.error("give --chain URLS or --chains FILE")
    try:
        r = run(chains, a.clients, a.tokens, a.vary)
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        print(f"mesh-shootout: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['chains']} chain(s) x {r['hops']} hop(s), {r['clients']} clients: {r['tokens']} tokens in {r['wall_s']} s "
              f"= {r['tokens_per_s']} tok/s; decode latency p50 {r['p50_ms']} ms p95 {r['p95_ms']} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
