#!/usr/bin/env bash
cd /tmp/cmp; mkdir -p runs logs
LOAD=/work/main/target/release/tokenrouter-load
BIN=${BIN:-/tmp/tr-base}
$BIN --threads 2 serve --config llm.yaml > logs/llm.log 2>&1 &
$BIN --threads 2 serve --config engine.yaml > logs/engine.log 2>&1 &
trap 'kill $(jobs -p) 2>/dev/null' EXIT
for p in 8631 8632; do until curl -sf -o /dev/null http://127.0.0.1:$p/health; do sleep 2; done; done
for p in 8631 8632; do $LOAD --workload low-effort --endpoint completions --clients 1 --requests 1 --scale 0.03125 --input-scale 1 --tokenizer /work/main/.cache/assets/qwen3 --seed 1001 --temperature 0 --quiet --url http://127.0.0.1:$p > /dev/null 2>&1; done
i=0
for spec in "llm 4" "rstitch 4" "random 4" "llm 4"; do
    set -- $spec; pol=$1; n=$2
    case $pol in random) routing=(--routing '{"policy":"random","params":{"p":0.1}}'); port=8632;; rstitch) routing=(--routing '{"policy":"rstitch"}'); port=8632;; llm) routing=(); port=8631;; esac
    i=$((i+1)); slug=$(printf '%02d-%s-n%s' $i $pol $n)
    curl -sf -X POST http://127.0.0.1:$port/reset_prefix_cache > /dev/null
    curl -sf http://127.0.0.1:$port/v1/stats > runs/$slug.before.json
    $LOAD --workload low-effort --endpoint completions --clients $n --requests $((n*30)) --duration 400 --grace 60 --scale 0.03125 --input-scale 1 --tokenizer /work/main/.cache/assets/qwen3 --seed 1 --temperature 0 --quiet --json runs/$slug.json --url http://127.0.0.1:$port "${routing[@]}" > logs/$slug.txt 2>&1
    curl -sf http://127.0.0.1:$port/v1/stats > runs/$slug.after.json
    echo "$slug $(grep '^throughput' logs/$slug.txt) load $(cut -d' ' -f1 /proc/loadavg)"
done
