#!/usr/bin/env python3
"""The hostile and ordinary clients of scripts/soak.sh, for --duration seconds, on loopback.

  scripts/soak-clients.py --station URL --gateway URL --hidden N --layers A-B \
      --pids STATION_PID,GATEWAY_PID --duration 60 --out summary.json

Runs at once: a /health probe (a fresh connection every 50 ms: p50/p99), 20 slowloris clients
(a header line a second, reconnecting when closed), 10 clients withholding the end of a
64 MiB /forward body (reconnecting after each answer), 100 session churners (a new X-Session
each time: a 4-row prefill and one decode row), and 40 concurrent streamed chat completions
on the gateway of which half disconnect after their first chunk. Samples the RSS of the pids
every second. Writes a JSON summary: health latencies, RSS peaks, statuses and errors by kind.
"""
import argparse
import collections
import http.client
import json
import socket
import struct
import threading
import time

counts = collections.Counter()
lock = threading.Lock()


def count(kind):
    with lock:
        counts[kind] += 1


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def hostport(url):
    hp = url.split("://", 1)[1].rstrip("/")
    h, p = hp.rsplit(":", 1)
    return h, int(p)


def health_probe(station, stop, lat):
    h, p = hostport(station)
    while not stop.is_set():
        t = time.monotonic()
        try:
            c = http.client.HTTPConnection(h, p, timeout=10)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            c.close()
            lat.append((time.monotonic() - t) * 1e3)
            count(f"health {r.status}")
        except Exception as e:  # noqa: BLE001 - every failure is a figure here
            count(f"health error {type(e).__name__}")
        time.sleep(0.05)


def slowloris(station, stop):
    h, p = hostport(station)
    while not stop.is_set():
        try:
            s = socket.create_connection((h, p), timeout=5)
            s.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
            i = 0
            while not stop.is_set():
                time.sleep(1)
                s.sendall(f"x-slow-{i}: y\r\n".encode())
                i += 1
            s.close()
        except OSError:
            count("slowloris cut off")
            time.sleep(0.2)


def withholder(station, stop):
    h, p = hostport(station)
    chunk = b"\0" * (1 << 20)
    while not stop.is_set():
        try:
            s = socket.create_connection((h, p), timeout=5)
            s.sendall(b"POST /forward HTTP/1.1\r\nhost: x\r\nx-layer-range: 0-1\r\n"
                      b"content-length: 67108864\r\n\r\n")
            s.settimeout(5)
            for _ in range(60):
                if stop.is_set():
                    break
                s.sendall(chunk)
            # Withhold the last 4 MiB: wait for the station's answer (or the end).
            s.settimeout(1)
            got = b""
            while not stop.is_set():
                try:
                    b = s.recv(4096)
                except socket.timeout:
                    continue
                if not b:
                    break
                got += b
                if b"\r\n" in got:
                    break
            if got:
                count("withheld body answered " + got.split(b"\r\n")[0].decode(errors="replace"))
            s.close()
        except OSError as e:
            count(f"withheld body {type(e).__name__}")
            time.sleep(0.2)


def churner(i, station, hidden, layers, stop):
    h, p = hostport(station)
    prefill = struct.pack(f"<{4 * hidden}f", *([0.01] * (4 * hidden)))
    decode = struct.pack(f"<{hidden}f", *([0.01] * hidden))
    n = 0
    while not stop.is_set():
        sid = f"churn-{i}-{n}"
        n += 1
        try:
            c = http.client.HTTPConnection(h, p, timeout=60)
            for pos, body in ((0, prefill), (4, decode)):
                c.request("POST", "/forward", body=body, headers={
                    "x-layer-range": layers, "x-session": sid, "x-pos": str(pos),
                    "content-type": "application/octet-stream"})
                r = c.getresponse()
                r.read()
                count(f"churner {r.status}")
                if r.status == 503:
                    time.sleep(float(r.getheader("retry-after", "1")))
                    break
            c.close()
        except Exception as e:  # noqa: BLE001
            count(f"churner error {type(e).__name__}")
            time.sleep(0.2)


def streamer(i, gateway, stop):
    h, p = hostport(gateway)
    leave = i % 2 == 1
    while not stop.is_set():
        try:
            c = http.client.HTTPConnection(h, p, timeout=120)
            body = json.dumps({"model": "m", "stream": True, "max_tokens": 12,
                               "messages": [{"role": "user", "content": f"Count to ten, {i}."}]})
            c.request("POST", "/v1/chat/completions", body=body,
                      headers={"content-type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                r.read()
                count(f"stream {r.status}")
                c.close()
                time.sleep(0.5)
                continue
            if leave:
                r.readline()
                c.sock.close()
                count("stream left early")
                continue
            done = False
            while True:
                line = r.readline()
                if not line:
                    break
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                if b'"error"' in line:
                    try:
                        msg = json.loads(line.decode()[len("data: "):])["error"].get("message", "")
                    except (ValueError, KeyError, AttributeError):
                        msg = line.decode(errors="replace")
                    count(f"stream error event: {msg[:120]}")
            c.close()
            count("stream finished" if done else "stream cut short")
        except Exception as e:  # noqa: BLE001
            count(f"stream error {type(e).__name__}")
            time.sleep(0.5)


def pct(v, q):
    if not v:
        return float("nan")
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--station", required=True)
    ap.add_argument("--gateway", required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--pids", required=True)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    pids = [int(x) for x in a.pids.split(",")]
    stop = threading.Event()
    lat = []
    threads = [threading.Thread(target=health_probe, args=(a.station, stop, lat))]
    threads += [threading.Thread(target=slowloris, args=(a.station, stop)) for _ in range(20)]
    threads += [threading.Thread(target=withholder, args=(a.station, stop)) for _ in range(10)]
    threads += [threading.Thread(target=churner, args=(i, a.station, a.hidden, a.layers, stop))
                for i in range(100)]
    threads += [threading.Thread(target=streamer, args=(i, a.gateway, stop)) for i in range(40)]
    for t in threads:
        t.daemon = True
        t.start()
    peak = [0] * len(pids)
    end = time.monotonic() + a.duration
    while time.monotonic() < end:
        time.sleep(1)
        for k, pid in enumerate(pids):
            peak[k] = max(peak[k], rss_kib(pid))
    stop.set()
    # Clients blocked in a long read are left behind (daemon threads) after 20 s.
    deadline = time.monotonic() + 20
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()))
    with lock:
        c = dict(counts)
    out = {
        "health_n": len(lat),
        "health_p50_ms": pct(lat, 0.50),
        "health_p99_ms": pct(lat, 0.99),
        "health_max_ms": max(lat) if lat else float("nan"),
        "rss_peak_kib": peak,
        "counts": c,
        "threads_left": sum(t.is_alive() for t in threads),
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
