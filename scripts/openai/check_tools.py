#!/usr/bin/env python3
"""Tool calls through `moonshine serve`, driven with the official `openai` client.

Against a gateway already running on --base-url (e.g. http://127.0.0.1:8000/v1):
  1. tool_choice auto: a weather question becomes a get_weather call (tool_calls,
     finish_reason "tool_calls", arguments JSON naming the city);
  2. the same streamed: the call arrives as tool_calls deltas, no call text as content;
  3. tool_choice "required" on a greeting: still a call, its arguments valid against the
     function's parameters (jsonschema);
  4. tool_choice naming a function: a call to that one;
  5. a history with the assistant's tool_calls and a tool message: the model answers from
     the tool's result;
  6. tool_choice "none": plain content, no tool_calls;
  7. a malformed tool is a 400 naming `tools`.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/openai.rs; run by hand as
  python3 scripts/openai/check_tools.py --base-url http://127.0.0.1:8000/v1
"""
import argparse
import json
import sys

import jsonschema
import openai

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
PARAMS = {"get_weather": WEATHER["function"]["parameters"], "get_time": TIME["function"]["parameters"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL ending in /v1")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    def valid(call):
        try:
            jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])
            return True
        except (ValueError, KeyError, jsonschema.ValidationError):
            return False

    ask = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    common = {"model": model, "temperature": 0, "max_tokens": 64}
    r = client.chat.completions.create(messages=ask, tools=[WEATHER, TIME], **common)
    m = r.choices[0].message
    calls = m.tool_calls or []
    check("auto", r.choices[0].finish_reason == "tool_calls" and len(calls) == 1
          and calls[0].function.name == "get_weather" and "Paris" in calls[0].function.arguments and valid(calls[0]),
          f"finish={r.choices[0].finish_reason} content={m.content!r} calls={[(c.function.name, c.function.arguments) for c in calls]}")

    content, deltas, finish = [], {}, None
    for chunk in client.chat.completions.create(messages=ask, tools=[WEATHER, TIME], stream=True, **common):
        for c in chunk.choices:
            content.append(c.delta.content or "")
            for d in c.delta.tool_calls or []:
                e = deltas.setdefault(d.index, {"name": "", "arguments": "", "id": None})
                e["id"] = d.id or e["id"]
                e["name"] += (d.function.name or "") if d.function else ""
                e["arguments"] += (d.function.arguments or "") if d.function else ""
            finish = c.finish_reason or finish
    got = [(e["name"], e["arguments"]) for e in deltas.values()]
    check("auto streamed", finish == "tool_calls" and "".join(content) == "" and calls
          and got == [(calls[0].function.name, calls[0].function.arguments)] and all(e["id"] for e in deltas.values()),
          f"finish={finish} content={''.join(content)!r} calls={got}")

    r = client.chat.completions.create(messages=[{"role": "user", "content": "Hello there!"}], tools=[WEATHER],
                                       tool_choice="required", **common)
    calls = r.choices[0].message.tool_calls or []
    check("required", r.choices[0].finish_reason == "tool_calls" and len(calls) == 1 and valid(calls[0]),
          f"calls={[(c.function.name, c.function.arguments) for c in calls]}")

    r = client.chat.completions.create(messages=ask, tools=[WEATHER, TIME],
                                       tool_choice={"type": "function", "function": {"name": "get_time"}}, **common)
    calls = r.choices[0].message.tool_calls or []
    check("named function", len(calls) == 1 and calls[0].function.name == "get_time" and valid(calls[0]),
          f"calls={[(c.function.name, c.function.arguments) for c in calls]}")

    history = ask + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_celsius\": 22, \"sky\": \"sunny\"}"},
    ]
    r = client.chat.completions.create(messages=history, tools=[WEATHER], **common)
    m = r.choices[0].message
    check("tool result in history", not m.tool_calls and m.content and "22" in m.content,
          f"finish={r.choices[0].finish_reason} {m.content!r}")

    r = client.chat.completions.create(messages=ask, tools=[WEATHER], tool_choice="none", **common)
    m = r.choices[0].message
    check("none", not m.tool_calls and m.content and r.choices[0].finish_reason in ("stop", "length"),
          f"{m.content[:60]!r}")

    try:
        client.chat.completions.create(messages=ask, tools=[{"type": "function", "function": {}}], **common)
        check("malformed tool refused", False, "accepted")
    except openai.BadRequestError as e:
        check("malformed tool refused", getattr(e, "param", None) == "tools", f"{e.status_code} param={getattr(e, 'param', None)}")

    total = 7
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
