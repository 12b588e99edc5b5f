"""How many requests the KV ledger admits at once (docs/benchmarks.md, "Admission at the
default max_tokens"): opens N streaming chat requests without max_tokens against a
server, polls /v1/stats for 20 s while they are open, and prints the stats' `kv` entry
with the most requests admitted.

    tokenrouter serve --port 8711 &          # or --config with admission.share_kv: false
    python3 scripts/kv_admitted.py http://127.0.0.1:8711 160
"""
import json, sys, threading, time, urllib.request
url, n = sys.argv[1], int(sys.argv[2])
def go(i):
    body = json.dumps({"model": "small+large", "stream": True,
        "messages": [{"role": "user", "content": f"Say hi number {i}, please, in a few words."}]}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for _ in r:
                if stop.is_set():
                    return
    except Exception as e:
        pass
stop = threading.Event()
threads = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(n)]
for t in threads: t.start()
best = None
for _ in range(20):
    time.sleep(1)
    s = json.load(urllib.request.urlopen(url + "/v1/stats"))
    kv = s.get("kv") or s.get("kv_usage")
    if best is None or kv["admitted"] > best["admitted"]:
        best = kv
print(json.dumps(best))
stop.set()
