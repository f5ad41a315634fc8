#!/usr/bin/env python3
"""Dump a GGUF file's tokenizer metadata as JSON in the shape of `knot_format::TokenizerData`.

Usage: dump_tokenizer_data.py MODEL.gguf OUT.json

The field names match TokenizerData's serde names (knot-format/src/header.rs), so the output
can be read with `serde_json::from_slice::<TokenizerData>`. It is a development aid used until
the KNOT importer carries the same data, and the input of `make_golden.py`.
"""

import json
import sys

import gguf


def _field(reader, key):
    return reader.fields.get(key)


def _scalar(reader, key):
    f = _field(reader, key)
    if f is None:
        return None
    v = f.parts[f.data[0]]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(v).decode("utf-8")
    return v.tolist()[0]


def _array(reader, key, conv):
    f = _field(reader, key)
    if f is None:
        return []
    return [conv(f.parts[i]) for i in f.data]


def tokenizer_data(path):
    """Read `tokenizer.ggml.*` from a GGUF file into a TokenizerData-shaped dict."""
    r = gguf.GGUFReader(path)
    as_str = lambda p: bytes(p).decode("utf-8")
    as_int = lambda p: int(p[0])
    add_bos = _scalar(r, "tokenizer.ggml.add_bos_token")
    add_eos = _scalar(r, "tokenizer.ggml.add_eos_token")
    return {
        "model": _scalar(r, "tokenizer.ggml.model") or "",
        "pre": _scalar(r, "tokenizer.ggml.pre") or "",
        "tokens": _array(r, "tokenizer.ggml.tokens", as_str),
        "token_types": _array(r, "tokenizer.ggml.token_type", as_int),
        "merges": _array(r, "tokenizer.ggml.merges", as_str),
        "bos_id": _scalar(r, "tokenizer.ggml.bos_token_id"),
        "eos_id": _scalar(r, "tokenizer.ggml.eos_token_id"),
        "pad_id": _scalar(r, "tokenizer.ggml.padding_token_id"),
        "unk_id": _scalar(r, "tokenizer.ggml.unknown_token_id"),
        "add_bos": bool(add_bos) if add_bos is not None else False,
        "add_eos": bool(add_eos) if add_eos is not None else False,
        "chat_template": _scalar(r, "tokenizer.chat_template"),
    }


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    data = tokenizer_data(argv[1])
    with open(argv[2], "w", encoding="utf-8") as out:
        json.dump(data, out, ensure_ascii=False)
    sys.stderr.write(
        f"{argv[1]}: model={data['model']} pre={data['pre']} tokens={len(data['tokens'])} "
        f"merges={len(data['merges'])} bos={data['bos_id']} eos={data['eos_id']} "
        f"add_bos={data['add_bos']}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
