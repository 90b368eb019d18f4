#!/usr/bin/env bash
# Checks and timings on a GPU machine for the real SmolLM2 GGUF given as $1: adapter info, the test
# suite, greedy continuations (JSON to $2 for comparing with lavapipe), bench and profile.
set -uo pipefail
SMOL=$1; OUTDIR=${2:-/tmp}
export SHADERLM_SMOLLM2=$SMOL PYTHONUNBUFFERED=1
python3 -m shaderlm.cli info
python3 scripts/greedy_dump.py --model "$SMOL" > "$OUTDIR/greedy_gpu.json" && echo "greedy dump ok"
python3 -m pytest -q -p no:cacheprovider tests 2>&1 | tail -4
python3 -m shaderlm.cli profile -m "$SMOL" --context 128 --prefill 512
python3 -m shaderlm.cli run -m "$SMOL" "What is the capital of France?" -n 64
python3 -m shaderlm.cli bench --peak -m "$SMOL" -p 512 -n 128 -r 5
