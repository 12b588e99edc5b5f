# Throwaway probe: TTFT of streamed chat requests on ONE keep-alive connection (as
# tokenrouter-load's pooled client does), with or without TCP_QUICKACK re-armed.
import json, socket, sys, time
port, quick, n = int(sys.argv[1]), sys.argv[2] == "quick", int(sys.argv[3])
s = socket.create_connection(("127.0.0.1", port))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
def recv():
    if quick: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    d = s.recv(65536)
    if quick: s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
    return d
def once(i):
    body = json.dumps({"messages": [{"role": "user", "content": f"hello there number {i}"}], "max_tokens": 4,
                       "stream": True, "ignore_eos": True, "seed": i, "routing": {"policy": "always"}}).encode()
    req = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    t0 = time.perf_counter(); s.sendall(req); buf = b""; ttft = None
    while not buf.endswith(b"0\r\n\r\n"):
        buf += recv()
        if ttft is None and b'"content":"' in buf.replace(b'"content":""', b''):
            ttft = time.perf_counter() - t0
    return ttft
once(0)
ts = sorted(once(i) for i in range(1, n + 1))
print(f"keep-alive {'quickack' if quick else 'default '}: TTFT p50 {ts[n//2]*1e3:.1f} ms  min {ts[0]*1e3:.1f}  max {ts[-1]*1e3:.1f}")
