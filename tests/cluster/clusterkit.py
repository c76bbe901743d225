"""A throwaway local Redis Cluster: three masters on free loopback ports, no replicas.

Each node runs `redis-server --cluster-enabled yes` with its own config file in a temporary
directory; `redis-cli --cluster create` joins them and assigns the 16384 slots. Nothing is
persisted (no RDB, no AOF), and `stop()` kills every node, so a run leaves nothing behind.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis
from livesupport import NO_RETRY, free_port

NODES = 3


class LocalCluster:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """Any one node: the cluster clients learn the others from it."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self, timeout_s: float = 20.0) -> LocalCluster:
        for binary in ("redis-server", "redis-cli"):
            if shutil.which(binary) is None:
                raise RuntimeError(f"{binary} is not on PATH; the cluster tests need it")
        self.workdir.mkdir(parents=True, exist_ok=True)
        for i in range(NODES):
            # The bus port is named too: the default (port + 10000) may be taken, or past 65535.
            port, bus = free_port(), free_port()
            self.ports.append(port)
            args = [
                "redis-server", "--port", str(port), "--bind", "127.0.0.1",
                "--cluster-enabled", "yes", "--cluster-port", str(bus),
                "--cluster-config-file", str(self.workdir / f"nodes-{i}.conf"),
                "--cluster-node-timeout", "5000",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--daemonize", "no",
            ]  # fmt: skip
            self.procs.append(
                subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + timeout_s
        for port in self.ports:
            self._wait(lambda p=port: self._node(p).ping(), deadline, f"node {port} to start")
        subprocess.run(
            ["redis-cli", "--cluster", "create",
             *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=timeout_s,
        )  # fmt: skip
        for port in self.ports:
            self._wait(lambda p=port: self._state_ok(p), deadline, f"node {port}: cluster_state:ok")
        return self

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)

    def node_for_key(self, key: str) -> int:
        """The port of the master that owns `key`'s slot."""
        slot = self._node(self.ports[0]).cluster("KEYSLOT", key)
        for start, end, master, *_ in self._node(self.ports[0]).cluster("SLOTS"):
            if int(start) <= int(slot) <= int(end):
                return int(master[1])
        raise AssertionError(f"no node owns slot {slot}")

    @staticmethod
    def _node(port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5, retry=NO_RETRY)

    def _state_ok(self, port: int) -> bool:
        return self._node(port).cluster("INFO").get("cluster_state") == "ok"

    @staticmethod
    def _wait(check: object, deadline: float, what: str) -> None:
        while True:
            try:
                if check():  # type: ignore[operator]
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.05)
