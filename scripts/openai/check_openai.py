#!/usr/bin/env python3
"""Drive `moonshine serve` with the official `openai` client (pip install openai).

Checks, against a gateway already running on --base-url (e.g. http://127.0.0.1:8000/v1):
  1. GET /v1/models lists one model;
  2. a non-streamed chat completion answers "Paris" and reports usage;
  3. a streamed one does the same, chunk by chunk, with a usage chunk when asked;
  4. a bad request is a 400 with an OpenAI-style error;
  5. a client that disconnects mid-stream frees its session: the gateway's /metrics shows
     moonshine_cancelled_total up by one and moonshine_sessions_busy back to 0, and the
     cancelled generation stopped long before max_tokens;
  6. logprobs with top_logprobs, streamed and not: the tokens spell the answer;
  7. a field the gateway cannot honour (llama.cpp's mirostat) is a 400 naming it;
  8. /v1/completions, streamed and not, and fill-in-the-middle through `suffix`;
  9. /metrics parses with prometheus_client (pip install prometheus_client): the latency
     histograms counted the generations above, and no gauge is named *_total.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/openai.rs; run by hand as
  python3 scripts/openai/check_openai.py --base-url http://127.0.0.1:8000/v1
"""
import argparse
import re
import sys
import time
import urllib.request

import openai
from prometheus_client.parser import text_string_to_metric_families

QUESTION = "What is the capital of France? Answer in one word."


def metrics(base):
    root = base.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(root + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        m = re.match(r"^([a-z_]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m and not m.group(2):
            out[m.group(1)] = float(m.group(3))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL ending in /v1")
    ap.add_argument("--max-tokens", type=int, default=24)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    models = client.models.list().data
    check("models", len(models) == 1 and models[0].id, f"{[m.id for m in models]}")
    model = models[0].id if models else "x"
    messages = [{"role": "user", "content": QUESTION}]

    t = time.time()
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=args.max_tokens)
    text = r.choices[0].message.content
    check("non-streamed", "Paris" in text and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 10
          and r.choices[0].finish_reason in ("stop", "length") and r.object == "chat.completion",
          f"{text!r} usage={r.usage.prompt_tokens}+{r.usage.completion_tokens} finish={r.choices[0].finish_reason} in {time.time() - t:.1f} s")

    t = time.time()
    pieces, finish, usage = [], None, None
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=args.max_tokens,
                                                stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    streamed = "".join(pieces)
    check("streamed", "Paris" in streamed and streamed == text and finish in ("stop", "length") and usage is not None
          and usage.completion_tokens == r.usage.completion_tokens,
          f"{len(pieces)} chunks {streamed!r} finish={finish} usage={usage and usage.completion_tokens} in {time.time() - t:.1f} s")

    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=0)
        check("bad request", False, "max_tokens=0 was accepted")
    except openai.BadRequestError as e:
        check("bad request", e.status_code == 400 and "max_tokens" in str(e), f"{e.status_code} {e}")

    before = metrics(args.base_url)
    long_max = 2000
    stream = client.chat.completions.create(model=model, temperature=0.8, seed=1, max_tokens=long_max, stream=True,
                                            messages=[{"role": "user", "content": "Write a very long story about a lighthouse keeper, in many chapters."}])
    got = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            got += 1
        if got >= 3:
            break
    stream.close()
    deadline = time.time() + 60
    after = metrics(args.base_url)
    while time.time() < deadline and (after.get("moonshine_cancelled_total", 0) <= before.get("moonshine_cancelled_total", 0)
                                      or after.get("moonshine_sessions_busy", 1) != 0):
        time.sleep(0.2)
        after = metrics(args.base_url)
    cancelled = after.get("moonshine_cancelled_total", 0) - before.get("moonshine_cancelled_total", 0)
    generated = after.get("moonshine_completion_tokens_total", 0) - before.get("moonshine_completion_tokens_total", 0)
    check("disconnect frees the session", cancelled == 1 and after.get("moonshine_sessions_busy") == 0 and generated < long_max // 4,
          f"cancelled {cancelled:.0f}, sessions busy {after.get('moonshine_sessions_busy')}, {generated:.0f} tokens generated before stopping")

    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=args.max_tokens,
                                       logprobs=True, top_logprobs=2)
    lps = r.choices[0].logprobs.content
    spelled = "".join(t.token for t in lps)
    pieces = []
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=args.max_tokens,
                                                logprobs=True, top_logprobs=2, stream=True):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                pieces.extend(c.logprobs.content)
    check("logprobs", spelled == r.choices[0].message.content and all(len(t.top_logprobs) == 2 and t.logprob <= 0 for t in lps)
          and [t.token for t in pieces] == [t.token for t in lps] and [t.logprob for t in pieces] == [t.logprob for t in lps],
          f"{len(lps)} tokens {spelled!r}, first {lps[0].token!r} {lps[0].logprob:.3f} (top {[(a.token, round(a.logprob, 3)) for a in lps[0].top_logprobs]}); {len(pieces)} streamed")

    try:
        client.chat.completions.create(model=model, messages=messages, max_tokens=4, extra_body={"mirostat": 2})
        check("unhonoured field refused", False, "mirostat 2 was accepted")
    except openai.BadRequestError as e:
        check("unhonoured field refused", e.status_code == 400 and getattr(e, "param", None) == "mirostat",
              f"{e.status_code} param={getattr(e, 'param', None)}")

    prompt = "The capital of France is"
    c = client.completions.create(model=model, prompt=prompt, max_tokens=4, temperature=0)
    streamed = "".join(ch.choices[0].text for ch in client.completions.create(model=model, prompt=prompt, max_tokens=4,
                                                                             temperature=0, stream=True) if ch.choices)
    fim = client.completions.create(model=model, prompt="def add(a, b):\n    return ", suffix="\n\nprint(add(1, 2))\n",
                                    max_tokens=8, temperature=0)
    middle = fim.choices[0].text
    check("completions and fill-in-the-middle", "Paris" in c.choices[0].text and streamed == c.choices[0].text
          and c.object == "text_completion" and "a" in middle and "b" in middle and "+" in middle,
          f"{c.choices[0].text!r} streamed {streamed!r}; middle {middle!r}")

    root = args.base_url.rsplit("/v1", 1)[0]
    with urllib.request.urlopen(root + "/metrics", timeout=30) as resp:
        families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
    ttft = families.get("moonshine_time_to_first_token_seconds")
    count = next((s.value for s in ttft.samples if s.name.endswith("_count")), 0) if ttft else 0
    itl = families.get("moonshine_inter_token_latency_seconds")
    gauges_total = [n for n, f in families.items() if f.type == "gauge" and n.endswith("_total")]
    check("metrics parse", ttft is not None and ttft.type == "histogram" and count >= 5 and itl is not None
          and itl.type == "histogram" and families.get("moonshine_requests_running") is not None and not gauges_total,
          f"{len(families)} families, time_to_first_token count {count}, gauges named *_total {gauges_total}")

    total = 9
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
