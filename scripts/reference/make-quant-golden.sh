#!/usr/bin/env bash
# Regenerates the golden of fat-station/tests/engine_quant_mixes.rs, per llama-quantize mix
# (q4_1 q5_1 iq4_nl q5_k_m q3_k_m q2_k iq4_xs; between them every type of issue 40's list:
# Q4_1, Q5_1, IQ4_NL, Q5_K, Q3_K, Q2_K, IQ4_XS, with Q4_K / Q6_K beside them):
#   fat-station/tests/golden/quants/tiny_seed0_TYPE_llamacpp.f16   llama.cpp's logits of the last
#       position for PROMPT on `make-synthetic-model.py --preset tiny --seed 0 --type TYPE`
#       (scripts/reference/llamacpp-logits.c, one thread), as f16 (rounding rms 0.0006, 2% of
#       the differences the test bounds; f32 would be 4 MB for 7 files)
#   fat-station/tests/golden/quants/tiny_seed0.txt   per type: the GGUF's sha256, llama.cpp's
#       top-1, and llama.cpp's own noise: rms of its batched vs token-by-token logits, and of
#       its logits vs the NumPy reference's (ref_forward.py, f32 on the dequantized weights)
#   moe-mxfp4_moe: the same for `--preset tiny-moe --type mxfp4_moe` (qwen3moe, its expert
#       tensors MXFP4, gpt-oss's type; the rest Q8_0), as tiny_seed0_moe-mxfp4_moe_llamacpp.f16
# Arguments: a subset of the mixes to regenerate (default all); the table keeps the others' lines.
# Needs: pip install gguf numpy; the Qwen GGUF for the tokenizer (scripts/fetch-model.sh qwen);
# llama.cpp's static libraries and llama-quantize (scripts/bench/build-llama-bench.sh
# --quantize, run when missing) and a C compiler with OpenMP (gcc). ~5 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=$root/fat-station/tests/golden/quants
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$out"
types=(q4_1 q5_1 iq4_nl q5_k_m q3_k_m q2_k iq4_xs moe-mxfp4_moe)
[ $# -gt 0 ] && types=("$@")
# "The capital of France is" in Qwen's tokenizer (engine_synthetic.rs's prompt).
prompt=(785 6722 315 9625 374)

version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
llama=${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}/$version
LLAMA_QUANTIZE=${LLAMA_QUANTIZE:-$llama/build/bin/llama-quantize}
if [ ! -x "$LLAMA_QUANTIZE" ] || [ ! -f "$llama/build/src/libllama.a" ]; then
  LLAMA_QUANTIZE=$(bash "$root/scripts/bench/build-llama-bench.sh" --quantize | tail -1)
fi
export LLAMA_QUANTIZE
. "$here/llamacpp-build.sh"
build_llamacpp_tool llamacpp-logits.c "$tmp/llamacpp-logits" make-quant-golden

for t in "${types[@]}"; do
  preset=tiny mix=$t
  case $t in moe-*) preset=tiny-moe mix=${t#moe-} ;; esac
  python3 "$root/scripts/make-synthetic-model.py" "$tmp/$t.gguf" --preset $preset --seed 0 --type "$mix" -q
  "$tmp/llamacpp-logits" "$tmp/$t.gguf" "$tmp/$t.lc.f32" "${prompt[@]}" >/dev/null
  "$tmp/llamacpp-logits" "$tmp/$t.gguf" "$tmp/$t.tbt.f32" --token-by-token "${prompt[@]}" >/dev/null
  python3 "$here/ref_forward.py" "$tmp/$t.gguf" "${prompt[@]}" --logits-out "$tmp/$t.np.f32" >/dev/null
done
python3 - "$tmp" "$out" "${types[@]}" <<'PY'
import hashlib, sys
import numpy as np
tmp, out, types = sys.argv[1], sys.argv[2], sys.argv[3:]
rms = lambda a, b: float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)))
head = "# type sha256-of-the-tiny-gguf top1 rms(llama.cpp batched, token-by-token) rms(llama.cpp, numpy)"
try:
    old = [l for l in open(f"{out}/tiny_seed0.txt").read().splitlines()
           if l and not l.startswith("#") and l.split()[0] not in types]
except FileNotFoundError:
    old = []
lines = [head] + old
for t in types:
    lc, tbt, ref = (np.fromfile(f"{tmp}/{t}.{k}.f32", np.float32) for k in ("lc", "tbt", "np"))
    sha = hashlib.sha256(open(f"{tmp}/{t}.gguf", "rb").read()).hexdigest()
    lc.astype(np.float16).tofile(f"{out}/tiny_seed0_{t}_llamacpp.f16")
    lines.append(f"{t} {sha} {int(lc.argmax())} {rms(lc, tbt):.6f} {rms(lc, ref):.6f}")
open(f"{out}/tiny_seed0.txt", "w").write("\n".join(lines) + "\n")
PY
echo "make-quant-golden: wrote $out (llama.cpp $version)" >&2
