#!/usr/bin/env bash
# Whole-step A/B on the GPU machine: decode speed (tg128, median of 5) of the same models under several
# variants, each model tuned once, the variants interleaved over two rounds so clock drift hits all alike.
#   bash bench/ab.sh VARIANTS MODEL...
#     VARIANTS: comma-separated, each one of
#       -            this tree as it is
#       @DIR         the shaderlm package in DIR: another version's tree (`git archive REV | tar -x -C DIR`
#                    here, then carry DIR along)
#       NAME=VALUE   an environment setting, "/" in VALUE standing for "," (SHADERLM_ATTN=512/4/1)
#       and ":" joining several settings in one variant
#     MODEL: a yardstick name without .gguf (bench/yardsticks.sh writes them to $YS, default /tmp/ys),
#            or a path to a GGUF file
# Prints one line per run and a table last.
set -uo pipefail
if [ $# -lt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0; fi
export PYTHONUNBUFFERED=1
YS=${YS:-/tmp/ys}
variants=$(echo "$1" | tr , ' '); shift
bash bench/yardsticks.sh "$YS" --synth-only > /dev/null 2>&1
path() { case $1 in *.gguf) echo "$1";; *) echo "$YS/$1.gguf";; esac; }
for name; do
  t0=$(date +%s); python3 -m shaderlm tune -m "$(path "$name")" > "/tmp/ab-tune-$(basename "$name").txt" 2>&1
  echo "$name tuned in $(( $(date +%s) - t0 )) s"
done
declare -A runs
for round in 1 2; do
  for name; do
    for v in $variants; do
      tree=.; envs=()
      for part in $(echo "$v" | tr : ' '); do
        case $part in -) ;; @*) tree=${part#@};; *=*) envs+=("$(echo "$part" | tr / ,)");; esac
      done
      r=$(cd "$tree" && env "${envs[@]}" python3 -m shaderlm bench -m "$(path "$name")" -p 0 -n 128 -r 5 2>&1 | grep tg128)
      tps=$(echo "$r" | awk -F'|' '{gsub(/ /,"",$5); print $5}')
      echo "round $round | $name | $v | ${tps:-failed}"
      runs["$name|$v"]+="${tps:-nan} "
    done
  done
done
echo; echo "| model | variant | tg128 tok/s, round 1 and 2 |"; echo "|---|---|---|"
for name; do for v in $variants; do echo "| $name | $v | ${runs["$name|$v"]}|"; done; done
