#!/usr/bin/env bash
# Issue 3's table on the GPU machine: the yardstick models (synthetic, real shapes/types) tuned for the
# adapter (`shaderlm tune`, which prints what it chose), benched with --peak, then the 8B Q4_K_M decode
# step profiled three ways (timestamps per dispatch; back-to-back chains; whole steps with each kernel
# group left out) and decoded after 2,048 and 8,192 cached tokens, last. With the real SmolLM2 file at
# /tmp/smol.gguf (carried in two halves), also its bench row and greedy dump (scripts/greedy_dump.py).
#   bash bench/h200_final.sh [--int8-act]     (the flag: the opt-in int8-activation GEMVs throughout;
#                                               outputs get the suffix -int8)
# PART=table runs the tuning and the table only; PART=steps the real SmolLM2 and the 8B profiles (on the
# same machine right after a PART=table call, which leaves its tuning cache there: tuning and benching
# the five models took 10 minutes in round 14, a call's limit).
set -uo pipefail
export PYTHONUNBUFFERED=1
D=/tmp/ys
FLAG=${1:-}
SUF=${FLAG:+-int8}
[ -n "$FLAG" ] && export SHADERLM_INT8_ACT=1         # for the scripts that load without the CLI
PART=${PART:-all}
bash bench/yardsticks.sh $D --synth-only
if [ "$PART" != steps ]; then
for f in $D/*.gguf; do
  echo "== shaderlm tune -m $f $FLAG"; python3 -m shaderlm.cli tune -m "$f" $FLAG 2>&1 | grep -v -E "Warn|warn"
done | tee $OUT/tune$SUF.txt
bash bench/yardsticks.sh $D $FLAG 2>&1 | grep -v -E "Warn|warn" | tee $OUT/yardsticks$SUF.txt
fi
[ "$PART" = table ] && exit 0
if [ -s /tmp/smol.gguf ]; then
  md5sum /tmp/smol.gguf
  python3 -m shaderlm.cli tune -m /tmp/smol.gguf $FLAG 2>&1 | grep -v -E "Warn|warn" | tail -3
  python3 -m shaderlm.cli bench -m /tmp/smol.gguf -p 512 -n 128 -r 5 $FLAG 2>&1 | grep -v Warn | tee $OUT/smol_real$SUF.txt
  python3 scripts/greedy_dump.py --model /tmp/smol.gguf > $OUT/greedy_gpu$SUF.json && echo "greedy dump written"
fi
python3 -m shaderlm.cli profile -m $D/llama-3.1-8b-Q4_K_M.gguf --context 128 $FLAG 2>&1 | tee $OUT/profile8b$SUF.txt | head -14
python3 -m shaderlm.cli bench -m $D/llama-3.1-8b-Q4_K_M.gguf -p 0 -n 128 -d 0 -d 2048 -d 8192 -r 3 $FLAG 2>&1 | grep -v Warn | tee $OUT/depth8b$SUF.txt
python3 bench/kernel_chain.py -m $D/llama-3.1-8b-Q4_K_M.gguf --ablate 2>&1 | grep -v Warn | tee $OUT/chain8b$SUF.txt
python3 bench/kernel_chain.py -m $D/llama-3.1-8b-Q4_0.gguf --ablate --stream 2>&1 | grep -v Warn | tee $OUT/chain8b_q40$SUF.txt
