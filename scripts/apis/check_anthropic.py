#!/usr/bin/env python3
"""Anthropic's Messages API on `moonshine serve`, driven with the official `anthropic` client.

Against a gateway already running on --base-url (e.g. http://127.0.0.1:8000, no /v1):
  1. a message with a system prompt: a text block naming Paris, stop_reason end_turn, usage;
  2. the same streamed: the event sequence message_start, content_block_start/delta/stop,
     message_delta, message_stop, and the text equal to the final message's;
  3. max_tokens reached: stop_reason max_tokens, output_tokens = max_tokens;
  4. a tool: a weather question becomes a tool_use block (stop_reason tool_use, input names
     the city);
  5. the same streamed: a tool_use content block with its input as input_json_delta;
  6. tool_choice {"type": "tool"} forces that tool;
  7. a tool_use / tool_result history: the model answers from the result;
  8. count_tokens: a positive count that grows with the system prompt;
  9. bad input (an image block, no messages, a bad role): 400 in Anthropic's error shape.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/apis.rs; run by hand as
  python3 scripts/apis/check_anthropic.py --base-url http://127.0.0.1:8000
"""
import argparse
import sys

import anthropic

WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
# Greedy decoding (the current client no longer takes temperature as an argument).
GREEDY = {"temperature": 0}
TIME = {"name": "get_time", "description": "Get the current time in a time zone",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL (without /v1)")
    args = ap.parse_args()
    client = anthropic.Anthropic(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    model = "qwen"
    ask = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    m = client.messages.create(model=model, max_tokens=16, extra_body=GREEDY, system="You are a terse geography assistant.",
                               messages=ask)
    text = "".join(b.text for b in m.content if b.type == "text")
    check("message", m.type == "message" and m.role == "assistant" and "Paris" in text and m.stop_reason == "end_turn"
          and m.usage.input_tokens > 10 and m.usage.output_tokens > 0 and m.id.startswith("msg_"),
          f"stop={m.stop_reason} usage=({m.usage.input_tokens}, {m.usage.output_tokens}) {text!r}")

    kinds, deltas = [], []
    with client.messages.stream(model=model, max_tokens=16, extra_body=GREEDY,
                                system=[{"type": "text", "text": "You are a terse geography assistant."}],
                                messages=ask) as s:
        for e in s:
            kinds.append(e.type)
            if e.type == "content_block_delta" and e.delta.type == "text_delta":
                deltas.append(e.delta.text)
        final = s.get_final_message()
    ftext = "".join(b.text for b in final.content if b.type == "text")
    order = [k for k in kinds if k in ("message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop")]
    check("streamed", order == ["message_start", "content_block_start", "content_block_stop", "message_delta", "message_stop"]
          and "".join(deltas) == ftext == text and final.stop_reason == "end_turn" and final.usage.output_tokens == m.usage.output_tokens,
          f"events={order} text={''.join(deltas)!r} stop={final.stop_reason}")

    m = client.messages.create(model=model, max_tokens=5, extra_body=GREEDY,
                               messages=[{"role": "user", "content": "Tell me a long story about a dragon."}])
    check("max_tokens", m.stop_reason == "max_tokens" and m.usage.output_tokens == 5, f"stop={m.stop_reason} out={m.usage.output_tokens}")

    weather = [{"role": "user", "content": "What is the weather like in Paris today?"}]
    m = client.messages.create(model=model, max_tokens=64, extra_body=GREEDY, tools=[WEATHER, TIME], messages=weather)
    uses = [b for b in m.content if b.type == "tool_use"]
    check("tool_use", m.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
          and "Paris" in str(uses[0].input.get("city")) and uses[0].id.startswith("toolu_"),
          f"stop={m.stop_reason} content={[b.model_dump() for b in m.content]}")

    with client.messages.stream(model=model, max_tokens=64, extra_body=GREEDY, tools=[WEATHER, TIME], messages=weather) as s:
        starts = [e for e in s if e.type == "content_block_start"]
        final = s.get_final_message()
    suses = [b for b in final.content if b.type == "tool_use"]
    check("tool_use streamed", [b.content_block.type for b in starts] == ["tool_use"] and final.stop_reason == "tool_use"
          and len(suses) == 1 and uses and suses[0].input == uses[0].input,
          f"starts={[b.content_block.type for b in starts]} stop={final.stop_reason} content={[b.model_dump() for b in final.content]}")

    m = client.messages.create(model=model, max_tokens=64, extra_body=GREEDY, tools=[WEATHER, TIME],
                               tool_choice={"type": "tool", "name": "get_time"}, messages=weather)
    uses = [b for b in m.content if b.type == "tool_use"]
    check("tool_choice tool", len(uses) == 1 and uses[0].name == "get_time" and isinstance(uses[0].input.get("zone"), str),
          f"content={[b.model_dump() for b in m.content]}")

    history = weather + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "{\"temperature_celsius\": 22, \"sky\": \"sunny\"}"}]}]},
    ]
    m = client.messages.create(model=model, max_tokens=64, extra_body=GREEDY, tools=[WEATHER], messages=history)
    text = "".join(b.text for b in m.content if b.type == "text")
    check("tool_result", m.stop_reason == "end_turn" and "22" in text, f"stop={m.stop_reason} {text!r}")

    short = client.messages.count_tokens(model=model, messages=ask)
    long = client.messages.count_tokens(model=model, messages=ask, system="You are a terse geography assistant. " * 4)
    check("count_tokens", 10 < short.input_tokens < long.input_tokens, f"{short.input_tokens} < {long.input_tokens}")

    refused = []
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    for name, body in [
        ("image", {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]}),
        ("no messages", {"model": model, "max_tokens": 8}),
        ("bad role", {"model": model, "max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}),
    ]:
        try:
            client.post("/v1/messages", body=body, cast_to=object)
            refused.append((name, "accepted"))
        except anthropic.BadRequestError as e:
            b = e.body if isinstance(e.body, dict) else {}
            ok = b.get("type") == "error" and b.get("error", {}).get("type") == "invalid_request_error"
            refused.append((name, 400 if ok else f"shape {b}"))
    check("errors", all(r == 400 for _, r in refused), f"{refused}")

    total = 9
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
