#!/usr/bin/env bash
# ARM cost proxies without ARM hardware: how our aarch64 kernels compare with llama.cpp's on the
# in-order cores the devices have (Cortex-A53: the R1; Cortex-A55: a dotprod in-order core).
# Two proxies, neither a wall-clock figure:
#
#   1. static cycle model (llvm-mca, LLVM's in-order Cortex-A53 / A55 scheduling models) of each
#      hot one-token dot's inner loop: ours from the aarch64 build of fat-station (rustc
#      --emit asm), llama.cpp's from ggml-cpu's arch/arm/quants.c compiled with zig cc
#      -mcpu=cortex_a53 (no dotprod) and -mcpu=cortex_a55 (dotprod). Cycles per block (32
#      weights; 256 for the k-quants). Ours: plain NEON on the A53 model, the `sdot` flavour on
#      the A55 model; llama.cpp: the a53 build on the A53 model, the a55 build on the A55 model.
#      Then the 16-row kernels' 8-token (prefill) loops, ours only: cycles per row-block for
#      the 8 tokens, and the tile ratio 8 x one-token cycles / 8-token cycles.
#   2. exact instruction counts under qemu-aarch64 with a TCG counting plugin
#      (scripts/arm-proxy/insn-count.c) of `kernel-bench --forward` on the real Qwen, one thread,
#      per prefill token and per decoded token (difference of two runs of different lengths, so
#      loading the model cancels out), on `-cpu cortex-a53` (plain NEON) and `-cpu max`
#      (dotprod). The same for llama.cpp (unless --no-llama): llama-cpp-python's llama.cpp
#      cross-built for aarch64-linux-musl, static, with zig c++ -mcpu=cortex_a53 (run on
#      `-cpu cortex-a53`) and -mcpu=cortex_a55 (dotprod; run on `-cpu max`) by
#      scripts/arm-proxy/build-llama-aarch64.sh (cached under ~/.cache/aeon-shell/llama-aarch64;
#      the first build of each takes tens of minutes at -j1), driven by
#      scripts/arm-proxy/llama-count.cpp: the same GGUF, the same prompt ids, one thread, no
#      warmup, greedy. Each with ggml-cpu's weight repacking (extra buffer types, llama.cpp's
#      default) and without (llama-bench --repack 0; not rerun where the default put no weight
#      in a repack buffer: then the two are the same program); then ours / llama.cpp per token.
#      Its KV cache is padded to 256 cells, but its flash attention (on by default on CPU)
#      skips the masked ones: attention is 2.4 M (a53 build) to 3.8 M (a55) instructions a token.
#
# Usage: scripts/arm-proxy.sh [--no-count] [--no-llama] [--model FILE.knot] [--gguf FILE.gguf]
#   --no-count   only the static model (no aarch64 link, no model, no qemu)
#   --no-llama   instruction counts of ours only (no llama.cpp build or runs)
#   --model      our model (default: the Qwen2.5-Coder 0.5B Q4_K_M .knot in the models dir)
#   --gguf       llama.cpp's (default: the --model path with .gguf for .knot)
#
# Needs (installed when missing and root, else named and exit 2): llvm-mca (Debian llvm),
# qemu-aarch64 (Debian qemu-user), a host C compiler (gcc/cc) for the plugin; zig, cargo-zigbuild
# and the rust aarch64 target come from scripts/cross/build-aarch64.sh's installer; cmake and
# make (Debian cmake, make) for llama.cpp's aarch64 build. llama.cpp's source: the
# llama-cpp-python sdist (LLAMA_CPP_PYTHON_VERSION, default 0.3.36) that
# scripts/bench/build-llama-bench.sh unpacks under ~/.cache/aeon-shell/llama-bench, else
# `pip download` of that sdist.
# Env: AEON_CROSS_DEV_DIR (cargo target dir of the release-profile aarch64 builds for
# tests and proxies, default target/cross-test), AEON_MODELS_DIR.
# Prints the table on stdout (the committed copy: scripts/arm-proxy/table.txt).
# Exit codes: 0 table printed; 1 a step failed; 2 bad usage or a missing tool.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TARGET=aarch64-unknown-linux-musl
DEV="${AEON_CROSS_DEV_DIR:-$ROOT/target/cross-test}"
MODEL="${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.knot"
LLAMA_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
count=1
llama=1
GGUF=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-count) count=0; shift ;;
        --no-llama) llama=0; shift ;;
        --model) [[ $# -ge 2 ]] || { echo "arm-proxy: --model needs a file" >&2; exit 2; }; MODEL="$2"; shift 2 ;;
        --gguf) [[ $# -ge 2 ]] || { echo "arm-proxy: --gguf needs a file" >&2; exit 2; }; GGUF="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "arm-proxy: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ -n "$GGUF" ]] || GGUF="${MODEL%.knot}.gguf"
say() { printf 'arm-proxy: %s\n' "$*" >&2; }
die() { say "$*"; exit "${2:-1}"; }

# --- tools ------------------------------------------------------------------------------------
apt_need() { # $1 command, $2 Debian package
    command -v "$1" >/dev/null && return 0
    [[ "$(id -u)" -eq 0 ]] || die "missing $1 (apt-get install $2)" 2
    say "apt-get install $2"
    { apt-get install -y -qq "$2" >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq "$2" >/dev/null; }; } \
        || die "apt-get install $2 failed" 2
}
apt_need llvm-mca llvm
PY="$(command -v python3 || true)"
[[ -n "$PY" ]] || die "python3 not found" 2
ZIG=(zig)
command -v zig >/dev/null || ZIG=("$PY" -m ziglang)
if ! "${ZIG[@]}" version >/dev/null 2>&1 || ! command -v cargo-zigbuild >/dev/null \
    || ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
    say "installing the cross tools (scripts/cross/build-aarch64.sh's installer)"
    # The installer runs before the build; --package of a tiny crate keeps the build short.
    bash scripts/cross/build-aarch64.sh -p knot-format >/dev/null || die "cross tools missing" 2
    command -v zig >/dev/null || ZIG=("$PY" -m ziglang)
fi
if [[ $count -eq 1 ]]; then
    apt_need qemu-aarch64 qemu-user
    command -v cc >/dev/null || apt_need cc gcc
fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# --- llama.cpp source -------------------------------------------------------------------------
cache="${AEON_LLAMA_BENCH_DIR:-$HOME/.cache/aeon-shell/llama-bench}"
GGML=""
for d in "$cache/$LLAMA_VERSION" "$cache/$LLAMA_VERSION.partial" "$cache/src-$LLAMA_VERSION"; do
    [[ -f "$d/vendor/llama.cpp/ggml/src/ggml-cpu/arch/arm/quants.c" && -f "$d/vendor/llama.cpp/src/llama.cpp" ]] \
        && { GGML="$d/vendor/llama.cpp/ggml"; break; }
done
if [[ -z "$GGML" ]]; then
    say "pip download llama-cpp-python==$LLAMA_VERSION (sdist) for llama.cpp's source"
    "$PY" -m pip download --no-binary llama-cpp-python --no-deps --disable-pip-version-check -q \
        -d "$WORK/dl" "llama-cpp-python==$LLAMA_VERSION" >&2 || die "pip download failed"
    mkdir -p "$cache/src-$LLAMA_VERSION"
    tar -xzf "$WORK"/dl/llama_cpp_python-*.tar.gz -C "$cache/src-$LLAMA_VERSION" --strip-components=1 \
        --wildcards '*/vendor/llama.cpp/*' || die "untar failed"
    GGML="$cache/src-$LLAMA_VERSION/vendor/llama.cpp/ggml"
fi

# --- 1. static model --------------------------------------------------------------------------
say "llama.cpp ggml-cpu arm quants.c -> asm (zig cc -O3, -mcpu=cortex_a53 / cortex_a55)"
for cpu in cortex_a53 cortex_a55; do
    "${ZIG[@]}" cc -target aarch64-linux-musl -mcpu=$cpu -O3 -g0 -S -DNDEBUG \
        -I"$GGML/include" -I"$GGML/src" -I"$GGML/src/ggml-cpu" \
        "$GGML/src/ggml-cpu/arch/arm/quants.c" -o "$WORK/llama-$cpu.s" 2>"$WORK/zig.log" \
        || { tail -5 "$WORK/zig.log" >&2; die "zig cc failed on quants.c"; }
done
# The kernels live in aeon-engine (fat-station only re-exports them since the engine became
# its own crate).
say "aeon-engine (aarch64, release) -> asm"
rm -f "$DEV/$TARGET/release/deps/aeon_engine-"*.s
touch aeon-engine/src/lib.rs # else an up-to-date lib emits no .s
CARGO_TARGET_DIR="$DEV" cargo-zigbuild rustc --release --target "$TARGET" -p aeon-engine --lib \
    -- --emit asm -C codegen-units=1 >"$WORK/rustc.log" 2>&1 \
    || { tail -20 "$WORK/rustc.log" >&2; die "cargo rustc --emit asm failed"; }
OURS="$(ls -t "$DEV/$TARGET/release/deps/aeon_engine-"*.s | head -1)"
[[ -f "$OURS" ]] || die "no aeon_engine .s emitted"

# kernel, ours (symbol, loop, blocks/iter), llama.cpp (symbol, loop, blocks/iter). Each loop is
# the function's first outer loop unless said; blocks per iteration read off the source.
# (`kernels4neon` for the block kernels: `interleaved4neon` holds the same entry names.)
KERNELS=(
    "Q4_0  kernels4neon10q4_0_plain 0 8  kernels4neon7q4_0_tf 0 8  ^ggml_vec_dot_q4_0_q8_0$ 0 2"
    "Q5_0  kernels4neon10q5_0_plain 0 8  kernels4neon7q5_0_tf 0 8  ^ggml_vec_dot_q5_0_q8_0$ 0 2"
    "Q8_0  kernels4neon10q8_0_plain 0 8  kernels4neon7q8_0_tf 0 8  ^ggml_vec_dot_q8_0_q8_0$ 0 2"
    "Q4_K  kernels4neon10q4_k_plain 0 1  kernels4neon7q4_k_tf 0 1  ^ggml_vec_dot_q4_K_q8_K$ 0 1"
    "Q6_K  kernels4neon10q6_k_plain 0 1  kernels4neon7q6_k_tf 0 1  ^ggml_vec_dot_q6_K_q8_K$ 0 1"
)
# The 16-row kernels (interleaved/neon.rs; neon_kquants.rs below): loop 1 is the one-token loop (loop 0 checks the
# activation lengths), one tile (16 rows x one block) per iteration, so --per 16 gives cycles per row-block, comparable with llama.cpp's
# per-block figure (one row against one block).
ROWS16=(
    "Q4_0  interleaved4neon10q4_0_plain 1 16  interleaved4neon7q4_0_tf 1 16  ^ggml_vec_dot_q4_0_q8_0$ 0 2"
    "Q5_0  interleaved4neon10q5_0_plain 1 16  interleaved4neon7q5_0_tf 1 16  ^ggml_vec_dot_q5_0_q8_0$ 0 2"
    "Q8_0  interleaved4neon10q8_0_plain 1 16  interleaved4neon7q8_0_tf 1 16  ^ggml_vec_dot_q8_0_q8_0$ 0 2"
    "Q4_1  interleaved4neon10q4_1_plain 1 16  interleaved4neon7q4_1_tf 1 16  ^ggml_vec_dot_q4_1_q8_1$ 0 2"
    "Q5_1  interleaved4neon10q5_1_plain 1 16  interleaved4neon7q5_1_tf 1 16  ^ggml_vec_dot_q5_1_q8_1$ 0 2"
    "IQ4NL interleaved4neon12iq4_nl_plain 1 16  interleaved4neon9iq4_nl_tf 1 16  ^ggml_vec_dot_iq4_nl_q8_0$ 0 2"
    # interleaved/neon_kquants.rs: an iteration is a row quad of a tile (4 row-blocks), but for the plain
    # kernels (and the sdot Q3_K, Q2_K) a whole tile (16: tile-major, see q4k_pair_tile, q5k_pair_tile,
    # q6k_block_tile, k16_block_tile, iq4xs_sub_tile).
    "Q4_K  neon_kquants13q4k_one_plain 0 16 neon_kquants10q4k_one_tf 0 16 ^ggml_vec_dot_q4_K_q8_K$ 0 1"
    "Q6_K  neon_kquants13q6k_one_plain 0 16 neon_kquants10q6k_one_tf 0 4  ^ggml_vec_dot_q6_K_q8_K$ 0 1"
    "Q5_K  neon_kquants13q5k_one_plain 0 16 neon_kquants10q5k_one_tf 0 16 ^ggml_vec_dot_q5_K_q8_K$ 0 1"
    "Q3_K  neon_kquants13q3k_one_plain 0 16  neon_kquants10q3k_one_tf 0 16  ^ggml_vec_dot_q3_K_q8_K$ 0 1"
    "Q2_K  neon_kquants13q2k_one_plain 0 16  neon_kquants10q2k_one_tf 0 16  ^ggml_vec_dot_q2_K_q8_K$ 0 1"
    "IQ4XS neon_kquants15iq4xs_one_plain 0 16 neon_kquants12iq4xs_one_tf 0 16 ^ggml_vec_dot_iq4_xs_q8_K$ 0 1"
)
mca() { # asm symbol loop per mcpu [mattr] [mca-loop.py options...] -> cycles per block
    local asm="$1" sym="$2" lp="$3" per="$4" cpu="$5" attr="${6:-}"
    shift 5; [[ $# -gt 0 ]] && shift
    "$PY" scripts/arm-proxy/mca-loop.py "$asm" "$sym" --loop "$lp" --per "$per" --mcpu "$cpu" ${attr:+--mattr "$attr"} "$@" \
        | "$PY" -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["cycles_per_unit"])'
}
echo "llvm-mca in-order model, cycles per block (32 weights; k-quants 256), one-token dots"
echo "(a proxy: LLVM's scheduling model of the hot loop, steady state; not a measurement)"
printf '%-5s | %9s %9s %6s | %9s %9s %6s\n' kernel "A53 ours" llama.cpp ratio "A55 sdot" llama.cpp ratio
table() { # rows...
    local row k sym lp per tsym tlp tper lsym llp lper a53 l53 a55 l55
    for row in "$@"; do
        read -r k sym lp per tsym tlp tper lsym llp lper <<<"$row"
        a53=$(mca "$OURS" "$sym" "$lp" "$per" cortex-a53) || die "$k: no model of ours (A53)"
        l53=$(mca "$WORK/llama-cortex_a53.s" "$lsym" "$llp" "$lper" cortex-a53) || die "$k: no model of llama.cpp (A53)"
        a55=$(mca "$OURS" "$tsym" "$tlp" "$tper" cortex-a55 +dotprod) || die "$k: no model of ours (A55)"
        l55=$(mca "$WORK/llama-cortex_a55.s" "$lsym" "$llp" "$lper" cortex-a55 +dotprod) || die "$k: no model of llama.cpp (A55)"
        printf '%-5s | %9s %9s %5.2fx | %9s %9s %5.2fx\n' "$k" "$a53" "$l53" "$(awk -v a="$a53" -v b="$l53" 'BEGIN { print a / b }')" \
            "$a55" "$l55" "$(awk -v a="$a55" -v b="$l55" 'BEGIN { print a / b }')"
        ONE53[$k]=$a53
        ONE55[$k]=$a55
    done
}
declare -A ONE53 ONE55
table "${KERNELS[@]}"
echo
echo "16-row kernels (the decode path for these types), one token: cycles per tile / 16 (per row-block)"
printf '%-5s | %9s %9s %6s | %9s %9s %6s\n' kernel "A53 ours" llama.cpp ratio "A55 sdot" llama.cpp ratio
table "${ROWS16[@]}"

# The same kernels' 8-token (prefill) loops: kernel, plain (symbol, depth, loop, per), sdot
# (the same). interleaved/neon.rs (`rows16_quads` with T = 8): the tile loop (depth 2, inside
# the loop over the 4 row quads), a tile's quad per iteration. neon_kquants.rs (`run` with
# T = 8): one flat loop over (tile, row quad); where the token loops inside it stayed rolled
# (a constant 8 trips), their bodies are counted 8 times (mca-loop.py --inner-trips). A plain
# symbol `-`: the type's plain kernel takes several tokens one at a time (`Tile::BY_TOKEN` in
# neon.rs: its 8-token loop modelled slower than 8 one-token passes), so 8 x one token.
TILE8=(
    "Q4_0  -                                   2 0 4  interleaved4neon13q4_0_eight_tf 2 0 4"
    "Q5_0  interleaved4neon16q5_0_eight_plain 2 0 4  interleaved4neon13q5_0_eight_tf 2 0 4"
    "Q8_0  -                                   2 0 4  interleaved4neon13q8_0_eight_tf 2 0 4"
    "Q4_1  -                                   2 0 4  interleaved4neon13q4_1_eight_tf 2 0 4"
    "Q5_1  interleaved4neon16q5_1_eight_plain 2 0 4  interleaved4neon13q5_1_eight_tf 2 0 4"
    "IQ4NL -                                   2 0 4  interleaved4neon15iq4_nl_eight_tf 2 0 4"
    "Q4_K  neon_kquants15q4k_eight_plain 1 0 4  neon_kquants12q4k_eight_tf 1 0 4"
    "Q6_K  neon_kquants15q6k_eight_plain 1 0 4  neon_kquants12q6k_eight_tf 1 0 4"
    "Q5_K  neon_kquants15q5k_eight_plain 1 0 4  neon_kquants12q5k_eight_tf 1 0 4"
    "Q3_K  neon_kquants15q3k_eight_plain 1 0 4  neon_kquants12q3k_eight_tf 1 0 4"
    "Q2_K  neon_kquants15q2k_eight_plain 1 0 4  neon_kquants12q2k_eight_tf 1 0 4"
    "IQ4XS neon_kquants17iq4xs_eight_plain 1 0 4  neon_kquants14iq4xs_eight_tf 1 0 4"
)
echo
echo "the same, 8 tokens (prefill tile): cycles per row-block for all 8; tile = 8 x one token / 8 tokens"
echo "(the one-token figures above; the goal is 3x; plain Q4_0, Q4_1, Q8_0, IQ4_NL take prefill"
echo " tokens one at a time, neon.rs Tile::BY_TOKEN: 8 x one token, 1.00x)"
printf '%-5s | %9s %9s %6s | %9s %9s %6s\n' kernel "A53 8 tok" "1 token" tile "A55 8 tok" "1 token" tile
for row in "${TILE8[@]}"; do
    read -r k sym dep lp per tsym tdep tlp tper <<<"$row"
    if [[ "$sym" == - ]]; then
        e53=$(awk -v b="${ONE53[$k]}" 'BEGIN { printf "%.1f", 8 * b }')
    else
        e53=$(mca "$OURS" "$sym" "$lp" "$per" cortex-a53 "" --depth "$dep" --inner-trips 8) || die "$k: no model of the 8-token loop (A53)"
    fi
    e55=$(mca "$OURS" "$tsym" "$tlp" "$tper" cortex-a55 +dotprod --depth "$tdep" --inner-trips 8) || die "$k: no model of the 8-token loop (A55)"
    printf '%-5s | %9s %9s %5.2fx | %9s %9s %5.2fx\n' "$k" "$e53" "${ONE53[$k]}" "$(awk -v a="$e53" -v b="${ONE53[$k]}" 'BEGIN { print 8 * b / a }')" \
        "$e55" "${ONE55[$k]}" "$(awk -v a="$e55" -v b="${ONE55[$k]}" 'BEGIN { print 8 * b / a }')"
done

[[ $count -eq 1 ]] || exit 0

# --- 2. instruction counts --------------------------------------------------------------------
if [[ ! -f "$MODEL" ]]; then
    say "SKIP instruction counts: $MODEL not found (scripts/fetch-model.sh)"
    exit 0
fi
say "insn-count plugin (host cc) and kernel-bench (aarch64) "
cc -O2 -shared -fPIC -o "$WORK/insn-count.so" scripts/arm-proxy/insn-count.c || die "building the plugin failed"
CARGO_TARGET_DIR="$DEV" cargo-zigbuild build --release --target "$TARGET" -p fat-station --bin kernel-bench \
    >"$WORK/build.log" 2>&1 || { tail -20 "$WORK/build.log" >&2; die "building kernel-bench failed"; }
KB="$DEV/$TARGET/release/kernel-bench"
QEMU="$(command -v qemu-aarch64)"
insns() { # cpu prefill decode -> instructions (ours)
    nice -n 10 "$QEMU" -cpu "$1" -plugin "$WORK/insn-count.so,out=$WORK/count" "$KB" --forward "$MODEL" \
        --prefill "$2" --decode "$3" >"$WORK/fwd.out" 2>"$WORK/fwd.err" \
        || { tail -5 "$WORK/fwd.err" >&2; die "kernel-bench --forward under qemu failed"; }
    sed -n 's/^insns //p' "$WORK/count"
}
per_tok() { # base longer -> (longer - base) / 8, one decimal, millions
    awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", (b - a) / 8 / 1e6 }'
}
echo
echo "qemu-aarch64 + insn-count plugin: guest instructions, real Qwen (Q4_K_M), one thread"
echo "(a proxy: executed instructions, not cycles); per token: (16 prompt - 8 prompt) / 8,"
echo "(8 prompt + 8 decoded - 8 prompt) / 8, in millions"
printf '%-12s %-12s %16s %16s  %s\n' "-cpu" kernels "M per prefill" "M per decode" "greedy ids / logits"
declare -A OURS_PRE OURS_DEC
for cpu in cortex-a53 max; do
    say "ours under qemu -cpu $cpu (3 runs)"
    base=$(insns "$cpu" 8 0)
    pre=$(insns "$cpu" 16 0)
    dec=$(insns "$cpu" 8 8)
    isa=$(sed -n 's/^kernels: //p' "$WORK/fwd.out")
    ids=$(sed -n 's/^greedy ids: //p' "$WORK/fwd.out")
    hash=$(sed -n 's/^last logits blake3: //p' "$WORK/fwd.out")
    OURS_PRE[$cpu]=$(per_tok "$base" "$pre")
    OURS_DEC[$cpu]=$(per_tok "$base" "$dec")
    printf '%-12s %-12s %16s %16s  %s %s\n' "$cpu" "$isa" "${OURS_PRE[$cpu]}" "${OURS_DEC[$cpu]}" "$ids" "${hash:0:16}"
done

[[ $llama -eq 1 ]] || exit 0

# --- 3. llama.cpp's instruction counts --------------------------------------------------------
[[ -f "$GGUF" ]] || die "no $GGUF for llama.cpp (scripts/fetch-model.sh; --no-llama skips it)"
command -v cmake >/dev/null || apt_need cmake cmake
command -v make >/dev/null || apt_need make make
declare -A LC
for mcpu in cortex_a53 cortex_a55; do
    say "llama.cpp for aarch64 -mcpu=$mcpu (scripts/arm-proxy/build-llama-aarch64.sh; cached)"
    LC[$mcpu]=$(LLAMA_CPP_PYTHON_VERSION="$LLAMA_VERSION" AEON_LLAMA_SRC="${GGML%/ggml}" \
        bash scripts/arm-proxy/build-llama-aarch64.sh "$mcpu") \
        || die "building llama.cpp for $mcpu failed"
done
linsns() { # cpu binary prefill decode repack -> instructions (llama.cpp)
    nice -n 10 "$QEMU" -cpu "$1" -plugin "$WORK/insn-count.so,out=$WORK/count" "$2" "$GGUF" "$3" "$4" "$5" \
        >"$WORK/lc.out" 2>"$WORK/lc.err" \
        || { tail -5 "$WORK/lc.err" >&2; die "llama-count under qemu failed"; }
    sed -n 's/^insns //p' "$WORK/count"
}
echo
echo "llama.cpp (llama-cpp-python $LLAMA_VERSION's), zig c++ -O3 static musl, same plugin, GGUF and"
echo "prompt ids (scripts/arm-proxy/llama-count.cpp), one thread; repack: ggml-cpu's extra buffer"
echo "types (on: llama.cpp's default; 'used' when a weight buffer went to CPU_REPACK)"
printf '%-12s %-11s %-9s %16s %16s  %s\n' "-cpu" "-mcpu" repack "M per prefill" "M per decode" "greedy ids"
declare -A L_PRE L_DEC
for pair in "cortex-a53 cortex_a53" "max cortex_a55"; do
    read -r cpu mcpu <<<"$pair"
    used=""
    for rp in 1 0; do
        if [[ $rp -eq 0 && "$used" == "on, none" ]]; then
            # Nothing was repacked: repack off runs the same code on the same buffers.
            L_PRE[$cpu.0]=${L_PRE[$cpu.1]}
            L_DEC[$cpu.0]=${L_DEC[$cpu.1]}
            printf '%-12s %-11s %-9s %16s %16s  %s\n' "$cpu" "$mcpu" off "(as on)" "(as on)" ""
            continue
        fi
        say "llama.cpp ($mcpu, repack $rp) under qemu -cpu $cpu (3 runs)"
        base=$(linsns "$cpu" "${LC[$mcpu]}" 8 0 "$rp")
        pre=$(linsns "$cpu" "${LC[$mcpu]}" 16 0 "$rp")
        dec=$(linsns "$cpu" "${LC[$mcpu]}" 8 8 "$rp")
        ids=$(sed -n 's/^greedy ids: //p' "$WORK/lc.out")
        used=off
        if [[ $rp -eq 1 ]]; then
            grep -q 'CPU_REPACK' "$WORK/lc.err" && used="on, used" || used="on, none"
            say "llama.cpp's greedy text on $cpu: $(sed -n 's/^text: //p' "$WORK/lc.out")"
        fi
        L_PRE[$cpu.$rp]=$(per_tok "$base" "$pre")
        L_DEC[$cpu.$rp]=$(per_tok "$base" "$dec")
        printf '%-12s %-11s %-9s %16s %16s  %s\n' "$cpu" "$mcpu" "$used" "${L_PRE[$cpu.$rp]}" "${L_DEC[$cpu.$rp]}" "$ids"
    done
done
echo
echo "ours / llama.cpp, instructions per token (below 1: ours executes fewer)"
printf '%-12s %-14s %14s %14s\n' "-cpu" "llama.cpp" "prefill" "decode"
for cpu in cortex-a53 max; do
    for rp in 1 0; do
        printf '%-12s %-14s %13.2fx %13.2fx\n' "$cpu" "repack $([[ $rp -eq 1 ]] && echo on || echo off)" \
            "$(awk -v a="${OURS_PRE[$cpu]}" -v b="${L_PRE[$cpu.$rp]}" 'BEGIN { print a / b }')" \
            "$(awk -v a="${OURS_DEC[$cpu]}" -v b="${L_DEC[$cpu.$rp]}" 'BEGIN { print a / b }')"
    done
done
