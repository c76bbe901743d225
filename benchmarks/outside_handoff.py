"""The hand-off between same-workspace calls measured the outside way (issue 15), on the
instance `make run` started and its demo worker: `benchmarks/admission.py`'s `e2e_handoff`
(8 clients keep one workspace's queue full with a command that prints its first and last
timestamps; the gap between one command's end and the next one's start, against the same
gap in a local loop starting the same command in the same sandbox, rounds alternating),
pointed at the demo workspace `app` and the demo worker's two workspaces.

    make run            # in another terminal, then:
    .venv/bin/python manage.py set_policy WORKSPACE_TOOLS_RATE_LIMIT=100000/30s
    .venv/bin/python benchmarks/outside_handoff.py [--calls 720] [--rounds 3]
    .venv/bin/python manage.py set_policy WORKSPACE_TOOLS_RATE_LIMIT=120/30s

(A round of 240 calls takes about 8 s: past the default rate limit of 120 per 30 s.) Not in
`make bench`: it needs the running instance. Reads the instance's settings from
var/run/env, as operator commands in this checkout do.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=720)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    args = parser.parse_args()
    # benchmarks/admission.py, under a name that is not the admission package's; importing it
    # sets this process up as its benchmarks are (Django's settings, the tests' helpers).
    spec = importlib.util.spec_from_file_location(
        "bench_admission", ROOT / "benchmarks/admission.py"
    )
    assert spec is not None and spec.loader is not None
    bench: Any = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    headers = {
        "Authorization": f"Bearer {(ROOT / 'var/demo-api-key').read_text().strip()}",
        "X-LibreChat-Code-Worker-ID": "demo-worker",
    }
    workspaces = [ROOT / "var/demo/app", ROOT / "var/demo/docs"]
    result = bench.e2e_handoff(
        args.url, headers, workspaces, args.calls, rounds=args.rounds, workspace_id="app"
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
