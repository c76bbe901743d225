"""`make bench`: every benchmark, one after another, each printing its own figures.

Benchmarks report; they never pass or fail on a time. Run one alone with
`.venv/bin/python benchmarks/<name>.py`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    ("rate limiter: added latency and Redis commands per call", "ratelimit.py", []),
    ("round trip: HTTP -> Celery -> worker -> result vs in-process", "roundtrip.py", []),
    ("durable requests: added latency of submit + poll vs a synchronous call", "durable.py", []),
    ("admission: hand-off, Redis commands per call, 1,000 waiters, throughput", "admission.py", []),
    ("dashboard queries on 1,000,000 completion rows", "dashboard_queries.py", []),
    ("command sandbox: added latency of bwrap per command", "sandbox.py", []),
    ("a worker killed while it starts a sandbox: what is left", "sandbox_kill.py", []),
    ("fair share and shared reads: a read behind a backlog, four reads at once", "fairness.py", []),
    ("edit plan: 100 edits that match nothing on a 3.6 MB file (issue 34)", "edit_plan.py", []),
    ("edge: one refusal from memory vs by the view, in process", "edge.py", []),
    ("admission scripts: settle and enter inside Redis by queue length", "scripts.py", []),
    ("a synchronous call's row draft: enter + row round trip with and without", "row_draft.py", []),
    ("overload: the contract 2.8 burst (10x the queue, one principal)", "overload.py", []),
    ("HTTP floor: the same burst against an ASGI app that only answers 429", "http_floor.py", []),
]


def main() -> int:
    quick = "--quick" in sys.argv[1:]
    failed = []
    for title, script, args in BENCHMARKS:
        print(f"\n=== {title} ({script})", flush=True)
        extra = ["--quick"] if quick and script == "admission.py" else []
        code = subprocess.call([sys.executable, str(HERE / script), *args, *extra])
        if code != 0:
            failed.append(script)
    if failed:
        print(f"\nbenchmarks that did not complete: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
