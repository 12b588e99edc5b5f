"""Per-turn TTFT and bytes sent for an agent transcript, three ways (issue 41):
chat completions resending the whole transcript, the Responses API sending only the new
turn through `previous_response_id`, and chat against a server with the prefix cache off.
Each turn adds a tool output of --tool-bytes bytes; the model answers in --answer-tokens
greedy tokens. TTFT is measured to the first streamed text (or event with output).

    python3 scripts/agent_turns_bench.py --url http://127.0.0.1:8140 \
        --url-no-cache http://127.0.0.1:8141 --turns 20 --repeats 3 --out load/reports/X

Writes turns.json and README.md (a table of medians per turn, with the spread over
repeats) under --out, and prints the table. Standard library only.
"""
import argparse
import http.client
import json
import os
import random
import statistics
import sys
import time
import urllib.parse

WORDS = ("src lib main test build error warning note file line function return value type module "
         "crate struct impl trait field method call path index offset token batch model cache step").split()


def tool_output(turn: int, size: int) -> str:
    rng = random.Random(turn)
    lines = [f"$ cargo test step {turn}"]
    while sum(len(l) + 1 for l in lines) < size:
        lines.append(" ".join(rng.choice(WORDS) for _ in range(10)))
    return "\n".join(lines)[:size]


def stream_post(url: str, path: str, body: dict) -> tuple[float, list[dict], int]:
    """POSTs `body` with stream on; returns (seconds to the first output, events, bytes sent)."""
    parts = urllib.parse.urlsplit(url)
    data = json.dumps(body).encode()
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    start = time.perf_counter()
    connection.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{path}: {response.status} {response.read()[:500]!r}")
    first = None
    events = []
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        events.append(event)
        if first is None and has_output(event):
            first = time.perf_counter() - start
    connection.close()
    return (first if first is not None else time.perf_counter() - start), events, len(data)


def has_output(event: dict) -> bool:
    if event.get("type") in ("response.output_text.delta", "response.output_item.added"):
        return True
    choices = event.get("choices") or []
    return bool(choices) and bool((choices[0].get("delta") or {}).get("content"))


def chat_text(events: list[dict]) -> str:
    return "".join((e["choices"][0].get("delta") or {}).get("content") or "" for e in events if e.get("choices"))


def usage_of(events: list[dict]) -> dict:
    for e in reversed(events):
        if e.get("usage"):
            return e["usage"]
        if e.get("type") in ("response.completed", "response.incomplete"):
            u = e["response"]["usage"]
            return {"prompt_tokens": u["input_tokens"], "cached": u["input_tokens_details"]["cached_tokens"]}
    return {}


def one_line_ttft(url: str, answer_tokens: int, samples: int, tag: str) -> list[float]:
    return fresh_ttft(url, answer_tokens, [f"Say hello to {tag} {i}." for i in range(samples)])


def fresh_ttft(url: str, answer_tokens: int, prompts: list[str]) -> list[float]:
    out = []
    for prompt in prompts:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": answer_tokens,
                "temperature": 0, "stream": True}
        ttft, _, _ = stream_post(url, "/v1/chat/completions", body)
        out.append(ttft)
    return out


