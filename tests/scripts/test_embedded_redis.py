"""The embedded Redis `make run` starts (scripts/devprocs.py) refuses a client without its
password: a workspace command can reach any loopback port, and a passwordless default user
would give it every key, past the demo worker's own ACL user."""

from __future__ import annotations

import socket
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from livesupport import NO_RETRY, free_port, wait_until

from scripts.devprocs import embedded_redis, kept_port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[Path, str, int]]:
    port = free_port()
    args, url = embedded_redis(tmp_path / "redis", port)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield tmp_path / "redis", url, port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_the_embedded_redis_answers_only_with_its_password(
    server: tuple[Path, str, int],
) -> None:
    data, url, port = server
    owner = redis.Redis.from_url(url, socket_connect_timeout=1, retry=NO_RETRY)
    wait_until(lambda: _pings(owner), timeout_s=15)
    # The password lives only in the URL the instance hands its own processes and in a file
    # nobody else can read.
    assert stat.S_IMODE((data / "redis.conf").stat().st_mode) == 0o600
    assert owner.set("k", "v") and owner.get("k") == b"v"
    stranger = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, retry=NO_RETRY)
    with pytest.raises(redis.AuthenticationError):
        stranger.get("k")
    with pytest.raises(redis.AuthenticationError):
        stranger.execute_command("MONITOR")
    owner.close()
    stranger.close()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


def test_the_port_is_chosen_once_per_checkout_and_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "var" / "redis" / "port"
    first = kept_port(path)
    assert path.read_text().strip() == str(first)
    # Every later start has the same one, so URLs handed out before stay true.
    assert kept_port(path) == kept_port(path) == first
    # Only a port another program holds is given up, and that is said.
    with socket.socket() as other:
        other.bind(("127.0.0.1", first))
        other.listen()
        moved = kept_port(path)
    assert moved != first
    assert path.read_text().strip() == str(moved)
    said = capsys.readouterr().out
    assert f"port {first}" in said and f"using {moved}" in said
    assert kept_port(path) == moved
