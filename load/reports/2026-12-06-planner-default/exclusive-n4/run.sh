cd /work/main
B=target/release
$B/tokenrouter --threads 2 serve --config /tmp/b44/hand11.yaml > /tmp/b44/hand11.log 2>&1 &
for i in $(seq 1 200); do curl -sf http://127.0.0.1:8651/health >/dev/null && break; sleep 2; done
$B/tokenrouter --threads 2 serve --config /tmp/b44/llm.yaml > /tmp/b44/llm.log 2>&1 &
for i in $(seq 1 200); do curl -sf http://127.0.0.1:8652/health >/dev/null && break; sleep 2; done
L="$B/tokenrouter-load --workload low-effort --endpoint completions --scale 0.03125 --input-scale 1 --tokenizer .cache/assets/qwen3 --temperature 0 --quiet"
R='{"policy":"random","params":{"p":0.1}}'
for port in 8650 8651; do $L --clients 1 --requests 1 --seed 1001 --url http://127.0.0.1:$port --routing "$R" >/dev/null; done
$L --clients 1 --requests 1 --seed 1001 --url http://127.0.0.1:8652 >/dev/null
for rep in 1 2; do
  $L --clients 4 --requests 120 --duration 400 --grace 60 --seed $rep --json /tmp/b44/default-$rep.json --url http://127.0.0.1:8650 --routing "$R"
  $L --clients 4 --requests 120 --duration 400 --grace 60 --seed $rep --json /tmp/b44/hand11-$rep.json --url http://127.0.0.1:8651 --routing "$R"
  $L --clients 4 --requests 120 --duration 400 --grace 60 --seed $rep --json /tmp/b44/llm-$rep.json --url http://127.0.0.1:8652
done
curl -s http://127.0.0.1:8650/v1/stats > /tmp/b44/default.stats.json
curl -s http://127.0.0.1:8651/v1/stats > /tmp/b44/hand11.stats.json
echo done > /tmp/b44/finished