def run_chat(url: str, args, run: int, tag: str) -> list[dict]:
    # Each mode's transcript is its own (the tag): one mode must not hit K/V another cached.
    messages = [{"role": "system", "content": f"You are a coding agent ({tag}, run {run})."},
                {"role": "user", "content": "Fix the failing test."}]
    rows = []
    for turn in range(args.turns):
        body = {"messages": messages, "max_tokens": args.answer_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        ttft, events, sent = stream_post(url, "/v1/chat/completions", body)
        usage = usage_of(events)
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rows.append({"turn": turn + 1, "ttft_s": ttft, "bytes_sent": sent, "prompt_tokens": usage.get("prompt_tokens"),
                     "cached_tokens": cached})
        messages.append({"role": "assistant", "content": chat_text(events)})
        messages.append({"role": "user", "content": tool_output(turn, args.tool_bytes)})
    return rows


def run_responses(url: str, args, run: int, tag: str) -> list[dict]:
    previous = None
    new_input = [{"role": "system", "content": f"You are a coding agent ({tag}, run {run})."},
                 {"role": "user", "content": "Fix the failing test."}]
    rows = []
    for turn in range(args.turns):
        body = {"input": new_input, "max_output_tokens": args.answer_tokens, "temperature": 0, "stream": True}
        if previous:
            body["previous_response_id"] = previous
        ttft, events, sent = stream_post(url, "/v1/responses", body)
        done = next(e for e in reversed(events) if e.get("type") in ("response.completed", "response.incomplete"))
        u = done["response"]["usage"]
        rows.append({"turn": turn + 1, "ttft_s": ttft, "bytes_sent": sent, "prompt_tokens": u["input_tokens"],
                     "cached_tokens": u["input_tokens_details"]["cached_tokens"]})
        previous = done["response"]["id"]
        new_input = [{"role": "user", "content": tool_output(turn, args.tool_bytes)}]
    return rows


def median_spread(values: list[float]) -> str:
    m = statistics.median(values)
    return f"{m * 1e3:.0f} ({min(values) * 1e3:.0f}–{max(values) * 1e3:.0f})"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="a server with the prefix cache on")
    p.add_argument("--url-no-cache", required=True, help="the same model with the prefix cache off")
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--tool-bytes", type=int, default=1500)
    p.add_argument("--answer-tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-cache-runs", type=int, default=1,
                   help="runs of the prefix-cache-off mode (each prefills the whole transcript every turn: slow)")
    p.add_argument("--out", required=True)
    p.add_argument("--from-json", help="only write the report again from a turns.json this script wrote")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    modes = {"chat": (run_chat, args.url), "responses": (run_responses, args.url),
             "chat, prefix cache off": (run_chat, args.url_no_cache)}
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        return report(results, args)
    results = {"args": vars(args), "one_line_ttft_s": [], "turn_sized_ttft_s": [], "runs": {m: [] for m in modes}}
    for run in range(args.repeats):
        results["one_line_ttft_s"] += one_line_ttft(args.url, args.answer_tokens, 5, f"run {run}")
        # A fresh prompt as long as one turn's new input: what a turn must prefill at least.
        turn_sized = [f"run {run}.{i}\n" + tool_output(1000 + 10 * run + i, args.tool_bytes) for i in range(5)]
        results["turn_sized_ttft_s"] += fresh_ttft(args.url, args.answer_tokens, turn_sized)
        for name, (fn, url) in modes.items():
            if url == args.url_no_cache and run >= args.no_cache_runs:
                continue
            results["runs"][name].append(fn(url, args, run, name))
            print(f"run {run + 1}: {name} done", file=sys.stderr)
    with open(os.path.join(args.out, "turns.json"), "w") as f:
        json.dump(results, f, indent=1)
    return report(results, args)


def report(results: dict, args) -> int:
    modes = [m for m, runs in results["runs"].items() if runs]
    one_line = results["one_line_ttft_s"]
    turn_sized = results["turn_sized_ttft_s"]
    lines = [f"One-line prompt TTFT: median {median_spread(one_line)} ms over {len(one_line)} requests; a fresh prompt "
             f"of one turn's size ({args.tool_bytes} bytes): median {median_spread(turn_sized)} ms over {len(turn_sized)}.", "",
             "| turn | " + " | ".join(f"{m}: TTFT ms (min–max) | bytes | cached/prompt" for m in modes) + " |",
             "|---:|" + "---:|---:|---:|" * len(modes)]
    for t in range(args.turns):
        cells = []
        for name in modes:
            rows = [r[t] for r in results["runs"][name]]
            cells += [median_spread([r["ttft_s"] for r in rows]), str(rows[0]["bytes_sent"]),
                      f"{rows[0]['cached_tokens']}/{rows[0]['prompt_tokens']}"]
        lines.append(f"| {t + 1} | " + " | ".join(cells) + " |")
    base = statistics.median(one_line)
    lines.append("")
    for name in modes:
        later = [statistics.median(r[t]["ttft_s"] for r in results["runs"][name]) for t in range(1, args.turns)]
        total = sum(r["bytes_sent"] for r in results["runs"][name][0])
        sized = statistics.median(turn_sized)
        lines.append(f"- {name}: turns 2–{args.turns} TTFT ÷ one-line prompt: median {statistics.median(later) / base:.2f}×, "
                     f"worst {max(later) / base:.2f}×; ÷ a fresh turn-sized prompt: median "
                     f"{statistics.median(later) / sized:.2f}×, worst {max(later) / sized:.2f}×; bytes sent in all {total:,}")
    table = "\n".join(lines)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(f"# Agent transcript, {args.turns} turns, {args.tool_bytes}-byte tool outputs\n\n{table}\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
