#!/usr/bin/env python3
"""Writes a GGUF with only the first N transformer blocks of another (tensors copied bit for bit,
`<arch>.block_count` set to N, every other key kept): a big model's real widths and quant types
at a size the NumPy reference (ref_forward.py dequantizes everything to f32) can hold.

    truncate-gguf.py SRC.gguf DST.gguf N

E.g. the 7B-shaped synthetic Q4_K_M cut to 2 blocks, then ours (kernel-bench --forward
--logits-out), llama.cpp (llamacpp-logits.c) and ref_forward.py on the same file.
Needs: pip install gguf numpy.
"""
import sys

import gguf
from gguf_fields import copy_fields

if len(sys.argv) != 4 or not sys.argv[3].isdigit() or int(sys.argv[3]) < 1:
    sys.exit("usage: truncate-gguf.py SRC.gguf DST.gguf N (N >= 1)")
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
r = gguf.GGUFReader(src)
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
w = gguf.GGUFWriter(dst, arch)
copy_fields(r, w, lambda name: n if name == f"{arch}.block_count" else None)
for t in r.tensors:
    if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n:
        continue
    w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
