#!/usr/bin/env bash
# SmolLM2-135M-Instruct served alone with real EOS: the Q4_1 file on candle's quantized path
# (`serve --model smollm2`) against the same file imported as f32, interleaved per N.
# Run from the repository root after `bash .ci/run` (the asset) and a release build.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
TR=target/release/tokenrouter
LOAD=target/release/tokenrouter-load
GGUF=.cache/assets/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
F32=/tmp/smol-f32
[ -d "$F32" ] || "$TR" model import --gguf "$GGUF" --out "$F32"
printf 'models:\n  - name: smollm2\n    path: %s\npolicy: {name: always}\n' "$F32" > "$HERE/f32.yaml"
serve() { # <label> <args...>
    local label="$1"; shift
    "$TR" --threads 2 serve "$@" --port 8722 > "$HERE/server-$label.log" 2>&1 &
    SERVER=$!
    for _ in $(seq 1 120); do curl -sf http://127.0.0.1:8722/health > /dev/null && return 0; sleep 0.5; done
    echo "server $label did not start" >&2; return 1
}
for n in 1 4 16; do
    for label in q4_1 f32; do
        if [ "$label" = q4_1 ]; then serve "$label" --model smollm2; else serve "$label" --config "$HERE/f32.yaml"; fi
        "$LOAD" --url http://127.0.0.1:8722 --workload low-effort --endpoint chat --allow-eos --temperature 0.7 \
            --scale 0.1 --clients "$n" --requests $((3 * n)) --seed 1 --tokenizer "$F32" --model smollm2 \
            --json "$HERE/$label-n$n.json" > "$HERE/$label-n$n.txt" 2>&1
        kill "$SERVER"; wait "$SERVER" 2>/dev/null || true
    done
done
python3 - "$HERE" <<'PY'
import json, pathlib, statistics, sys
here = pathlib.Path(sys.argv[1])
print("| N | model | output tok/s | TTFT p50 / p99 ms | finish stop / length | output tokens min / median / max |")
print("|---:|---|---:|---:|---:|---:|")
for n in (1, 4, 16):
    for label in ("q4_1", "f32"):
        d = json.loads((here / f"{label}-n{n}.json").read_text())
        s = d["summary"]
        reqs = d["requests"]
        outs = sorted(r.get("output_tokens", 0) for r in reqs)
        fin = [r.get("finish_reason") for r in reqs]
        ttft = s["ttft_s"]
        print(f"| {n} | {label} | {s['throughput_tok_s']:.1f} | "
              f"{ttft['p50'] * 1000:.0f} / {ttft['p99'] * 1000:.0f} | "
              f"{fin.count('stop')} / {fin.count('length')} | "
              f"{outs[0] if outs else 0} / {statistics.median(outs) if outs else 0} / {outs[-1] if outs else 0} |")
PY
