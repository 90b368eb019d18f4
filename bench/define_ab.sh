#!/usr/bin/env bash
# Whole-step A/B of kernel variants behind #if defines, on the GPU machine: each yardstick model is
# tuned once with the default kernels, then benched (tg128, median of 5) with each variant on those
# same shapes, the variants interleaved over two rounds so clock drift hits all alike.
#   bash bench/define_ab.sh VARIANTS MODEL...
#     VARIANTS: comma-separated SHADERLM_DEFINES values, "-" for none, ":" joining several defines,
#               or @DIR: the shaderlm package in DIR (another version's tree, e.g. `git archive` of the base),
#               or NAME=VALUE: an environment setting, "/" in VALUE standing for "," (SHADERLM_ATTN=512/4/1)
#     MODEL: a yardstick file name without .gguf (bench/yardsticks.sh writes them to /tmp/ys)
set -uo pipefail
export PYTHONUNBUFFERED=1
D=/tmp/ys
variants=$(echo "$1" | tr , ' '); shift
bash bench/yardsticks.sh $D --synth-only > /dev/null 2>&1
for name; do
  t0=$(date +%s); python3 -m shaderlm.cli tune -m $D/$name.gguf > /tmp/tune-$name.txt 2>&1
  echo "$name tuned in $(( $(date +%s) - t0 )) s"
done
for round in 1 2; do
  for name; do
    for v in $variants; do
      defs=$(echo "$v" | tr : ,); [ "$defs" = - ] && defs=""; tree=.
      envs=()
      case $v in @*) tree=${v#@}; defs="";; *=*) envs=("$(echo "$v" | tr / ,)"); defs="";; esac
      r=$(cd $tree && env "${envs[@]}" SHADERLM_DEFINES=$defs python3 -m shaderlm.cli bench -m $D/$name.gguf -p 16 -n 128 -r 5 2>&1 | grep tg128)
      echo "round $round | $name | ${v} | $r"
    done
  done
done
