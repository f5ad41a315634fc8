#!/usr/bin/env python3
"""Mesh shootout: latency and throughput of POST /chain with N concurrent clients.

Each client generates --tokens greedy tokens (X-Return: token, one request per token) in its
own session on a chain; clients are spread round-robin over the chains given. Reports per-token
decode latency (p50/p95) and aggregate tokens/s per configuration.

  scripts/mesh-shootout.py --chains mesh.json --clients 4 --tokens 16
  scripts/mesh-shootout.py --chain http://127.0.0.1:7750,http://127.0.0.1:7751,http://127.0.0.1:7752 \\
                           --chain http://127.0.0.1:7753,...   (two replicas)

A chain is its hops' base URLs in order (X-Route carries the rest). --chains reads the
`chains` of a `moonshine mesh form` file.

--launch MODEL.knot starts the stations itself (target/release/fat-station, or --station-bin),
two replica chains of --ranges (default 0-8,8-16,16-24), each station with --threads compute
threads (default 1: on a small machine a station's default pool takes every core, so six
stations would oversubscribe it), and measures, --repeat times interleaved:

  1 chain x 1 client, 1 chain x 2 clients, 2 replicas x 2 clients

then prints a table (median run of each: aggregate tok/s, decode p50/p95, cores the stations
kept busy) and the ratio replicas / one chain, with the load average before and after. With one client a chain keeps one
station busy at a time; two clients on one chain overlap on different stations but queue at the
slowest one (the exit, with the LM head); two replicas give each client its own stations.

  scripts/mesh-shootout.py --launch ~/.cache/aeon-shell/models/qwen2.5-coder-0.5b-instruct-q4_k_m.knot

Python stdlib only. Exit codes: 0 ok, 1 a request or a station failed, 2 bad arguments.
See specs/mesh.md.
"""
import argparse, http.client, json, os, statistics, subprocess, sys, threading, time, urllib.parse

PROMPT = [785, 6722, 315, 9625, 374]


def step(conns, hops, tokens, session, pos):
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


SESSIONS = [0]


def client(idx, hops, n, out, vary, errors):
    try:
        conns, lat = {}, []
        toks = list(PROMPT) if not vary else [785 + idx] + PROMPT[1:]
        SESSIONS[0] += 1
        session = f"shoot{os.getpid()}-{SESSIONS[0]}-{idx}"
        pos = 0
        new = toks
        for _ in range(n):
            tok, ms, _ = step(conns, hops, new, session, pos)
            lat.append(ms)
            pos += len(new)
            new = [tok]
        out[idx] = lat
    except Exception as e:  # noqa: BLE001 - reported by run()
        errors.append(e)


def run(chains, clients, n, vary):
    out, errors = {}, []
    th = [threading.Thread(target=client, args=(i, chains[i % len(chains)], n, out, vary, errors)) for i in range(clients)]
    t = time.perf_counter()
    for x in th:
        x.start()
    for x in th:
        x.join()
    wall = time.perf_counter() - t
    if errors:
        raise errors[0]
    lat = sorted(m for v in out.values() for m in v[1:])  # decode steps only
    total = sum(len(v) for v in out.values())
    return {
        "chains": len(chains), "hops": len(chains[0]), "clients": clients, "tokens": total,
        "wall_s": round(wall, 3), "tokens_per_s": round(total / wall, 2),
        "p50_ms": round(statistics.median(lat), 1) if lat else None,
        "p95_ms": round(lat[int(0.95 * (len(lat) - 1))], 1) if lat else None,
    }


def cpu_seconds(pids):
    """User + system CPU seconds the processes have used so far (Linux /proc; 0 elsewhere)."""
    tick, total = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100, 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / tick


def loadavg():
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def start_station(bin_, knot, layers, threads, node_id, log, next_hop=None):
    argv = [bin_, "--knot", knot, "--layers", layers, "--threads", str(threads), "--node-id", node_id,
            "--listen", "127.0.0.1:0"]
    if next_hop:
        # A station forwards X-Route only to a hop it was told at start (no open relay).
        argv += ["--route-to", next_hop]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    url = next((w for w in line.split() if w.startswith("http://")), None)
    if url is None:
        p.kill()
        raise RuntimeError(f"station {layers} did not start: {line!r}")
    return p, url


