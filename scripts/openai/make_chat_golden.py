#!/usr/bin/env python3
"""Golden chat-template renderings for moonshine's minijinja renderer.

Reads each model's chat template from its GGUF (tokenizer.chat_template), renders a few
conversations with Jinja2 the way Hugging Face transformers does (trim_blocks, lstrip_blocks,
raise_exception), and writes moonshine/tests/golden/chat_templates.json:
  [{"model", "template", "cases": [{"messages", "add_generation_prompt", "text"}]}]
Run: python3 scripts/openai/make_chat_golden.py [MODELS_DIR]
"""
import json
import os
import sys

import jinja2
from gguf import GGUFReader

MODELS = ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "smollm2-135m-instruct-q4_1.gguf"]
CONVERSATIONS = [
    ([{"role": "user", "content": "What is the capital of France?"}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Tell me a joke."}], True),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], False),
]


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.expanduser("~/.cache/aeon-shell/models")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    out = []
    for m in MODELS:
        f = GGUFReader(os.path.join(d, m)).fields["tokenizer.chat_template"]
        src = bytes(f.parts[f.data[0]]).decode()
        t = env.from_string(src)
        cases = [{"messages": msgs, "add_generation_prompt": agp,
                  "text": t.render(messages=msgs, add_generation_prompt=agp, bos_token="", eos_token="<|im_end|>")}
                 for msgs, agp in CONVERSATIONS]
        out.append({"model": m, "template": src, "cases": cases})
    path = os.path.join(os.path.dirname(__file__), "../../moonshine/tests/golden/chat_templates.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(out, fh, indent=1, ensure_ascii=False)
        fh.write("\n")
    os.replace(path + ".tmp", path)
    print(f"wrote {os.path.normpath(path)}: {sum(len(o['cases']) for o in out)} cases")


if __name__ == "__main__":
    main()
