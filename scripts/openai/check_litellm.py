#!/usr/bin/env python3
"""`moonshine serve` through litellm (pip install litellm), as an application using litellm
would reach an OpenAI-compatible server: model "openai/<served name>", api_base the gateway.

Checks, against a gateway already running on --base-url (e.g. http://127.0.0.1:8000/v1):
  1. litellm.text_completion (/v1/completions) continues a prompt, with usage;
  2. the same, streamed, gives the same text;
  3. litellm.completion (chat) answers;
  4. a refused field reaches the caller as litellm's BadRequestError.
Prints one line per check and exits 0 only if all pass.

Used by moonshine/tests/openai.rs; run by hand as
  python3 scripts/openai/check_litellm.py --base-url http://127.0.0.1:8000/v1
"""
import argparse
import json
import os
import sys
import urllib.request

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network look-up at import
import litellm  # noqa: E402

litellm.suppress_debug_info = True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base-url", required=True, help="gateway URL ending in /v1")
    args = ap.parse_args()
    with urllib.request.urlopen(args.base_url + "/models", timeout=30) as r:
        served = json.load(r)["data"][0]["id"]
    model = "openai/" + served
    common = {"model": model, "api_base": args.base_url, "api_key": "unused", "temperature": 0}
    failures = []

    def check(name, ok, detail):
        print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
        if not ok:
            failures.append(name)

    prompt = "The capital of France is"
    r = litellm.text_completion(prompt=prompt, max_tokens=4, **common)
    text = r.choices[0].text
    check("text_completion", "Paris" in text and r.usage.completion_tokens > 0 and r.model.endswith(served),
          f"{model}: {text!r} usage={r.usage.prompt_tokens}+{r.usage.completion_tokens}")

    pieces = []
    for chunk in litellm.text_completion(prompt=prompt, max_tokens=4, stream=True, **common):
        for c in chunk.choices:
            pieces.append(c.text or "")
    streamed = "".join(pieces)
    check("text_completion streamed", streamed == text, f"{len(pieces)} chunks {streamed!r}")

    r = litellm.completion(messages=[{"role": "user", "content": "What is the capital of France? One word."}],
                           max_tokens=8, **common)
    answer = r.choices[0].message.content
    check("completion (chat)", "Paris" in answer, f"{answer!r}")

    try:
        litellm.text_completion(prompt=prompt, max_tokens=4, best_of=3, **common)
        check("refused field", False, "best_of=3 was accepted")
    except litellm.BadRequestError as e:
        check("refused field", "best_of" in str(e), f"{type(e).__name__}: {str(e)[:160]}")

    total = 4
    print(f"{total - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
