#!/usr/bin/env bash
# A/B of the decode GEMV's x arithmetic on the GPU machine, each mode tuned, then benched (tg128):
#   exact  the default: x24 (24-bit fixed-point x, integer dots), or its f32 twin where the tuner
#          finds that faster
#   f32    SHADERLM_NO_X24=1: f32 x throughout, as before x24
#   int8   --int8-act (int8 x, not exact)
#   bash bench/x24_ab.sh [sweep] MODEL:MODE[,MODE...] ...     (MODEL: a yardstick file name, no .gguf)
# `sweep` first runs bench/gemv_sweep.py on the yardsticks' big matrices: f32, int8 and x24 x.
set -uo pipefail
export PYTHONUNBUFFERED=1
D=/tmp/ys
OUT=${OUT:-/tmp}
bash bench/yardsticks.sh $D --synth-only > /dev/null 2>&1
if [ "${1:-}" = sweep ]; then
  shift
  python3 bench/gemv_sweep.py --case Q4_K:28672x4096 --case Q6_K:4096x14336 \
    --case Q6_K:128256x4096 --case Q4_0:28672x4096 --case Q4_0:4096x14336 --case Q4_K:4096x4096 \
    --case Q8_0:16384x2048 --variants auto,auto+INT8_X,auto+X24 -r 5 2>&1 | grep -v Warn | tail -10
fi
for spec in "$@"; do
  name=${spec%%:*}; f=$D/$name.gguf
  for mode in $(echo ${spec#*:} | tr , ' '); do
    flag=""; nox=""
    case $mode in int8) flag=--int8-act;; f32) nox=1;; esac
    t0=$(date +%s)
    SHADERLM_NO_X24=$nox python3 -m shaderlm.cli tune -m $f $flag > $OUT/tune-$name-$mode.txt 2>&1
    t1=$(date +%s)
    r=$(SHADERLM_NO_X24=$nox python3 -m shaderlm.cli bench -m $f -p 512 -n 128 -r 5 $flag 2>&1 | grep tg128)
    echo "$name $mode (tune $((t1 - t0)) s): $r"
  done
done
