"""A worker whose token is rotated stops at its next heartbeat instead of running on unseen."""

from __future__ import annotations

import time

from livesupport import git_workspace

from admission.management.commands.bootstrap import bootstrap


def test_a_worker_stops_and_deregisters_once_its_token_is_rotated(
    api, account_factory, worker_factory, tmp_path
):
    owner = account_factory()
    worker = worker_factory(owner, {"a": git_workspace(tmp_path / "a")}, slots=2)
    assert worker.process is not None
    bootstrap(
        tenant=owner.tenant, user=owner.user, worker_id=owner.worker_id, rotate_worker_token=True
    )
    started = time.monotonic()
    worker.process.proc.wait(timeout=20)
    # Heartbeats come every 5 s: the worker notices within one of them and drains.
    assert time.monotonic() - started < 15
    assert (
        "replaced or expired" in worker.process.output()
        or "shutting down" in worker.process.output()
    )
