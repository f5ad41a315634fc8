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
import numpy as np

if len(sys.argv) != 3:
    sys.exit("usage: widen-gguf.py SRC.gguf DST.gguf")
src, dst = sys.argv[1], sys.argv[2]
r = gguf.GGUFReader(src)
arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
w = gguf.GGUFWriter(dst, arch)
for name, f in r.fields.items():
    if name.startswith("GGUF.") or name == "general.architecture":
        continue
    kind = f.types[0]
    if name == "general.file_type":
        w.add_uint32(name, int(gguf.LlamaFileType.ALL_F32))
    elif kind == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            w.add_array(name, [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data])
        else:
            w.add_array(name, [f.parts[i].tolist()[0] for i in f.data])
    elif kind == gguf.GGUFValueType.STRING:
        w.add_string(name, bytes(f.parts[-1]).decode())
    else:
        w.add_key_value(name, f.parts[-1].tolist()[0], kind)
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
