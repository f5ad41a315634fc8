#!/usr/bin/env python3
"""Structured output through `moonshine serve`, driven with the official `openai` client.

Against a gateway already running on --base-url (e.g. http://127.0.0.1:8000/v1):
  1. twenty JSON schemas (nested objects, arrays, enums, consts, numbers, integers with
     bounds, booleans, null, anyOf, optional keys, strings that need escapes), each asked
     with response_format json_schema (one through /v1/completions, one streamed, one
     json_object): every answer ends with finish_reason "stop", parses, and validates
     against its schema (pip install jsonschema);
  2. a schema keyword the gateway does not implement is a 400 naming it (the field rule);
  3. max_tokens reached inside the document ends with finish_reason "length", not an error.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/openai.rs; run by hand as
  python3 scripts/openai/check_structured.py --base-url http://127.0.0.1:8000/v1
"""
import argparse
import json
import sys
import time

import jsonschema
import openai

S = {"type": "string"}
I = {"type": "integer"}
N = {"type": "number"}
B = {"type": "boolean"}


def obj(props, required=None):
    return {"type": "object", "properties": props, "required": list(props) if required is None else required,
            "additionalProperties": False}


# (name, prompt, schema)
CASES = [
    ("person", "Describe Ada Lovelace as JSON with her name and age at death.", obj({"name": S, "age": I})),
    ("address", "Give the address of the Eiffel Tower as JSON.",
     obj({"name": S, "address": obj({"street": S, "city": S, "zip": S})})),
    ("tags", "List three tags for a blog post about Rust programming, as JSON.",
     obj({"tags": {"type": "array", "items": S, "minItems": 1, "maxItems": 5}})),
    ("enum", "What colour is the sky on a clear day? Answer as JSON.",
     obj({"color": {"enum": ["red", "green", "blue"]}})),
    ("bool-null", "Is water wet? Answer as JSON, with a null note.", obj({"ok": B, "note": {"type": "null"}})),
    ("price-const", "A coffee costs 3.5 euros. Give the price as JSON.",
     obj({"price": N, "currency": {"const": "EUR"}})),
    ("order-lines", "An order: two apples and one pear. Give the order lines as JSON.",
     obj({"items": {"type": "array", "maxItems": 3, "items": obj({"name": S, "qty": I})}})),
    ("anyof-scalar", "Give the answer to life, the universe and everything as JSON.",
     obj({"value": {"anyOf": [I, S]}})),
    ("escapes", 'Quote this Windows path and sentence exactly in JSON: C:\\temp\\new and she said "hi".',
     obj({"path": S, "sentence": S})),
    ("int-array", "Give the first five prime numbers as a JSON array.",
     {"type": "array", "items": I, "minItems": 5, "maxItems": 5}),
    ("bounded-int", "Rate the film Casablanca from 1 to 5, as JSON.",
     obj({"rating": {"type": "integer", "minimum": 1, "maximum": 5}})),
    ("matrix", "Give the 2x2 identity matrix as JSON.",
     obj({"matrix": {"type": "array", "maxItems": 3, "items": {"type": "array", "items": I, "maxItems": 3}}})),
    ("optional-keys", "Give the title of a book about the sea as JSON.",
     obj({"title": S, "subtitle": S}, required=["title"])),
    ("number-enum", "Pick the largest of 1, 2 and 3, as JSON.", obj({"pick": {"enum": [1, 2, 3]}})),
    ("deep", "Nest the word 'core' four objects deep in JSON under keys a, b, c, d.",
     obj({"a": obj({"b": obj({"c": obj({"d": S})})})})),
    ("code", "Write a one-line Python hello world program as JSON with its language.",
     obj({"language": {"enum": ["python", "rust", "c"]}, "code": S})),
    ("short-string", "Summarise the plot of Hamlet very briefly as JSON.",
     obj({"summary": {"type": "string", "maxLength": 40}})),
    ("record", "Describe a user with id 7 who is active, has score 9.5 and two tags, as JSON.",
     obj({"id": I, "active": B, "score": N, "tags": {"type": "array", "items": S, "maxItems": 4}})),
    ("shape", "Describe a circle of radius 2 as JSON.",
     obj({"shape": {"anyOf": [obj({"kind": {"const": "circle"}, "radius": N}),
                              obj({"kind": {"const": "square"}, "side": N})]}})),
    ("json-object", "Give a JSON object describing the planet Mars (name and moons).", None),
]
MODES = {"tags": "completions", "address": "stream", "json-object": "json_object"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL ending in /v1")
    ap.add_argument("--max-tokens", type=int, default=120)
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="unused", timeout=600, max_retries=0)
    model = client.models.list().data[0].id
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    for name, prompt, schema in CASES:
        mode = MODES.get(name, "chat")
        rf = ({"type": "json_object"} if schema is None else
              {"type": "json_schema", "json_schema": {"name": name.replace("-", "_"), "strict": True, "schema": schema}})
        messages = [{"role": "user", "content": prompt}]
        t = time.time()
        if mode == "completions":
            r = client.completions.create(model=model, prompt=prompt + "\nJSON: ", max_tokens=args.max_tokens,
                                          temperature=0, extra_body={"response_format": rf})
            text, finish = r.choices[0].text, r.choices[0].finish_reason
        elif mode == "stream":
            pieces, finish = [], None
            for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                                        temperature=0, response_format=rf, stream=True):
                for c in chunk.choices:
                    pieces.append(c.delta.content or "")
                    finish = c.finish_reason or finish
            text = "".join(pieces)
        else:
            r = client.chat.completions.create(model=model, messages=messages, max_tokens=args.max_tokens,
                                               temperature=0, response_format=rf)
            text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        try:
            doc = json.loads(text)
            jsonschema.validate(doc, schema if schema is not None else {"type": "object"})
            ok, why = finish == "stop", "valid"
        except (ValueError, jsonschema.ValidationError) as e:
            ok, why = False, f"{type(e).__name__}: {str(e).splitlines()[0]}"
        check(f"schema {name} ({mode})", ok, f"{why}, finish={finish} in {time.time() - t:.1f} s: {text}")

    try:
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "object", "properties": {"a": I}, "if": {"required": ["a"]}, "then": {"required": ["b"]}}}})
        check("unimplemented keyword refused", False, "a schema with if/then was accepted")
    except openai.BadRequestError as e:
        check("unimplemented keyword refused",
              e.status_code == 400 and getattr(e, "param", None) == "response_format" and '"if"' in str(e),
              f"{e.status_code} param={getattr(e, 'param', None)} {e}")

    schema = obj({"story": S})
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell a long story as JSON."}],
                                       max_tokens=6, temperature=0,
                                       response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    text = r.choices[0].message.content
    check("max_tokens inside the document", r.choices[0].finish_reason == "length" and text.startswith('{"story": "'),
          f"finish={r.choices[0].finish_reason} {text!r}")

    total = len(CASES) + 2
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
