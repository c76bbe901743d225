"""Retry-After against the wait it stands for (issue 37): how far a WORKSPACE_QUEUE_TIMEOUT's
Retry-After is from the time the refused call would really have waited for its place.

One API process, one worker with 2 slots and one workspace. The worker's pace is learned from
one command first. Then, for each backlog of N one-second commands on the workspace, a call
with a 1 s allowance is refused; the same call is sent again at once with a long allowance,
and the time from the refusal to its start (its own first timestamp) is what it would have
waited. Real Redis, real Postgres, real processes.

    .venv/bin/python benchmarks/retry_after.py [--backlogs 3,5,8,12] [--seconds 1] [--port P]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness

# The admission tests' helpers (callhelpers, held) drive the calls.
sys.path.append(str(harness.ROOT / "tests" / "admission"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backlogs", default="3,5,8,12")
    parser.add_argument("--seconds", type=float, default=1.0, help="each backlog command's sleep")
    parser.add_argument("--port", type=int, default=0, help="the API's port (0: any free one)")
    args = parser.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    env = harness.prepare("sluice_bench_retry_after", WORKSPACE_TOOLS_RATE_LIMIT="100000/1s")
    import livesupport
    from callhelpers import Caller, command, wait_until
    from django.conf import settings
    from livesupport import Worker, git_workspace, start_api
    from redis import Redis
    from test_admission_capacity import held

    from admission.queue import worker_keys

    if args.port:
        livesupport.free_port = lambda: args.port  # type: ignore[assignment]
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sluice-bench-retry-{os.getpid()}"
    acct = harness.account("retry-worker")
    paced = Redis.from_url(settings.ADMISSION_REDIS_URL)
    pace = worker_keys(settings.REDIS_KEY_PREFIX, acct["worker_id"]).pace
    api = start_api(env)
    worker = Worker(
        acct["worker_id"], acct["worker_token"], {"a": git_workspace(tmp / "a")}, api.url, env,
        slots=2,
    ).start()  # fmt: skip
    caller = Caller(
        api.url,
        {
            "Authorization": f"Bearer {acct['api_key']}",
            "X-LibreChat-Code-Worker-ID": acct["worker_id"],
        },
    )
    sleep = f"sleep {args.seconds:g}"
    rounds: list[dict[str, Any]] = []
    try:
        assert caller.send(command("a", sleep)).status_code == 200  # the worker's pace
        # Its row, and so the pace, is written just after the answer.
        wait_until(lambda: bool(paced.llen(pace)))
        for n in (int(x) for x in args.backlogs.split(",")):
            backlog = [caller.submit(command("a", sleep)) for _ in range(n)]
            # Every call of the backlog in the queue (or, the first ones, already through).
            wait_until(
                lambda n=n, backlog=backlog: (
                    len(held(acct["worker_id"])) + sum(f.done() for f in backlog) >= n
                )
            )
            refused = caller.send(command("a", "true"), wait_ms=1_000)
            refused_ns = time.time_ns()
            assert refused.status_code == 503, refused.text
            told = int(refused.headers["Retry-After"])
            assert refused.json()["retry_after_seconds"] == told
            again = caller.send(command("a", "date +%s%N"), wait_ms=120_000)
            assert again.status_code == 200, again.text
            waited_s = (int(again.json()["stdout"].strip()) - refused_ns) / 1e9
            assert all(f.result().status_code == 200 for f in backlog)
            rounds.append(
                {
                    "backlog": n,
                    "retry_after_s": told,
                    "would_have_waited_s": round(waited_s, 2),
                    "ratio": round(told / waited_s, 2) if waited_s > 0 else None,
                }
            )
    finally:
        caller.close()
        worker.stop()
        api.process.stop()
        harness.cleanup_redis()
    print(json.dumps({"command_s": args.seconds, "slots": 2, "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
