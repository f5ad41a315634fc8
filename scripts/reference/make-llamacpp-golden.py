#!/usr/bin/env python3
"""Writes llama.cpp's logits for the Paris prompt on the same GGUF, the second reference the
engine is compared with (fat-station/tests/golden/qwen_paris_llamacpp.f32).

llama.cpp quantizes activations too, so it is a peer, not ground truth: the NumPy f32 pass
(make-golden.sh) is the one with tolerances. Needs: pip install llama-cpp-python numpy.
usage: make-llamacpp-golden.py [GGUF] [OUT]
"""
import os
import sys

import numpy as np
import llama_cpp

models = os.environ.get("AEON_MODELS_DIR", os.path.expanduser("~/.cache/aeon-shell/models"))
here = os.path.dirname(os.path.abspath(__file__))
gguf = sys.argv[1] if len(sys.argv) > 1 else os.path.join(models, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "../../fat-station/tests/golden/qwen_paris_llamacpp.f32")
tokens = [785, 6722, 315, 9625, 374]  # "The capital of France is"

llm = llama_cpp.Llama(model_path=gguf, n_ctx=64, n_batch=64, logits_all=True, verbose=False, n_threads=2)
llm.eval(tokens)
logits = np.array(llm.scores[len(tokens) - 1], dtype="<f4")
logits.tofile(out)
top = np.argsort(-logits)[:5]
print("llama.cpp", llama_cpp.__version__, "top-5", [(int(i), round(float(logits[i]), 4)) for i in top])
