#!/usr/bin/env bash
# The decode yardsticks on this machine's GPU: writes the synthetic models (real shapes and
# tensor types, random weights) into $DIR and runs `shaderlm bench` on all of them, plus --peak.
# MOE=1: the mixture-of-experts ones instead: Qwen3-30B-A3B and Mixtral-8x7B in llama.cpp's Q4_K_M
# mix, gpt-oss-20b in its MXFP4_MOE mix (about 60 GB; bench's bytes a token are the active experts').
#   [MOE=1] bash bench/yardsticks.sh [DIR] [extra bench args... | --synth-only]
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
DIR=${1:-/tmp/shaderlm-yardsticks}; shift || true
mkdir -p "$DIR"
specs=("smollm2-135m Q4_1" "llama-3.2-1b Q4_K_M" "llama-3.2-1b Q8_0" "llama-3.1-8b Q4_K_M" "llama-3.1-8b Q4_0")
[ "${MOE:-0}" = 1 ] && specs=("qwen3-30b-a3b Q4_K_M_LCPP" "mixtral-8x7b Q4_K_M_LCPP" "gpt-oss-20b MXFP4")
models=()
for spec in "${specs[@]}"; do
  set -- $spec "$@"
  f="$DIR/$1-${2%_LCPP}.gguf"
  [ -s "$f" ] || python3 -m shaderlm synth --preset "$1" --quant "$2" --out "$f" >/dev/null
  models+=(-m "$f")
  shift 2
done
[ "${1:-}" = --synth-only ] && exit 0
python3 -m shaderlm bench --peak "${models[@]}" -p 512 -n 128 -r 5 "$@"
