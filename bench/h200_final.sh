#!/usr/bin/env bash
# Issue 3's table on the GPU machine: yardstick models (synthetic, real shapes/types) with --peak,
# then the 8B Q4_K_M decode step profiled two ways (timestamps per dispatch; back-to-back chains).
set -uo pipefail
export PYTHONUNBUFFERED=1
[ -f .smolA/part ] && cp .smolA/part /tmp/smol.a
bash bench/yardsticks.sh /tmp/ys 2>&1 | grep -v -E "Warn|warn" | tee $OUT/yardsticks.txt
python3 -m shaderlm.cli profile -m /tmp/ys/llama-3.1-8b-Q4_K_M.gguf --context 128 2>&1 | tee $OUT/profile8b.txt | head -14
python3 bench/kernel_chain.py -m /tmp/ys/llama-3.1-8b-Q4_K_M.gguf 2>&1 | grep -v Warn | tee $OUT/chain8b.txt
