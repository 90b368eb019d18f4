#!/usr/bin/env bash
# The decode yardsticks on this machine's GPU: writes the synthetic models (real shapes and
# tensor types, random weights) into $DIR and runs `shaderlm bench` on all of them, plus --peak.
#   bash bench/yardsticks.sh [DIR] [extra bench args... | --synth-only]
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
DIR=${1:-/tmp/shaderlm-yardsticks}; shift || true
mkdir -p "$DIR"
models=()
for spec in "smollm2-135m Q4_1" "llama-3.2-1b Q4_K_M" "llama-3.2-1b Q8_0" "llama-3.1-8b Q4_K_M" "llama-3.1-8b Q4_0"; do
  set -- $spec "$@"
  f="$DIR/$1-$2.gguf"
  [ -s "$f" ] || python3 -m shaderlm synth --preset "$1" --quant "$2" --out "$f" >/dev/null
  models+=(-m "$f")
  shift 2
done
[ "${1:-}" = --synth-only ] && exit 0
python3 -m shaderlm bench --peak "${models[@]}" -p 512 -n 128 -r 5 "$@"
