#!/usr/bin/env bash
# tokenrouter with curl: a streamed chat completion (SSE) that asks for the routing
# trace, then a non-streamed one. Usage: examples/curl.sh [BASE_URL]
set -euo pipefail
BASE="${1:-http://127.0.0.1:8000}"
MODEL="$(curl -sf "$BASE/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')"

curl -sfN "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d @- <<JSON
{"model": "$MODEL", "stream": true, "max_tokens": 12,
 "messages": [{"role": "user", "content": "Hello!"}],
 "stream_options": {"include_usage": true},
 "routing": {"trace": true}}
JSON
echo
curl -sf "$BASE/v1/chat/completions" -H 'Content-Type: application/json' -d @- <<JSON
{"model": "$MODEL", "max_tokens": 12, "messages": [{"role": "user", "content": "Hello!"}]}
JSON
echo
