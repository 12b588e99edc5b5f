#!/usr/bin/env python3
"""The planner beside the measurements of a `load/run-bench` report folder.

For each (engine policy, N): measured throughput (mean and range over repeats), the
LLM-only throughput at the same N, their ratio (mean of per-repeat ratios and its
range), the thresholds planned for N (the nearest N at or below), the planner's source and its
predicted throughput for that N (the re-planner's own prediction when its last
switch was at this N, else the start-up table's entry for the nearest N at or below),
and predicted ÷ measured.

    scripts/planner_vs_measured.py load/reports/2026-12-05
"""
import csv
import json
import pathlib
import statistics
import sys
from collections import defaultdict


def main(folder: pathlib.Path) -> None:
    runs = defaultdict(list)  # (system, policy, n) -> [(json path, stats path or None)]
    with open(folder / "matrix.tsv") as f:
        for row in csv.reader(f, delimiter="\t"):
            if not row or row[0].startswith("#"):
                continue
            system, policy, n, _load, path = row
            stats = folder / path.replace(".json", ".stats.json")
            runs[(system, policy, int(n))].append((folder / path, stats if stats.exists() else None))

    def throughput(path):
        return json.loads(path.read_text())["summary"]["throughput_tok_s"]

    print("| policy | N | engine tok/s (range) | LLM-only tok/s | engine ÷ LLM-only (range) | thresholds in force | source | predicted tok/s | predicted ÷ measured |")
    print("|---|---:|---:|---:|---:|---|---|---:|---:|")
    for (system, policy, n), cells in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if system != "engine":
            continue
        engine = [throughput(p) for p, _ in cells]
        llm = [throughput(p) for p, _ in runs.get(("llm-only", "-", n), [])]
        ratios = [e / l for e, l in zip(engine, llm) if l > 0]
        force, source, predicted = planner_view(cells[-1][1], n)
        mean_e = statistics.mean(engine)
        print(
            f"| {policy} | {n} | {mean_e:.1f} ({min(engine):.1f}–{max(engine):.1f}) "
            f"| {statistics.mean(llm):.1f} " if llm else f"| {policy} | {n} | {mean_e:.1f} | – ",
            end="",
        )
        ratio = f"{statistics.mean(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "–"
        pred = f"{predicted:.1f}" if predicted else "–"
        pm = f"{predicted / mean_e:.2f}" if predicted and mean_e > 0 else "–"
        print(f"| {ratio} | {force} | {source} | {pred} | {pm} |")


def planner_view(stats_path, n):
    if stats_path is None:
        return "–", "–", None
    stats = json.loads(stats_path.read_text())
    planner = stats.get("planner") or {}
    planned = {int(k): v for k, v in (planner.get("planned") or {}).items()}
    at_or_below = [k for k in planned if k <= n]
    force = str(planned[max(at_or_below)]) if at_or_below else "?"
    source = planner.get("source", "?")
    predicted = None
    last = planner.get("last_replan")
    if last and last.get("active") == n:
        predicted = last.get("predicted_to")
    startup = planner.get("startup") or {}
    if predicted is None and startup.get("table"):
        below = [row for row in startup["table"] if row[0] <= n]
        if below:
            predicted = below[-1][2]
    return force, source, predicted


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
