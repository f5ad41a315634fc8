#!/usr/bin/env python3
"""Writes a GGUF whose F16 tensors are F32 (the same values: f16 -> f32 is exact), every other
tensor and key copied: llama.cpp on the copy computes in f32 where on the F16 file it rounds
activations to f16 before each matmul (ggml-cpu's vec_dot_type of F16 is F16), so its logits
on the copy are those of the exact weights our engine reads from the F16 file.

    widen-gguf.py SRC.gguf DST.gguf

Needs: pip install gguf numpy.
"""
import sys

import gguf
from gguf_fields import copy_fields
import numpy as np

if len(sys.argv) != 3:
    sys.exit("usage: widen-gguf.py SRC.gguf DST.gguf")
src, dst = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(src)
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
w = gguf.GGUFWriter(dst, arch)
copy_fields(r, w, lambda name: int(gguf.LlamaFileType.ALL_F32) if name == "general.file_type" else None)
for t in r.tensors:
    if t.tensor_type == gguf.GGMLQuantizationType.F16:
        data = np.asarray(t.data, dtype=np.float16).astype(np.float32)
        w.add_tensor(t.name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.F32)
    else:
        w.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
