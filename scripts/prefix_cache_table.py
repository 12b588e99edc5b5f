#!/usr/bin/env python3
"""TTFT by turn, prefix cache ON versus OFF, from tokenrouter-load JSON reports.

    scripts/prefix_cache_table.py RUNS_DIR [FLOOR_DIR]

RUNS_DIR holds one `tokenrouter-load --json` file per run, named `rNN-on.json` or
`rNN-off.json` (scripts/bench_prefix_cache.sh writes them). Completed requests of all
runs of a side are pooled by turn; percentiles interpolate linearly between ranks
(NumPy's default, as tokenrouter-load's own). Prints a Markdown table: per turn, the
requests, TTFT p50/p99 of each side, the OFF/ON ratios, and mean prompt and cached
tokens; then each run's TTFT p50 by turn, to show the spread between runs. FLOOR_DIR
holds runs of fresh short single-turn prompts against the same servers (same names):
their TTFT, pooled by side, is the floor under a cached turn's TTFT.
"""

import json
import pathlib
import sys
from collections import defaultdict


def quantile(values, q):
    v = sorted(values)
    if not v:
        return None
    rank = q * (len(v) - 1)
    lo, hi = int(rank), min(int(rank) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def load_runs(folder):
    """{side: [(run name, report)]}, runs in name order."""
    runs = defaultdict(list)
    for path in sorted(pathlib.Path(folder).glob("r*-*.json")):
        side = path.stem.rsplit("-", 1)[1]
        runs[side].append((path.stem, json.loads(path.read_text())))
    return runs


def by_turn(reports):
    """{turn (1-based): [completed request records]} over the reports."""
    turns = defaultdict(list)
    for report in reports:
        for r in report["requests"]:
            if r["ok"] and r.get("ttft_s") is not None:
                turns[r["turn"] + 1].append(r)
    return turns


def mean(values):
    return sum(values) / len(values) if values else 0.0


def ms(seconds):
    return "n/a" if seconds is None else f"{seconds * 1e3:.0f}"


def ratio(off, on):
    return "n/a" if not off or not on else f"{off / on:.1f}×"


def pooled_table(on, off):
    lines = [
        "| turn | requests (on/off) | TTFT p50 on | TTFT p50 off | p50 off ÷ on | TTFT p99 on | TTFT p99 off "
        "| p99 off ÷ on | prompt tokens | cached tokens on | cached tokens off |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for turn in sorted(set(on) | set(off)):
        a, b = on.get(turn, []), off.get(turn, [])
        ttft = lambda rs, q: quantile([r["ttft_s"] for r in rs], q)
        p50 = (ttft(a, 0.5), ttft(b, 0.5))
        p99 = (ttft(a, 0.99), ttft(b, 0.99))
        lines.append(
            f"| {turn} | {len(a)}/{len(b)} | {ms(p50[0])} ms | {ms(p50[1])} ms | {ratio(p50[1], p50[0])} "
            f"| {ms(p99[0])} ms | {ms(p99[1])} ms | {ratio(p99[1], p99[0])} "
            f"| {mean([r['prompt_tokens'] for r in a + b]):.0f} "
            f"| {mean([r.get('cached_tokens', 0) for r in a]):.0f} | {mean([r.get('cached_tokens', 0) for r in b]):.0f} |"
        )
    return lines


def per_run_table(runs):
    names = [(name, report) for side in ("on", "off") for name, report in runs.get(side, [])]
    turns = sorted({t for _, report in names for t in by_turn([report])})
    lines = [
        "| run | " + " | ".join(f"turn {t} p50" for t in turns) + " |",
        "|---|" + "---:|" * len(turns),
    ]
    for name, report in sorted(names):
        per_turn = by_turn([report])
        cells = [ms(quantile([r["ttft_s"] for r in per_turn.get(t, [])], 0.5)) + " ms" for t in turns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def floor_table(folder):
    runs = load_runs(folder)
    lines = ["| server | requests | prompt tokens | TTFT p50 | TTFT p99 |", "|---|---:|---:|---:|---:|"]
    for side in ("on", "off"):
        done = [r for _, report in runs.get(side, []) for r in report["requests"] if r["ok"] and r.get("ttft_s")]
        ttfts = [r["ttft_s"] for r in done]
        prompt = mean([r["prompt_tokens"] for r in done])
        lines.append(
            f"| cache {side} | {len(done)} | {prompt:.0f} | {ms(quantile(ttfts, 0.5))} ms | {ms(quantile(ttfts, 0.99))} ms |"
        )
    return lines


def main(folder, floor=None):
    runs = load_runs(folder)
    if not runs.get("on") or not runs.get("off"):
        sys.exit(f"{folder}: needs rNN-on.json and rNN-off.json runs")
    on = by_turn(report for _, report in runs["on"])
    off = by_turn(report for _, report in runs["off"])
    print("\n".join(pooled_table(on, off)))
    print()
    print("TTFT p50 by turn, each run:")
    print()
    print("\n".join(per_run_table(runs)))
    if floor:
        print()
        print("Fresh short single-turn prompts on the same servers (the floor under a cached turn):")
        print()
        print("\n".join(floor_table(floor)))


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(*sys.argv[1:])
