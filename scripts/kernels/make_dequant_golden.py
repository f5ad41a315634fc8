#!/usr/bin/env python3
"""Write the dequantization golden file for fat-station's kernel tests.

An independent implementation (PyPI `gguf`, `gguf.quants.dequantize`) dequantizes:
  * real rows: for every tensor dtype in the two cached models, a few rows of one tensor;
  * synthetic rows for every quantized dtype: random bytes with sane f16 scales (covers every
    bit pattern, including the ones real models rarely use), and `gguf.quants.quantize` output
    for the dtypes it can produce that the models lack.

Output (little-endian), read by fat-station/tests/kernels_gguf.rs:
  b"KGOLD1\\0\\0", u32 record count, then per record:
  u32 ggml_type, u32 rows, u32 cols, u16 name length, name (utf-8),
  rows * row_bytes raw block bytes, rows * cols f32 dequantized values.

Usage: python3 scripts/kernels/make_dequant_golden.py [MODELS_DIR] [OUT]
"""
import os
import struct
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

MODELS = os.environ.get("AEON_MODELS_DIR", os.path.expanduser("~/.cache/aeon-shell/models"))
FILES = ["qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "smollm2-135m-instruct-q4_1.gguf"]
ROWS = 4  # rows per real tensor

# Byte offsets of f16 scale fields per block, for random synthetic blocks.
F16_FIELDS = {
    T.Q4_0: [0], T.Q5_0: [0], T.Q8_0: [0],
    T.Q4_1: [0, 2], T.Q5_1: [0, 2], T.Q4_K: [0, 2], T.Q5_K: [0, 2],
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q6_K: [208],
    T.IQ4_NL: [0], T.IQ4_XS: [0],
}
# MXFP4's scale is one e8m0 byte (at 0): random blocks get exponents around 2^-8 (and the
# subnormal halves e = 0, 1 in some blocks). Last in ALL, so the records before it keep their
# random draws.
E8M0_FIELDS = {T.MXFP4: 0}
ALL = [T.F32, T.F16, T.BF16] + list(F16_FIELDS) + list(E8M0_FIELDS)


def record(out, qtype, name, raw, rows, cols):
    raw = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    block, tsize = gguf.GGML_QUANT_SIZES[qtype]
    assert cols % block == 0 and raw.shape[1] == cols // block * tsize, (name, raw.shape)
    vals = dequantize(raw, qtype).astype(np.float32).reshape(rows, cols)
    assert np.all(np.isfinite(vals)), name
    nb = name.encode()
    out.append(struct.pack("<IIIH", int(qtype), rows, cols, len(nb)) + nb + raw.tobytes() + vals.tobytes())


def main():
    models = sys.argv[1] if len(sys.argv) > 1 else MODELS
    dest = sys.argv[2] if len(sys.argv) > 2 else "fat-station/tests/golden/kernels/dequant.bin"
    rng = np.random.default_rng(20240917)
    out = []
    seen = set()
    for fname in FILES:
        reader = gguf.GGUFReader(os.path.join(models, fname))
        for t in reader.tensors:
            q = T(t.tensor_type)
            if (fname, q) in seen:
                continue
            seen.add((fname, q))
            cols = int(t.shape[0])
            nrows = int(np.prod(t.shape[1:])) if len(t.shape) > 1 else 1
            raw = np.asarray(t.data).view(np.uint8).reshape(nrows, -1)
            pick = sorted({0, 1, 2, nrows - 1})[:ROWS] if nrows > 1 else [0]
            pick = [r for r in pick if r < nrows]
            record(out, q, f"{fname}:{t.name}:rows{pick}", raw[pick], len(pick), cols)
    for q in ALL:
        rows, cols = 3, 512
        block, tsize = gguf.GGML_QUANT_SIZES[q]
        x = (rng.standard_normal((rows, cols)) * 2).astype(np.float32)
        x[:, 7] *= 300  # an outlier, as Qwen's activations have
        try:
            raw = quantize(x, q)
            record(out, q, f"synthetic-quantize:{q.name}", raw, rows, cols)
        except (NotImplementedError, gguf.quants.QuantError) as e:
            print(f"{q.name}: gguf cannot quantize ({e!r}); random blocks only", file=sys.stderr)
        if q in F16_FIELDS:
            raw = rng.integers(0, 256, size=(rows, cols // block, tsize), dtype=np.uint8)
            for off in F16_FIELDS[q]:
                s = (rng.standard_normal((rows, cols // block)) * 0.01).astype(np.float16)
                raw[:, :, off:off + 2] = s.view(np.uint8).reshape(rows, cols // block, 2)
            record(out, q, f"synthetic-random:{q.name}", raw.reshape(rows, -1), rows, cols)
        if q in E8M0_FIELDS:
            raw = rng.integers(0, 256, size=(rows, cols // block, tsize), dtype=np.uint8)
            e = rng.integers(112, 136, size=(rows, cols // block), dtype=np.uint8)
            e[:, 3] = 0
            e[:, 4] = 1
            e[:, 5] = 2
            raw[:, :, E8M0_FIELDS[q]] = e
            record(out, q, f"synthetic-random:{q.name}", raw.reshape(rows, -1), rows, cols)
    blob = b"KGOLD1\0\0" + struct.pack("<I", len(out)) + b"".join(out)
    with open(dest, "wb") as f:
        f.write(blob)
    print(f"wrote {len(out)} records, {len(blob)} bytes to {dest}")


if __name__ == "__main__":
    main()
