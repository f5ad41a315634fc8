#!/usr/bin/env python3
"""Ollama's API on `moonshine serve`, driven with the official `ollama` Python client.

Against a gateway already running on --base-url (e.g. http://127.0.0.1:8000):
  1. list (/api/tags), show (/api/show), version (/api/version);
  2. chat: an answer naming Paris, done_reason stop, the token counts;
  3. the same streamed (NDJSON): the pieces join to the whole answer, one done object last;
  4. options: num_predict bounds the answer (done_reason length, eval_count), seed makes a
     sampled answer repeat, stop ends it before the stop text;
  5. generate: templated (system + prompt) and raw (a code continuation), streamed too;
  6. format "json" and a schema: the answer parses as JSON (and matches the schema);
  7. tools: a weather question becomes a get_weather call with the city; a tool result in
     the history is answered from;
  8. bad input (an image, a bad format, no model): a 400 with Ollama's {"error": ...};
  9. embed (/api/embed): one unit vector per input, the same as /v1/embeddings'.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/apis.rs; run by hand as
  python3 scripts/apis/check_ollama.py --base-url http://127.0.0.1:8000
"""
import argparse
import json
import sys

import httpx
import ollama

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL")
    args = ap.parse_args()
    c = ollama.Client(host=args.base_url, timeout=600)
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    models = c.list().models
    show = c.show(models[0].model if models else "x")
    version = httpx.get(f"{args.base_url}/api/version").json().get("version")
    check("tags, show, version", len(models) == 1 and "completion" in (show.capabilities or []) and bool(show.template)
          and isinstance(version, str), f"models={[m.model for m in models]} caps={show.capabilities} version={version}")

    model = "qwen2.5-coder:0.5b"
    ask = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    greedy = {"temperature": 0, "num_predict": 16}
    r = c.chat(model=model, messages=ask, options=greedy)
    check("chat", "Paris" in r.message.content and r.done and r.done_reason == "stop" and r.prompt_eval_count > 10
          and r.eval_count > 0 and r.model == model, f"{r.message.content!r} reason={r.done_reason} counts=({r.prompt_eval_count}, {r.eval_count})")

    parts = list(c.chat(model=model, messages=ask, options=greedy, stream=True))
    text = "".join(p.message.content for p in parts)
    check("chat streamed", text == r.message.content and parts[-1].done and not any(p.done for p in parts[:-1])
          and parts[-1].eval_count == r.eval_count, f"{len(parts)} objects {text!r}")

    story = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    r = c.chat(model=model, messages=story, options={"temperature": 0, "num_predict": 5})
    a = c.chat(model=model, messages=story, options={"temperature": 1.0, "seed": 7, "num_predict": 12}).message.content
    b = c.chat(model=model, messages=story, options={"temperature": 1.0, "seed": 7, "num_predict": 12}).message.content
    s = c.chat(model=model, messages=ask, options={"temperature": 0, "stop": ["ris"]}).message.content
    check("options", r.done_reason == "length" and r.eval_count == 5 and a == b and "ris" not in s and "Pa" in s,
          f"length={r.done_reason}/{r.eval_count} seed {a == b} stop={s!r}")

    g = c.generate(model=model, system="Answer in one word.", prompt="What is the capital of France?", options=greedy)
    raw = c.generate(model=model, prompt="def fibonacci(n):", raw=True, options={"temperature": 0, "num_predict": 24})
    rs = "".join(p.response for p in c.generate(model=model, prompt="def fibonacci(n):", raw=True,
                                                options={"temperature": 0, "num_predict": 24}, stream=True))
    check("generate", "Paris" in g.response and "return" in raw.response and rs == raw.response,
          f"{g.response!r} raw={raw.response!r}")

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"]}
    j = c.chat(model=model, messages=[{"role": "user", "content": "Name a city in JSON."}], format="json", options=greedy)
    k = c.chat(model=model, messages=[{"role": "user", "content": "Give the capital of France as JSON."}], format=schema,
               options={"temperature": 0, "num_predict": 64})
    try:
        jv, kv = json.loads(j.message.content), json.loads(k.message.content)
        ok = isinstance(jv, dict) and set(schema["required"]) <= set(kv)
    except ValueError:
        ok = False
    check("format", ok, f"json={j.message.content!r} schema={k.message.content!r}")

    weather = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    r = c.chat(model=model, messages=weather, tools=[WEATHER], options={"temperature": 0, "num_predict": 64})
    calls = r.message.tool_calls or []
    history = weather + [
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "{\"temperature_celsius\": 22, \"sky\": \"sunny\"}"},
    ]
    h = c.chat(model=model, messages=history, tools=[WEATHER], options={"temperature": 0, "num_predict": 64})
    check("tools", len(calls) == 1 and calls[0].function.name == "get_weather" and "Paris" in str(calls[0].function.arguments.get("city"))
          and "22" in (h.message.content or ""), f"calls={[(x.function.name, x.function.arguments) for x in calls]} then {h.message.content!r}")

    refused = []
    for name, path, body in [
        ("image", "/api/chat", {"model": model, "stream": False, "messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}]}),
        ("bad format", "/api/chat", {"model": model, "stream": False, "messages": ask, "format": 3}),
        ("no model", "/api/generate", {"prompt": "hi", "stream": False}),
    ]:
        resp = httpx.post(f"{args.base_url}{path}", json=body, timeout=60)
        try:
            err = resp.json().get("error")
        except ValueError:
            err = None
        refused.append((name, resp.status_code if isinstance(err, str) and err else f"{resp.status_code} {resp.text[:80]}"))
    try:
        c.chat(model=model, messages=[{"role": "user", "content": "hi", "images": [b"\x89PNG"]}], stream=False)
        client_err = "accepted"
    except ollama.ResponseError as e:
        client_err = e.status_code
    check("errors", all(r == 400 for _, r in refused) and client_err == 400, f"{refused} client={client_err}")

    e = c.embed(model=model, input=["The capital of France is Paris.", "def f(): pass"])
    o = httpx.post(f"{args.base_url}/v1/embeddings", json={"input": ["The capital of France is Paris."]}, timeout=60).json()
    norms = [sum(x * x for x in v) ** 0.5 for v in e.embeddings]
    check("embed", len(e.embeddings) == 2 and all(abs(n - 1) < 1e-4 for n in norms)
          and list(e.embeddings[0]) == o["data"][0]["embedding"] and e.prompt_eval_count > 5,
          f"{len(e.embeddings)} vectors of {len(e.embeddings[0]) if e.embeddings else 0}, norms {norms}")

    total = 9
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
