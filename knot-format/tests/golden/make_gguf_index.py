#!/usr/bin/env python3
"""Writes a golden index of a GGUF file using the reference reader (PyPI `gguf`).

    python3 knot-format/tests/golden/make_gguf_index.py MODEL.gguf > OUT.json

The index is an independent witness for `knot-format`'s own GGUF reader and importer:
for every tensor its name, GGML type id, shape (GGML order), absolute data offset, byte
length and the SHA-256 of its bytes; plus the token and merge counts. `tests/real_qwen.rs`
checks the KNOT it imports against it.
"""
import hashlib
import json
import sys

from gguf import GGUFReader


def main(path: str) -> None:
    r = GGUFReader(path)
    data = r.data  # numpy memmap of the whole file
    tensors = []
    for t in r.tensors:
        raw = data[t.data_offset : t.data_offset + t.n_bytes].tobytes()
        tensors.append(
            {
                "name": t.name,
                "ggml_type": int(t.tensor_type),
                "shape": [int(d) for d in t.shape],
                "offset": int(t.data_offset),
                "n_bytes": int(t.n_bytes),
                "sha256": hashlib.sha256(raw).hexdigest(),
            }
        )
    fields = r.fields
    index = {
        "source": path.rsplit("/", 1)[-1],
        "architecture": bytes(fields["general.architecture"].parts[-1]).decode(),
        "tensor_count": len(tensors),
        "n_tokens": len(fields["tokenizer.ggml.tokens"].data),
        "n_merges": len(fields["tokenizer.ggml.merges"].data),
        "tensors": tensors,
    }
    # One tensor per line keeps diffs readable.
    head = {k: v for k, v in index.items() if k != "tensors"}
    out = json.dumps(head, indent=1)[:-2] + ',\n "tensors": [\n'
    out += ",\n".join("  " + json.dumps(t) for t in tensors)
    sys.stdout.write(out + "\n ]\n}\n")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
