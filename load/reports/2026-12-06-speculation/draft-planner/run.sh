#!/usr/bin/env bash
# Draft-model speculation on a twin pair: measured throughput against the planner's
# prediction from the run's own counters (old planner: the bb5dd30 binary; new: this one).
cd /tmp/draftplan; mkdir -p runs
BIN=${BIN:-/work/main/target/release/tokenrouter}
LOAD=/work/main/target/release/tokenrouter-load
$BIN --threads 2 serve --config twin.yaml > server.log 2>&1 &
trap 'kill $(jobs -p) 2>/dev/null' EXIT
until curl -sf -o /dev/null http://127.0.0.1:8141/health; do sleep 2; done
$LOAD --workload low-effort --endpoint completions --clients 1 --requests 1 --scale 0.03125 --input-scale 1 --tokenizer /work/main/.cache/assets/qwen3 --seed 1001 --temperature 0 --quiet --url http://127.0.0.1:8141 > /dev/null 2>&1
for n in 1 4; do
  curl -sf http://127.0.0.1:8141/v1/stats > runs/n$n.before.json
  $LOAD --workload low-effort --endpoint completions --clients $n --requests $((n*20)) --duration 400 --grace 60 --scale 0.03125 --input-scale 1 --tokenizer /work/main/.cache/assets/qwen3 --seed 1 --temperature 0 --quiet --json runs/n$n.json --url http://127.0.0.1:8141 > runs/n$n.txt 2>&1
  curl -sf http://127.0.0.1:8141/v1/stats > runs/n$n.after.json
  echo "N=$n $(grep '^throughput' runs/n$n.txt)"
done
