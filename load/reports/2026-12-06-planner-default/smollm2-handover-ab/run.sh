#!/usr/bin/env bash
# Interleaved A/B: base (turns as before) vs hand (turn handed to the peer), pinned [1,3].
cd /tmp/ab; mkdir -p runs logs
LOAD=/work/main/target/release/tokenrouter-load
/tmp/tr-base --threads 2 serve --config base.yaml > logs/base.log 2>&1 &
/tmp/tr-hand --threads 2 serve --config hand.yaml > logs/hand.log 2>&1 &
trap 'kill $(jobs -p) 2>/dev/null' EXIT
for p in 8621 8622; do until curl -sf -o /dev/null http://127.0.0.1:$p/health; do sleep 2; done; done
for p in 8621 8622; do $LOAD --workload low-effort --endpoint completions --clients 1 --requests 1 --scale 0.03125 --tokenizer /work/main/.cache/assets/qwen3 --seed 1001 --temperature 0 --quiet --url http://127.0.0.1:$p > /dev/null 2>&1; done
i=0
for round in 1 2 3; do
  if [ $((round % 2)) = 1 ]; then order="base hand"; else order="hand base"; fi
  for spec in "rstitch 4" "random 4" "random 1"; do
    set -- $spec; pol=$1; n=$2
    [ $pol = random ] && routing='{"policy":"random","params":{"p":0.1}}' || routing='{"policy":"rstitch"}'
    for v in $order; do
      port=$([ $v = base ] && echo 8621 || echo 8622)
      i=$((i+1)); slug=$(printf '%02d-%s-%s-n%s' $i $v $pol $n)
      curl -sf -X POST http://127.0.0.1:$port/reset_prefix_cache > /dev/null
      curl -sf http://127.0.0.1:$port/v1/stats > runs/$slug.before.json
      $LOAD --workload low-effort --endpoint completions --clients $n --requests $((n*30)) --duration 400 --grace 60 --scale 0.03125 --tokenizer /work/main/.cache/assets/qwen3 --seed 1 --temperature 0 --quiet --json runs/$slug.json --url http://127.0.0.1:$port --routing "$routing" > logs/$slug.txt 2>&1
      curl -sf http://127.0.0.1:$port/v1/stats > runs/$slug.after.json
      echo "$slug $(grep '^throughput' logs/$slug.txt) load $(cut -d' ' -f1 /proc/loadavg)"
    done
  done
done