def launch(a):
    bin_ = a.station_bin
    if not os.access(bin_, os.X_OK):
        print(f"mesh-shootout: no station binary {bin_} (cargo build --release -p fat-station)", file=sys.stderr)
        return 2
    ranges = a.ranges.split(",")
    procs, chains = [], []
    log = open(os.devnull, "w") if not a.station_log else open(a.station_log, "a")
    try:
        for c in range(2):
            # Last hop first: each station learns its successor's URL before it starts.
            hops = []
            for i in reversed(range(len(ranges))):
                p, url = start_station(bin_, a.launch, ranges[i], a.threads, f"c{c}n{i}", log,
                                       hops[0] if hops else None)
                procs.append(p)
                hops.insert(0, url)
            chains.append(hops)
        # Warm-up: page the weights in on every station.
        for c in chains:
            run([c], 1, 2, False)
        configs = [("1 chain x 1 client", chains[:1], 1), ("1 chain x 2 clients", chains[:1], 2),
                   ("2 replicas x 2 clients", chains, 2)]
        load_before = loadavg()
        runs = {name: [] for name, _, _ in configs}
        pids = [p.pid for p in procs]
        for _ in range(a.repeat):
            for name, cs, k in configs:
                c0 = cpu_seconds(pids)
                r = run(cs, k, a.tokens, a.vary)
                r["cores_busy"] = round((cpu_seconds(pids) - c0) / r["wall_s"], 2)
                runs[name].append(r)
        load_after = loadavg()
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        print(f"mesh-shootout: {e}", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    rows = []
    for name, cs, k in configs:
        rs = sorted(runs[name], key=lambda r: r["tokens_per_s"])
        med = rs[len(rs) // 2]
        rows.append(dict(med, config=name, stations=len(cs) * len(ranges),
                         tps_min=rs[0]["tokens_per_s"], tps_max=rs[-1]["tokens_per_s"]))
    by = {r["config"]: r["tokens_per_s"] for r in rows}
    ratio2 = by["2 replicas x 2 clients"] / by["1 chain x 2 clients"]
    ratio1 = by["2 replicas x 2 clients"] / by["1 chain x 1 client"]
    report = {"ranges": ranges, "threads_per_station": a.threads, "tokens_per_client": a.tokens,
              "repeat": a.repeat, "load_before": load_before, "load_after": load_after,
              "cpus": os.cpu_count(), "rows": rows,
              "ratio_replicas_vs_chain_2_clients": round(ratio2, 3),
              "ratio_replicas_vs_chain_1_client": round(ratio1, 3)}
    if a.json:
        print(json.dumps(report))
        return 0
    print(f"{len(ranges)}-hop chains {','.join(ranges)}, {a.threads} thread(s) per station, {a.tokens} tokens per client, "
          f"median of {a.repeat} interleaved runs; {os.cpu_count()} CPUs, load average {load_before} before, {load_after} after")
    print(f"{'configuration':<24} {'stations':>8} {'tok/s':>7} {'(min-max)':>13} {'p50 ms':>7} {'p95 ms':>7} {'cores busy':>10}")
    for r in rows:
        print(f"{r['config']:<24} {r['stations']:>8} {r['tokens_per_s']:>7.2f} {'(' + str(r['tps_min']) + '-' + str(r['tps_max']) + ')':>13} "
              f"{r['p50_ms']:>7} {r['p95_ms']:>7} {r['cores_busy']:>10}")
    print("(cores busy: the stations' CPU seconds / wall seconds of that run)")
    print(f"replicas / one chain: {ratio2:.2f}x with 2 clients on both, {ratio1:.2f}x against one client")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chain", action="append", default=[], help="comma-separated hop URLs of one chain (repeat for replicas)")
    ap.add_argument("--chains", help="chains file from `moonshine mesh form`")
    ap.add_argument("--launch", metavar="MODEL.knot", help="start the stations and run the three configurations")
    ap.add_argument("--station-bin", default=os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "target", "release", "fat-station"))
    ap.add_argument("--ranges", default="0-8,8-16,16-24", help="with --launch: the layer ranges of one chain")
    ap.add_argument("--threads", type=int, default=1, help="with --launch: compute threads per station")
    ap.add_argument("--repeat", type=int, default=3, help="with --launch: runs of each configuration (median reported)")
    ap.add_argument("--station-log", help="with --launch: append the stations' stderr here")
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--vary", action="store_true", help="give each client a different first token")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.tokens < 2 or a.clients < 1 or a.repeat < 1 or a.threads < 1:
        ap.error("--tokens must be at least 2, --clients, --repeat and --threads at least 1")
    if a.launch:
        if a.chain or a.chains:
            ap.error("--launch starts its own stations: no --chain/--chains")
        return launch(a)
    chains = [c.split(",") for c in a.chain]
    if a.chains:
        f = json.load(open(a.chains))
        chains += [[h["url"] for h in c] for c in (f.get("chains") or [f["stations"]])]
    if not chains:
        ap.error("give --chain URLS, --chains FILE or --launch MODEL.knot")
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
