"""How long an edit plan that matches nothing takes: issue 34's 100 edits on a 3.6 MB file.

Calls ``edit_file`` directly (no API, no worker) on a generated source-like file, with 100
multi-line edits whose words all occur in the file but whose lines do not, so every edit
fails and earns the EDIT_CONFLICT hints. Reports the wall time of the whole call and the code
it ended with. ``--timeout-s`` is the call's deadline (a read or edit gets 30 s, contract §2.4).
Needs no database or Redis.

``--shape short`` makes the file of one short line repeated ("a b", 4 bytes a line) and
the edits two-line ones whose first line is that line: the most lines per megabyte, and a
first-line hint that holds on every line. ``--shape repeat`` makes it one character repeated
and each edit a run of 1,000 or more of it: every edit is ambiguous, and counting its
overlapping places is the work.

    .venv/bin/python benchmarks/edit_plan.py [--mb 3.6] [--edits 100] [--tolerant]
        [--timeout-s 30] [--shape source|short|repeat]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workspaces.operations import OperationError, run_operation


def source(size: int) -> str:
    lines: list[str] = []
    total = 0
    number = 0
    while total < size:
        line = f"    value_{number % 500} = compute(item_{number % 300}, limit={number % 97})\n"
        lines.append(line)
        total += len(line)
        number += 1
    return "".join(lines)


def edits(count: int) -> list[dict[str, object]]:
    # Words the file has, in lines it does not: each edit is "not found" with hints to look for.
    return [
        {
            "oldText": (
                f"    value_{n} = compute(item_{n}, limit={n % 97})\n"
                f"    value_{n + 1} = compute(item_{n}, limit={n % 89})\n"
                f"    return value_{n}\n"
            ),
            "newText": f"    value_{n} = 0\n",
        }
        for n in range(count)
    ]


def short_edits(count: int) -> list[dict[str, object]]:
    return [{"oldText": f"a b\nc{n}\n", "newText": "x"} for n in range(count)]


def repeat_edits(count: int) -> list[dict[str, object]]:
    return [{"oldText": "a" * (1000 + n), "newText": "x"} for n in range(count)]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=3.6)
    parser.add_argument("--edits", type=int, default=100)
    parser.add_argument("--tolerant", action="store_true")
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--shape", choices=["source", "short", "repeat"], default="source")
    args = parser.parse_args()
    root = os.path.realpath(tempfile.mkdtemp(prefix="sluice-bench-edit-"))
    size = int(args.mb * 1_000_000)
    texts = {"source": lambda: source(size), "short": lambda: "a b\n" * (size // 4)}
    text = texts.get(args.shape, lambda: "a" * size)()
    Path(root, "big.py").write_text(text)
    request: dict[str, object] = {
        "protocolVersion": 1,
        "operation": "edit_file",
        "workspaceId": "ws-1",
        "path": "big.py",
        "edits": {"source": edits, "short": short_edits}.get(args.shape, repeat_edits)(args.edits),
    }
    if args.tolerant:
        request["matching"] = "tolerant"
    try:
        started = time.monotonic()
        try:
            run_operation(request, root=root, deadline=started + args.timeout_s)
            outcome = "applied"
        except OperationError as exc:
            outcome = exc.code
        elapsed = time.monotonic() - started
        unchanged = Path(root, "big.py").read_text() == text
        print(
            f"{args.edits} edits, {len(text.encode()) / 1e6:.1f} MB, "
            f"{args.shape}, {'tolerant' if args.tolerant else 'exact'}, "
            f"deadline {args.timeout_s:g} s: "
            f"{outcome} after {elapsed:.2f} s; file unchanged: {unchanged}"
        )
    finally:
        shutil.rmtree(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
