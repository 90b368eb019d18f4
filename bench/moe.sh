#!/usr/bin/env bash
# The mixture-of-experts yardsticks on this machine's GPU: writes synthetic Qwen3-30B-A3B and
# Mixtral-8x7B (llama.cpp's Q4_K_M mix) and gpt-oss-20b (MXFP4 experts) into $DIR (about 60 GB) and
# runs `shaderlm bench` on each (bytes per token: the active experts'), plus --peak.
#   bash bench/moe.sh [DIR] [extra bench args... | --synth-only]
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
DIR=${1:-/tmp/shaderlm-moe}; shift || true
mkdir -p "$DIR"
models=()
for spec in "qwen3-30b-a3b Q4_K_M_LCPP" "mixtral-8x7b Q4_K_M_LCPP" "gpt-oss-20b MXFP4"; do
  set -- $spec "$@"
  f="$DIR/$1-${2%_LCPP}.gguf"
  [ -s "$f" ] || python3 -m shaderlm synth --preset "$1" --quant "$2" --out "$f" >/dev/null
  models+=(-m "$f")
  shift 2
done
[ "${1:-}" = --synth-only ] && exit 0
python3 -m shaderlm bench --peak "${models[@]}" -p 512 -n 128 -r 3 "$@"
