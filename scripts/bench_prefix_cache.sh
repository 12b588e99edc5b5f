#!/usr/bin/env bash
# Prefix cache: agentic TTFT by turn, cache ON versus OFF (docs/benchmarks.md).
#
# Two server configs that differ only in `prefix_cache` and `tokenization.sessions`
# (config/agentic-cache-on.yaml, config/agentic-cache-off.yaml), each served on its own
# port, one server at a time, fresh for every run (nothing cached from an earlier run).
# Runs alternate ON, OFF, ON, OFF, ... with the same tokenrouter-load command and seed,
# so both sides get the same prompts and sampling seeds and noise from other work on the
# machine hits both alike. Every run's JSON (tokenrouter-load --json) is kept; the
# table of TTFT p50/p99 by turn (pooled over the runs of each side) and the OFF/ON
# ratios is printed and written to OUT/summary.md.
#
# After each agentic run the same server answers a few fresh single-turn requests of
# FLOOR_TOKENS tokens (about what a later turn still computes with the cache: the end of
# the previous answer, the new user turn, the template): their TTFT is the floor under a
# cached turn's TTFT (HTTP, template, tokenization, scheduling and that short prefill).
# What each server and the other processes were doing is kept in OUT/logs: the server's
# session-tokenizer and prefix-cache counters after the run, and `top` before and after it.
#
#   scripts/bench_prefix_cache.sh                     # 3 rounds, defaults below (~10 min on 2 cores)
#   ROUNDS=2 REQUESTS=8 OUT=/tmp/pc scripts/bench_prefix_cache.sh   # a quick look
#   BUILD=0 scripts/bench_prefix_cache.sh             # use target/release as it is
#
# Every setting is an environment variable (defaults in brackets):
#   ROUNDS [3]  OUT [load/reports/<date>-prefix-cache]  PORT_ON [8201]  PORT_OFF [8202]
#   SEED [0]  TURNS [4]  REQUESTS [24]  CLIENTS [1]  SCALE [0.05]  INPUT_SCALE [0.25]
#   P [0.2] (random routing rate)  FLOOR_TOKENS [140]  TOKENIZER [.cache/assets/qwen3]
#   THREADS [nproc]  BUILD [1]
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

ROUNDS="${ROUNDS:-3}"
OUT="${OUT:-load/reports/$(date +%F)-prefix-cache}"
PORT_ON="${PORT_ON:-8201}"
PORT_OFF="${PORT_OFF:-8202}"
SEED="${SEED:-0}"
TURNS="${TURNS:-4}"
REQUESTS="${REQUESTS:-24}"
CLIENTS="${CLIENTS:-1}"
SCALE="${SCALE:-0.05}"
INPUT_SCALE="${INPUT_SCALE:-0.25}"
P="${P:-0.2}"
FLOOR_TOKENS="${FLOOR_TOKENS:-140}"
TOKENIZER="${TOKENIZER:-$ROOT/.cache/assets/qwen3}"
THREADS="${THREADS:-$(nproc)}"
BUILD="${BUILD:-1}"
BIN="$ROOT/target/release"

mkdir -p "$OUT/runs" "$OUT/floor" "$OUT/logs"
OUT="$(cd "$OUT" && pwd)"
: > "$OUT/commands.txt"

