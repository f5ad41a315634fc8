#!/usr/bin/env python3
"""A station's GET /metrics, parsed with prometheus_client (pip install prometheus_client).

Checks, against a fat-station that has served some generations (e.g. through the gateway):
  1. the text parses; the request counter counted /embed and /lm-head answers;
  2. the KV/session gauges are gauges (fat_station_sessions, fat_station_kv_cache_bytes,
     fat_station_kv_cache_usage_ratio in 0..1, fat_station_kv_cache_tokens > 0 while a
     session is live), and no gauge is named *_total;
  3. fat_station_compute_seconds and fat_station_queue_seconds are histograms in seconds whose
     count matches the compute requests (every /embed, /forward, /lm-head is one).
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/openai.rs; run by hand as
  python3 scripts/openai/check_station_metrics.py --url http://127.0.0.1:8090
"""
import argparse
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="station base URL")
    args = ap.parse_args()
    with urllib.request.urlopen(args.url + "/metrics", timeout=30) as r:
        ctype = r.headers.get("content-type", "")
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    def value(name):
        f = fams.get(name)
        return f.samples[0].value if f and f.samples else None

    reqs = fams.get("fat_station_requests")  # prometheus_client drops a counter's _total
    by_route = {}
    for s in reqs.samples if reqs else []:
        if s.name.endswith("_total"):
            by_route[s.labels["route"]] = by_route.get(s.labels["route"], 0) + s.value
    check("requests counted", ctype.startswith("text/plain") and reqs is not None and reqs.type == "counter"
          # one trip per token (/chain), or the gateway driving each hop (/embed ... /lm-head)
          and (by_route.get("/chain", 0) > 0
               or (by_route.get("/embed", 0) > 0 and by_route.get("/lm-head", 0) > 0)),
          f"{len(fams)} families; requests by route {by_route}")

    gauges = ["fat_station_sessions", "fat_station_kv_cache_bytes", "fat_station_kv_cache_usage_ratio",
              "fat_station_kv_cache_tokens", "fat_station_requests_running", "fat_station_requests_waiting"]
    types = {g: fams[g].type if g in fams else None for g in gauges}
    ratio = value("fat_station_kv_cache_usage_ratio")
    total_gauges = [n for n, f in fams.items() if f.type == "gauge" and n.endswith("_total")]
    check("KV and session gauges", all(t == "gauge" for t in types.values()) and value("fat_station_sessions") >= 1
          and value("fat_station_kv_cache_bytes") > 0 and ratio is not None and 0 < ratio <= 1
          and value("fat_station_kv_cache_tokens") > 0 and not total_gauges,
          f"sessions {value('fat_station_sessions')}, kv bytes {value('fat_station_kv_cache_bytes')}, usage {ratio}, "
          f"kv tokens {value('fat_station_kv_cache_tokens')}, gauges named *_total {total_gauges}")

    def hist(name):
        f = fams.get(name)
        if f is None or f.type != "histogram":
            return None, None
        count = next((s.value for s in f.samples if s.name.endswith("_count")), None)
        total = next((s.value for s in f.samples if s.name.endswith("_sum")), None)
        return count, total

    (cc, cs), (qc, _) = hist("fat_station_compute_seconds"), hist("fat_station_queue_seconds")
    computes = sum(by_route.get(r, 0) for r in ("/embed", "/forward", "/lm-head"))
    check("compute histograms in seconds", cc is not None and cc >= computes and qc is not None and qc >= cc and 0 < cs / cc < 10,
          f"compute count {cc} (embed+forward+lm-head answers {computes}), mean {cs / cc if cc else 0:.4f} s; queue count {qc}")

    total = 3
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
