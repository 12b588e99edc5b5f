cd /work/main
target/release/tokenrouter serve --config /tmp/specdemo/demo.yaml --no-warm-up > /tmp/specdemo/server2.log 2>&1 &
S=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8132/health >/dev/null && break; sleep 1; done
for n in 1 4; do
  target/release/tokenrouter-spec-bench --url http://127.0.0.1:8132 --workload chat --clients $n --rounds 10 --repeats 3 --max-tokens 64 --temperature 0 --speculative '{"method":"draft","max_tokens":8}' --json /tmp/specdemo/v2-chat-n$n-t0.json > /tmp/specdemo/v2-chat-n$n-t0.txt 2>&1
done
curl -s http://127.0.0.1:8132/metrics | grep -E "spec_" | grep -v "^#" > /tmp/specdemo/v2-metrics.txt
kill $S
echo done > /tmp/specdemo/finished2