say() { echo "bench_prefix_cache: $*" >&2; }
# A command as a shell would take it back: arguments with JSON or spaces quoted.
quoted() {
    local a out=()
    for a in "$@"; do
        if [[ "$a" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
    done
    echo "${out[*]}"
}
logged() { quoted "$@" >> "$OUT/commands.txt"; "$@"; }

SERVER_PID=""
stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

start_server() { # <side> <config> <port> <log>: in the background, until /health answers
    local side="$1" config="$2" port="$3" log="$4" tries=0
    echo "$(quoted "$BIN/tokenrouter" --threads "$THREADS" serve --config "$config" --port "$port") &" >> "$OUT/commands.txt"
    "$BIN/tokenrouter" --threads "$THREADS" serve --config "$config" --port "$port" > "$log" 2>&1 &
    SERVER_PID=$!
    until curl -sf -o /dev/null "http://127.0.0.1:$port/health"; do
        tries=$((tries + 1))
        if [ "$tries" -gt 600 ] || ! kill -0 "$SERVER_PID" 2>/dev/null; then
            say "the $side server did not come up; log:"; tail -20 "$log" >&2; exit 1
        fi
        sleep 0.5
    done
}

ROUTING="{\"policy\":\"random\",\"params\":{\"p\":$P}}"
# The measured command's arguments after --url: the same for both sides.
LOAD_ARGS=(--workload agentic --turns "$TURNS" --clients "$CLIENTS" --requests "$REQUESTS"
    --scale "$SCALE" --input-scale "$INPUT_SCALE" --seed "$SEED" --tokenizer "$TOKENIZER"
    --routing "$ROUTING" --quiet)

# One short low-effort request with another seed first: a fresh server's first request
# pays for first touches of weights and buffers. Its 5-token prompt shares no 16-token
# block with the measured prompts, so it leaves nothing in the cache they could use.
warm_up() { # <port>
    "$BIN/tokenrouter-load" --url "http://127.0.0.1:$1" --workload low-effort --requests 1 --scale 0.05 \
        --seed 999 --tokenizer "$TOKENIZER" --quiet --routing "$ROUTING" > /dev/null
}

# Fresh single-turn prompts of FLOOR_TOKENS tokens (low-effort is 100 tokens unscaled),
# 20-token outputs, another seed: nothing of them is cached.
floor_run() { # <port> <json>
    logged "$BIN/tokenrouter-load" --url "http://127.0.0.1:$1" --workload low-effort --requests 6 --scale 0.01 \
        --input-scale "$(awk -v n="$FLOOR_TOKENS" 'BEGIN { print n / 100 }')" --seed 998 --tokenizer "$TOKENIZER" \
        --routing "$ROUTING" --quiet --json "$2" > /dev/null
}

snapshot() { # <file>: what runs on the machine now
    { date +%T; cat /proc/loadavg; top -b -n1 -w 160 | sed -n '7,13p'; } >> "$1"
}

measure() { # <round> <side: on|off> <port>
    local round="$1" side="$2" port="$3" name
    name="$(printf 'r%02d-%s' "$round" "$side")"
    start_server "$side" "config/agentic-cache-$side.yaml" "$port" "$OUT/logs/$name-server.log"
    warm_up "$port"
    printf '%s\t%s\t%s\n' "$name" "$(cut -d' ' -f1-3 /proc/loadavg)" "$(date +%T)" >> "$OUT/loadavg.tsv"
    say "round $round, cache $side (port $port)"
    snapshot "$OUT/logs/$name-top.txt"
    logged "$BIN/tokenrouter-load" --url "http://127.0.0.1:$port" "${LOAD_ARGS[@]}" \
        --json "$OUT/runs/$name.json" > "$OUT/logs/$name.txt"
    snapshot "$OUT/logs/$name-top.txt"
    sed -n '/^TTFT by turn:/,$p' "$OUT/logs/$name.txt" >&2
    # The server's own account: session-tokenizer hits and prefix-cache hits.
    curl -sf "http://127.0.0.1:$port/metrics" | grep -E '^tokenrouter_(tokenize|prefix_cache)_' \
        > "$OUT/logs/$name-metrics.txt" || true
    floor_run "$port" "$OUT/floor/$name.json"
    stop_server
}

context() {
    {
        echo "commit: $(git rev-parse HEAD)"
        echo "uncommitted changes in the tree the binaries were built from:"
        git status --short | sed 's/^/  /'
        echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; threads per server: $THREADS"
        echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
    } > "$OUT/context.txt"
}

if [ "$BUILD" = 1 ]; then
    say "building tokenrouter and tokenrouter-load (release)"
    logged cargo build --release -p tokenrouter -p tokenrouter-load
fi
context
printf '# run\tload average (1, 5, 15 min) before it\ttime\n' > "$OUT/loadavg.tsv"
for round in $(seq 1 "$ROUNDS"); do
    measure "$round" on "$PORT_ON"
    measure "$round" off "$PORT_OFF"
done
python3 "$ROOT/scripts/prefix_cache_table.py" "$OUT/runs" "$OUT/floor" | tee "$OUT/summary.md"
