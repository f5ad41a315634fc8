#!/usr/bin/env python3
"""OpenAI's Responses API (`/v1/responses`) on `moonshine serve`, driven with the official
`openai` client's `client.responses.create`.

Against a gateway already running on --base-url (e.g. http://127.0.0.1:8000/v1):
  1. input as a string with instructions: output_text names Paris, status completed, ids
     resp_ / msg_, usage;
  2. input as items (system + user), streamed: created, in_progress, output_item.added,
     content_part.added, output_text.delta..., output_text.done, content_part.done,
     output_item.done, completed, in order, the item ids agreeing, the deltas joining to
     the completed response's output_text, sequence numbers 0, 1, 2, ...;
  3. max_output_tokens reached: status incomplete, reason max_output_tokens;
  4. a function tool: a weather question becomes a function_call item with the city;
  5. the same streamed: output_item.added with a function_call, its arguments done;
  6. a function_call / function_call_output history: the answer uses the result;
  7. text.format json_schema: the answer parses and has the required keys;
  8. bad input (previous_response_id, an image part, no input): 400 naming the field.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/apis.rs; run by hand as
  python3 scripts/apis/check_responses.py --base-url http://127.0.0.1:8000/v1
"""
import argparse
import json
import sys

import openai

WEATHER = {"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL ending in /v1")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    model = "gpt-4.1"
    r = client.responses.create(model=model, instructions="You are a terse geography assistant.",
                                input="What is the capital of France? Answer in one word.", temperature=0)
    check("string input", "Paris" in r.output_text and r.status == "completed" and r.id.startswith("resp_")
          and r.output[0].id.startswith("msg_") and r.usage.input_tokens > 10 and r.usage.output_tokens > 0,
          f"{r.output_text!r} status={r.status} usage=({r.usage.input_tokens}, {r.usage.output_tokens})")

    items = [{"role": "system", "content": "You are a terse geography assistant."},
             {"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France? Answer in one word."}]}]
    events = list(client.responses.create(model=model, input=items, temperature=0, stream=True))
    kinds = [e.type for e in events]
    want = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    done = ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    msg_ids = {getattr(e, "item_id", None) or e.item.id for e in events
               if e.type.startswith(("response.output_item", "response.content_part", "response.output_text"))}
    last = events[-1].response if events and events[-1].type == "response.completed" else None
    check("streamed", kinds[:4] == want and kinds[-4:] == done and set(kinds[4:-4]) == {"response.output_text.delta"}
          and len(msg_ids) == 1 and last is not None and "".join(deltas) == last.output_text == r.output_text
          and [e.sequence_number for e in events] == list(range(len(events))) and last.id == events[0].response.id,
          f"{kinds[:5]}...{kinds[-4:]} text={''.join(deltas)!r}")

    r = client.responses.create(model=model, input="Tell me a long story about a dragon.", max_output_tokens=6, temperature=0)
    check("max_output_tokens", r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
          and r.usage.output_tokens == 6, f"status={r.status} {r.incomplete_details} out={r.usage.output_tokens}")

    ask = "What is the weather like in Paris today?"
    r = client.responses.create(model=model, input=ask, tools=[WEATHER], temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    check("function call", len(calls) == 1 and calls[0].name == "get_weather"
          and json.loads(calls[0].arguments).get("city") == "Paris" and calls[0].call_id,
          f"output={[o.model_dump(exclude_none=True) for o in r.output]}")

    events = list(client.responses.create(model=model, input=ask, tools=[WEATHER], temperature=0, stream=True))
    added = [e.item for e in events if e.type == "response.output_item.added"]
    args_done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    check("function call streamed", [i.type for i in added] == ["function_call"] and calls
          and args_done == [calls[0].arguments] and events[-1].type == "response.completed",
          f"added={[i.type for i in added]} args={args_done}")

    history = [{"role": "user", "content": ask},
               {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
               {"type": "function_call_output", "call_id": "call_1", "output": "{\"temperature_celsius\": 22, \"sky\": \"sunny\"}"}]
    r = client.responses.create(model=model, input=history, tools=[WEATHER], temperature=0, max_output_tokens=64)
    check("function_call_output", "22" in r.output_text, f"{r.output_text!r}")

    schema = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    r = client.responses.create(model=model, input="Give the capital of France as JSON.", temperature=0, max_output_tokens=64,
                                text={"format": {"type": "json_schema", "name": "place", "schema": schema}})
    try:
        ok = set(json.loads(r.output_text)) == {"city", "country"}
    except ValueError:
        ok = False
    check("json_schema", ok, f"{r.output_text!r}")

    refused = []
    for name, kw, param in [
        ("previous_response_id", {"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ("image", {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}, "input"),
        ("no input", {"input": []}, "input"),
    ]:
        try:
            client.responses.create(model=model, **kw)
            refused.append((name, "accepted"))
        except openai.BadRequestError as e:
            refused.append((name, 400 if getattr(e, "param", None) == param else f"param={getattr(e, 'param', None)}"))
    check("errors", all(r == 400 for _, r in refused), f"{refused}")

    total = 8
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
