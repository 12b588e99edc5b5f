cd /work/main
target/release/tokenrouter serve --config /tmp/specdemo/demo.yaml --no-warm-up > /tmp/specdemo/server.log 2>&1 &
S=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8132/health >/dev/null && break; sleep 1; done
for n in 1 4; do
  for t in 0 0.8; do
    target/release/tokenrouter-spec-bench --url http://127.0.0.1:8132 --workload chat --clients $n --rounds 10 --repeats 3 --max-tokens 64 --temperature $t --speculative '{"method":"draft","max_tokens":8}' --json /tmp/specdemo/chat-n$n-t$t.json > /tmp/specdemo/chat-n$n-t$t.txt 2>&1
  done
done
curl -s http://127.0.0.1:8132/metrics | grep -E "spec_" | grep -v "^#" > /tmp/specdemo/metrics.txt
kill $S
echo done > /tmp/specdemo/finished
