#!/usr/bin/env python3
"""One process vs two (the large model on a `tokenrouter node`), on this machine.

Starts both setups side by side (idle servers cost nothing), then runs the load
generator against them interleaved (A B A B ...) because a shared machine is noisy.
Each model gets its own 1-thread pool in both setups, so the only difference is
the process boundary. Prints throughput per concurrency and the latency added per
handoff at concurrency 1 ((latency B - latency A) / handoffs per request).

  scripts/cluster_bench.py --small /tmp/m/small --large /tmp/m/medium \
      --tokenrouter target/release/tokenrouter --load target/release/tokenrouter-load
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

MODELS = """models:
  - name: small
    path: {small}
    threads: 1
  - name: large
    path: {large}
    threads: 1
policy: {{name: random, params: {{p: 0.2}}}}
server: {{port: {port}, max_queued_requests: 1024}}
"""
CLUSTER = """cluster:
  cookie: bench
  remote: [{{model: large, node: "127.0.0.1:{node_port}"}}]
"""
NODE = """models:
  - name: large
    path: {large}
    threads: 1
"""


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def wait_up(port, limit=180):
    deadline = time.time() + limit
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except Exception:
            time.sleep(0.5)
    sys.exit(f"server on {port} did not come up")


def handoffs(port):
    """Handoffs so far, counted on the local model `small` (exact, not a cached snapshot)."""
    small = next(m for m in get(f"http://127.0.0.1:{port}/v1/stats")["models"] if m["model"] == "small")
    return small["stats"]["handoffs_in"] + small["stats"]["handoffs_out"]


def run_load(args, port, clients, requests, out):
    before = handoffs(port)
    cmd = [args.load, "--url", f"http://127.0.0.1:{port}", "--workload", "low-effort", "--clients", str(clients),
           "--requests", str(requests), "--scale", str(args.scale), "--tokenizer", args.tokenizer,
           "--json", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    report = json.load(open(out))
    return report, handoffs(port) - before


def print_summary(results):
    """Means over rounds; the added latency per handoff from the concurrency-1 runs."""
    def mean(setup, clients, key):
        vals = [r[key] for r in results if r["setup"] == setup and r["clients"] == clients]
        return statistics.mean(vals) if vals else float("nan")
    for clients in sorted({r["clients"] for r in results}):
        a, b = mean("one process", clients, "throughput"), mean("two processes", clients, "throughput")
        print(f"c={clients}: one process {a:.1f} tok/s, two processes {b:.1f} tok/s ({100 * (b / a - 1):+.1f}%)")
    ones = [r for r in results if r["clients"] == 1]
    if ones:
        lat = {s: mean(s, 1, "latency_mean_s") for s in ("one process", "two processes")}
        per_request = statistics.mean(r["handoffs"] / max(r["requests"], 1) for r in ones)
        added = (lat["two processes"] - lat["one process"]) / per_request if per_request else float("nan")
        print(f"c=1: latency {lat['one process']:.3f} s vs {lat['two processes']:.3f} s, "
              f"{per_request:.1f} handoffs per request: {1e3 * added:.2f} ms added per handoff")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--small", required=True)
    p.add_argument("--large", required=True)
    p.add_argument("--tokenrouter", required=True)
    p.add_argument("--load", required=True)
    p.add_argument("--tokenizer", default=".cache/assets/qwen3")
    p.add_argument("--scale", type=float, default=0.05)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="4,16")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--latency-requests", type=int, default=8)
    p.add_argument("--out", default="cluster-bench.json")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="cluster-bench-")
    single_port, front_port, node_port = 8301, 8302, 7302
    files = {
        "single.yaml": MODELS.format(small=args.small, large=args.large, port=single_port),
        "front.yaml": MODELS.format(small=args.small, large=args.large, port=front_port)
        + CLUSTER.format(node_port=node_port),
        "node.yaml": NODE.format(large=args.large),
    }
    for name, text in files.items():
        open(os.path.join(work, name), "w").write(text)
    env = dict(os.environ, TOKENROUTER_COOKIE="bench")
    log = open(os.path.join(work, "servers.log"), "w")
    procs = [
        subprocess.Popen([args.tokenrouter, "node", "--config", f"{work}/node.yaml", "--listen",
                          f"127.0.0.1:{node_port}"], env=env, stdout=log, stderr=log),
        subprocess.Popen([args.tokenrouter, "serve", "--config", f"{work}/single.yaml"], env=env, stdout=log,
                         stderr=log),
    ]
    try:
        time.sleep(1)
        procs.append(subprocess.Popen([args.tokenrouter, "serve", "--config", f"{work}/front.yaml"], env=env,
                                      stdout=log, stderr=log))
        wait_up(single_port)
        wait_up(front_port)
        results = []
        setups = [("one process", single_port), ("two processes", front_port)]
        plan = [(int(c), args.requests) for c in args.concurrency.split(",")] + [(1, args.latency_requests)]
        for clients, requests in plan:
            for r in range(args.rounds):
                for name, port in setups:
                    out = os.path.join(work, f"{port}-{clients}-{r}.json")
                    report, hand = run_load(args, port, clients, requests, out)
                    s = report["summary"]
                    row = {"setup": name, "clients": clients, "round": r, "handoffs": hand,
                           "requests": s["requests_done"], "failed": s["requests_failed"],
                           "output_tokens": s["output_tokens"], "throughput": s["throughput_tok_s"],
                           "latency_mean_s": (s.get("latency_s") or {}).get("mean")}
                    results.append(row)
                    print(f"{name:14} c={clients:<3} round {r}: {row['throughput']:.1f} tok/s, "
                          f"latency {row['latency_mean_s']:.2f} s, {row['output_tokens']} tokens, {hand} handoffs, "
                          f"{row['failed']} failed", flush=True)
        json.dump(results, open(args.out, "w"), indent=1)
        print_summary(results)
        print(f"raw results: {args.out} (servers' log: {work}/servers.log)")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
