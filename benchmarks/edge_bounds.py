"""The edge's bounds measured from outside (issue 34, "bounded before trusted"): one uvicorn
process served as `make run` serves it (config.server:SluiceHttpProtocol), raw sockets, and
the process's own memory from /proc/<pid>/status. One line per bound:

* headers: 16 parallel requests whose header value grows to 48 MiB; VmHWM before and after.
* redeem body: a 200 MiB chunked body, no key, to /v1/bridge/pairings/redeem: what the
  server took before it answered, and how far /tmp's use grew meanwhile.
* trickle: 200 redeem bodies that never end (a byte every 0.5 s): how many are still held
  after 40 s (the redeem rate limit raised, so that every one reaches the body deadline).
* redeem rate: 300 redeem attempts from one address, answers counted.
* key share: 8 never-ending execute bodies with one key in 4 spellings (cap 8, share 4), then
  another caller's call.

    .venv/bin/python benchmarks/edge_bounds.py [headers redeem_body trickle redeem_rate key_share]

Not in `make bench`: it times nothing, and the trickle takes 40 s.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
REDEEM = b"POST /v1/bridge/pairings/redeem HTTP/1.1\r\nHost: 127.0.0.1\r\n"
JSON = b"Content-Type: application/json\r\n"


class Api:
    def __init__(self, env: dict[str, str]) -> None:
        self.port = harness_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1",
             "--port", str(self.port), "--http", "config.server:SluiceHttpProtocol",
             "--timeout-keep-alive", "10", "--limit-concurrency", "4096", "--backlog", "2048",
             "--log-level", "warning", "--no-access-log"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                sock = self.connect()
                sock.sendall(
                    b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                )
                while sock.recv(65536):
                    pass
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the API did not start") from None
                time.sleep(0.2)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=120)

    def hwm_mib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
        raise AssertionError("no VmHWM")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def harness_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_of(sock: socket.socket) -> str:
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return "closed"
            data += chunk
    except OSError:
        return "reset"
    return data.split(b" ")[1].decode()


def tmp_used_mib() -> int:
    out = subprocess.run(["df", "-m", "--output=used", "/tmp"], capture_output=True, text=True)
    return int(out.stdout.split()[-1])


def headers(env: dict[str, str], key: str) -> str:
    api = Api(env)
    before = api.hwm_mib()
    answers: list[str] = []
    sent_mib: list[int] = []

    def one() -> None:
        sock, sent = api.connect(), 0
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
            while sent < 48 << 20:
                sock.sendall(b"a" * (1 << 20))
                sent += 1 << 20
            sock.sendall(b"\r\n\r\n")
        except OSError:
            pass
        answers.append(status_of(sock))
        sent_mib.append(sent >> 20)
        sock.close()

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = api.hwm_mib()
    api.stop()
    return (
        f"headers: 16 x 48 MiB header value: VmHWM {before} -> {after} MiB; answers "
        f"{dict(Counter(answers))}; at most {max(sent_mib)} MiB taken from one connection"
    )


def redeem_body(env: dict[str, str], key: str) -> str:
    api = Api(env)
    tmp_before = peak = tmp_used_mib()
    sock = api.connect()
    sock.sendall(REDEEM + JSON + b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (1 << 20) + b"a" * (1 << 20) + b"\r\n"
    sent = 0
    try:
        while sent < 200 << 20:
            sock.sendall(chunk)
            sent += 1 << 20
            if sent % (20 << 20) == 0:
                peak = max(peak, tmp_used_mib())
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass
    answer = status_of(sock)
    api.stop()
    return (
        f"redeem body: 200 MiB chunked, no key: {answer} after {sent >> 20} MiB taken; "
        f"/tmp use grew {peak - tmp_before} MiB"
    )


def trickle(env: dict[str, str], key: str) -> str:
    api = Api(env | {"SLUICE_BRIDGE_REDEEM_RATE_LIMIT": "1000/1m"})
    socks = []
    for _ in range(200):
        sock = api.connect()
        sock.sendall(REDEEM + JSON + b"Content-Length: 1000\r\n\r\n{")
        sock.settimeout(0.01)
        socks.append(sock)
    started, held, answers = time.monotonic(), list(socks), Counter[str]()
    while held and time.monotonic() < started + 40:
        for sock in list(held):
            try:
                sock.sendall(b" ")
                data = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            answers[data.split(b" ")[1].decode() if data else "closed"] += 1
            held.remove(sock)
        time.sleep(0.5)
    took = time.monotonic() - started
    for sock in socks:
        sock.close()
    api.stop()
    return (
        f"trickle: 200 redeem bodies, a byte every 0.5 s: {len(held)} still held after "
        f"{took:.0f} s; answers {dict(answers)}"
    )


def redeem_rate(env: dict[str, str], key: str) -> str:
    api = Api(env)
    body = json.dumps({"code": "x" * 32}).encode()
    answers, started = Counter[str](), time.monotonic()
    for _ in range(300):
        sock = api.connect()
        sock.sendall(REDEEM + JSON + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        answers[status_of(sock)] += 1
        sock.close()
    took = time.monotonic() - started
    api.stop()
    return f"redeem rate: 300 attempts from one address in {took:.1f} s: {dict(answers)}"


def key_share(env: dict[str, str], key: str) -> str:
    api = Api(env | {"SLUICE_MAX_CALLS_IN_FLIGHT": "8", "SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY": "4"})
    held = []
    for i in range(8):
        sock = api.connect()
        scheme = ("Bearer ", "Bearer  ", "bearer ", "BEARER   ")[i % 4]
        sock.sendall(
            b"POST /v1/workspace-tools/execute HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Authorization: {scheme}{key}\r\n".encode()
            + JSON
            + b"Content-Length: 100\r\n\r\n{"
        )
        held.append(sock)
    time.sleep(1)  # a report, not a test: the server has read the 8 headers by then
    refused = 0
    for sock in held:
        sock.settimeout(0.2)
        with contextlib.suppress(TimeoutError):
            refused += b" 503 " in sock.recv(65536)[:20]
    other = api.connect()
    other.sendall(
        b"POST /v1/workspace-tools/execute HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer another-callers-key\r\n" + JSON + b"Content-Length: 2\r\n\r\n{}"
    )
    answer = status_of(other)
    for sock in held:
        sock.close()
    api.stop()
    return (
        f"key share: 8 endless bodies, one key in 4 spellings (cap 8, share 4): "
        f"{8 - refused} held, {refused} refused 503; another caller then gets {answer}"
    )


def main() -> int:
    env = harness.prepare("sluice_bench_edge")
    key = harness.account("edge-bench")["api_key"]
    try:
        for name in sys.argv[1:] or [
            "headers",
            "redeem_body",
            "trickle",
            "redeem_rate",
            "key_share",
        ]:
            print(globals()[name](env, key), flush=True)
    finally:
        harness.cleanup_redis()
    return 0


if __name__ == "__main__":
    os.chdir(ROOT)
    raise SystemExit(main())
