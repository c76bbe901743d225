"""A throwaway Postgres cluster on a free loopback port, which a test may stop and start.

Uses the server binaries of the machine's Postgres (Debian: /usr/lib/postgresql/<v>/bin).
Never touches the shared server on 5432. Postgres refuses to run as root, so as root the
cluster belongs to the `postgres` system user and runs as it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from livesupport import free_port


def _bin_dir() -> Path:
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(p.split("/")[4])
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("pg_ctl")
    if found is None:
        raise AssertionError(
            "Postgres server binaries (initdb, pg_ctl) are missing: apt-get install -y postgresql"
        )
    return Path(found).parent


class ThrowawayPostgres:
    def __init__(self) -> None:
        self.bin = _bin_dir()
        # Not pytest's tmp_path: its parents are private to root, and the server may run as `postgres`.
        self.root = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
        )

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(
            [*self.as_user, str(self.bin / tool), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                time.sleep(0.1)
        raise AssertionError(
            "the throwaway Postgres did not accept connections:\n" + self.log.read_text()
        )

    def stop(self) -> None:
        # Fast shutdown: open connections are cut, as in a real outage.
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):  # Already stopped.
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
