"""`manage.py contention_report [--since 1h] [--worker W] [--json] [--limit N]`.

Prints what the dashboard's history shows, for scripts and terminals: the workspaces and
calls blamed for queue timeouts, the most waited-on workspaces and isolation keys, and each
recent timeout with the calls that held the worker's slots while it waited.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from dashboard.attribution import (
    blamed_workspaces,
    blockers,
    holder_json,
    recent_timeouts,
    timeout_json,
)
from dashboard.history import Contended, outcomes, top_contended
from dashboard.window import Window, parse_duration


def contention_report(window: Window, *, limit: int) -> dict[str, Any]:
    timeouts = recent_timeouts(window, limit=limit)
    by_wait, by_timeouts = top_contended(window, by_key=False)
    keys_by_wait, keys_by_timeouts = top_contended(window, by_key=True)
    buckets = outcomes(window)
    return {
        "since": window.since.isoformat(),
        "until": window.until.isoformat(),
        "worker": window.worker,
        "calls": sum(sum(c.values()) for c in buckets.values()),
        "timeouts_total": sum(c.get("queue_timeout", 0) for c in buckets.values()),
        "blamed_workspaces": blamed_workspaces(timeouts),
        "blocking_calls": [
            holder_json(b.holder) | {"worker_id": b.worker_id, "timeouts": b.timeouts}
            for b in blockers(timeouts)
        ],
        "top_workspaces_by_wait": [_contended(c) for c in by_wait],
        "top_workspaces_by_timeouts": [_contended(c) for c in by_timeouts],
        "top_keys_by_wait": [_contended(c) for c in keys_by_wait],
        "top_keys_by_timeouts": [_contended(c) for c in keys_by_timeouts],
        "timeouts": [timeout_json(t) for t in timeouts],
    }


def _contended(c: Contended) -> dict[str, Any]:
    data = {
        "worker_id": c.worker_id,
        "workspace_id": c.workspace_id,
        "calls": c.calls,
        "total_wait_ms": c.total_wait_ms,
        "max_wait_ms": c.max_wait_ms,
        "timeouts": c.timeouts,
    }
    if c.key_hash:
        data["isolation_key_hash"] = c.key_hash
    return data


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.2f} s"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return ["  " + fmt.format(*headers).rstrip()] + ["  " + fmt.format(*r).rstrip() for r in rows]


def render_text(report: dict[str, Any]) -> str:
    scope = f"worker {report['worker']}" if report["worker"] else "all workers"
    lines = [
        f"Contention on {scope}, {report['since'][:19]} .. {report['until'][:19]} UTC",
        f"{report['calls']} calls, {report['timeouts_total']} queue timeouts",
        "",
    ]
    if report["blamed_workspaces"]:
        lines.append("Timeouts blamed on the workspace holding the slot:")
        lines += _table(
            ["worker", "workspace", "timeouts"],
            [
                [b["worker_id"], b["workspace_id"], str(b["timeouts"])]
                for b in report["blamed_workspaces"]
            ],
        )
        lines += ["", "Blocking calls:"]
        lines += _table(
            ["request id", "worker", "slot", "workspace", "key", "operation", "held", "timeouts"],
            [
                [
                    b["request_id"],
                    b["worker_id"],
                    str(b["slot_index"]),
                    b["workspace_id"],
                    b["isolation_key_hash"][:8],
                    b["operation"],
                    _seconds(b["held_ms"]),
                    str(b["timeouts"]),
                ]
                for b in report["blocking_calls"]
            ],
        )
        lines.append("")
    # Rows by workspace carry no isolation key: only the keys' table has a key column.
    for title, key, with_key in (
        ("Workspaces by total wait", "top_workspaces_by_wait", False),
        ("Isolation keys by total wait", "top_keys_by_wait", True),
    ):
        if report[key]:
            lines.append(f"{title}:")
            key_column = ["key"] if with_key else []
            lines += _table(
                ["worker", "workspace", *key_column, "calls", "total wait", "max wait", "timeouts"],
                [
                    [
                        c["worker_id"],
                        c["workspace_id"],
                        *([c.get("isolation_key_hash", "")[:8]] if with_key else []),
                        str(c["calls"]),
                        _seconds(c["total_wait_ms"]),
                        _seconds(c["max_wait_ms"]),
                        str(c["timeouts"]),
                    ]
                    for c in report[key]
                ],
            )
            lines.append("")
    if report["timeouts"]:
        lines.append(f"Recent timeouts (newest {len(report['timeouts'])}):")
        for t in report["timeouts"]:
            lines.append(
                f"  {t['arrived_at'][11:23]}  {t['worker_id']}  {t['workspace_id']}  key {t['isolation_key_hash'][:8]}"
                f"  {t['operation']}  waited {_seconds(t['queue_wait_ms'])}  request {t['request_id']}"
            )
            lines.append(f"      why: {t['verdict']}")
            for h in t["holders"]:
                mark = "*" if h["blamed"] else " "
                lines.append(
                    f"    {mark} slot {h['slot_index']}  {h['workspace_id']}  key {h['isolation_key_hash'][:8]}"
                    f"  {h['operation']}  held {_seconds(h['held_ms'])}  request {h['request_id']}"
                )
        lines.append(
            "  (* = blamed: it held the timed-out call's own isolation key, or every slot was busy)"
        )
    else:
        lines.append("No queue timeouts in this window.")
    return "\n".join(lines)


class Command(BaseCommand):
    help = "Attribute queue timeouts to the workspaces and calls that held the slots (from the completion log)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--since", default="1h", help="How far back to look: 90s, 15m, 1h, 7d [1h]."
        )
        parser.add_argument("--worker", default=None, help="Only this worker id.")
        parser.add_argument(
            "--json", action="store_true", help="Print one JSON object instead of text."
        )
        parser.add_argument(
            "--limit", type=int, default=50, help="Timeouts to attribute, newest first [50]."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            span = parse_duration(options["since"])
        except ValueError as exc:
            raise CommandError(f"--since: {exc}") from None
        if not 1 <= options["limit"] <= 10_000:
            raise CommandError("--limit must be within 1..10000")
        report = contention_report(
            Window.last(span, worker=options["worker"]), limit=options["limit"]
        )
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self.stdout.write(render_text(report))
