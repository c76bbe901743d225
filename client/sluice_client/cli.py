"""`python -m sluice_client`: one operation per invocation, for agents that shell out.

The result goes to stdout as JSON; an error goes to stderr as JSON. The exit code tells a
script whether a resend is safe without parsing anything:

    0  success
    2  not started: safe to resend (typed rejection, nothing sent, cancelled while waiting)
    3  may have run: check the workspace before resending
    4  invalid or refused: the request (or the command line) is wrong, or the worker refused
       it having done nothing (EDIT_CONFLICT, NOT_FOUND, ...); resending it cannot help

Ctrl-C cancels the call the way a cancel event does, so the exit code stays accurate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any, NoReturn

import httpx

from sluice_client.durable_answers import DurableMode
from sluice_client.errors import WorkspaceToolError, describe, worker_refused, worker_said
from sluice_client.operations import build_request
from sluice_client.sync_client import Client

EXIT_OK, EXIT_NOT_STARTED, EXIT_MAY_HAVE_RUN, EXIT_INVALID = 0, 2, 3, 4
_DURABLE_MODES: dict[str, DurableMode] = {"on": True, "auto": "auto", "off": False}


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    # argparse exits 2 on a usage error, which here would read as "not started, resend".
    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{self.prog}: {message}")


def exit_code(error: WorkspaceToolError) -> int:
    if (error.reason == "invalid" and error.not_started) or worker_refused(error):
        return EXIT_INVALID
    # An invalid *result* means the worker ran the call, so it is reported as "may have run".
    return EXIT_NOT_STARTED if error.not_started else EXIT_MAY_HAVE_RUN


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sluice_client", description="Run one Sluice workspace operation.")
    env = os.environ.get
    parser.add_argument("--url", default=env("SLUICE_URL"), help="Sluice base URL [$SLUICE_URL]")
    parser.add_argument("--key", default=env("SLUICE_API_KEY"), help="API key [$SLUICE_API_KEY]")
    parser.add_argument(
        "--worker", default=env("SLUICE_WORKER_ID"), help="worker id [$SLUICE_WORKER_ID]"
    )
    parser.add_argument("--max-queue-wait-ms", type=int, default=300_000)
    parser.add_argument("--max-rate-limit-wait-ms", type=int, default=20_000)
    parser.add_argument("--max-request-timeout-ms", type=int, default=None)
    parser.add_argument("--retry-queue-full", action="store_true", help="retry WORKER_QUEUE_FULL")
    parser.add_argument("--request-id", default=None, help="name the call, for `cancel`")
    durable = parser.add_mutually_exclusive_group()
    durable.add_argument(
        "--durable",
        action="store_const",
        const="on",
        dest="durable",
        help="submit the call, then look it up until it ends; fail if Sluice does not offer it",
    )
    durable.add_argument(
        "--durable-auto",
        action="store_const",
        const="auto",
        dest="durable",
        help="as --durable when Sluice offers it, else the synchronous endpoint",
    )
    parser.set_defaults(durable=env("SLUICE_DURABLE", "off"))
    ops = parser.add_subparsers(dest="operation", required=True, metavar="operation")

    def op(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = ops.add_parser(name, help=help_text)
        sub.add_argument("--workspace", required=True, help="workspace id")
        sub.add_argument("--workspace-instance", help="64-hex conversation worktree instance")
        sub.add_argument("--worktree", help="linked-worktree lane")
        return sub

    sub = op("read_file", "read lines of a file")
    sub.add_argument("--path", required=True)
    sub.add_argument("--start-line", type=int)
    sub.add_argument("--max-lines", type=int)
    sub = op("list_files", "list paths under a directory")
    sub.add_argument("--path", default="")
    sub.add_argument("--max-results", type=int)
    sub.add_argument("--after-path")
    sub = op("search_text", "search for a literal string")
    sub.add_argument("--query", required=True)
    sub.add_argument("--path")
    sub.add_argument("--max-results", type=int)
    sub = op("write_file", "write a whole file")
    sub.add_argument("--path", required=True)
    content = sub.add_mutually_exclusive_group(required=True)
    content.add_argument("--content")
    content.add_argument("--content-file", help="read the content from a file ('-' for stdin)")
    sub.add_argument("--overwrite", action="store_true")
    for name in ("preview_edit", "edit_file"):
        sub = op(name, "preview an edit" if name == "preview_edit" else "apply exact-text edits")
        sub.add_argument("--path", required=True)
        sub.add_argument("--edits", help='JSON list of {"oldText", "newText", "replaceAll"?}')
        sub.add_argument("--old", help="text to replace (a single edit)")
        sub.add_argument("--new", help="replacement text (a single edit)")
        sub.add_argument("--replace-all", action="store_true")
        if name == "edit_file":
            sub.add_argument("--expected-base-sha256")
    sub = op("execute_command", "run a shell command")
    sub.add_argument("--command", required=True)
    sub.add_argument("--cwd")
    sub.add_argument("--timeout-ms", type=int)
    sub.add_argument("--max-output-bytes", type=int)
    cancel = ops.add_parser("cancel", help="cancel a waiting call by its request id")
    cancel.add_argument("cancel_request_id", metavar="request_id")
    return parser


def _edits(args: argparse.Namespace) -> list[dict[str, Any]]:
    if args.edits is not None:
        if args.old is not None or args.new is not None:
            raise _UsageError("give --edits or --old/--new, not both")
        try:
            edits = json.loads(args.edits)
        except ValueError as exc:
            raise _UsageError(f"--edits is not JSON: {exc}") from None
        if not isinstance(edits, list):
            raise _UsageError("--edits must be a JSON list")
        return edits
    if args.old is None or args.new is None:
        raise _UsageError("give --edits, or both --old and --new")
    edit: dict[str, Any] = {"oldText": args.old, "newText": args.new}
    if args.replace_all:
        edit["replaceAll"] = True
    return [edit]


def _content(args: argparse.Namespace) -> str:
    if args.content is not None:
        return str(args.content)
    try:
        if args.content_file == "-":
            return sys.stdin.read()
        with open(args.content_file, encoding="utf-8") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise _UsageError(f"cannot read --content-file: {exc}") from None


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any]
    operation = args.operation
    if operation == "read_file":
        fields = {"path": args.path, "startLine": args.start_line, "maxLines": args.max_lines}
    elif operation == "list_files":
        fields = {"path": args.path, "maxResults": args.max_results, "afterPath": args.after_path}
    elif operation == "search_text":
        fields = {"query": args.query, "path": args.path, "maxResults": args.max_results}
    elif operation == "write_file":
        fields = {"path": args.path, "content": _content(args), "overwrite": args.overwrite}
    elif operation in ("preview_edit", "edit_file"):
        fields = {"path": args.path, "edits": _edits(args)}
        if operation == "edit_file":
            fields["expectedBaseSha256"] = args.expected_base_sha256
    else:
        fields = {
            "command": args.command,
            "cwd": args.cwd,
            "timeoutMs": args.timeout_ms,
            "maxOutputBytes": args.max_output_bytes,
        }
    return build_request(
        operation,
        args.workspace,
        workspace_instance_id=args.workspace_instance,
        worktree=args.worktree,
        **fields,
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    transport: httpx.BaseTransport | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    **client_options: Any,
) -> int:
    """Run the CLI; `transport` and `client_options` (clock, sleep...) are for tests."""
    out, err = stdout or sys.stdout, stderr or sys.stderr

    def fail(payload: dict[str, Any], code: int) -> int:
        print(json.dumps(payload, ensure_ascii=False), file=err)
        return code

    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # --help and --version end here, with their own status
            return exc.code if isinstance(exc.code, int) else EXIT_OK
        if args.durable not in _DURABLE_MODES:  # argparse checks choices, not defaults
            raise _UsageError(f"SLUICE_DURABLE must be one of on, auto, off: {args.durable!r}")
        if not args.url or not args.key:
            raise _UsageError("--url and --key (or SLUICE_URL and SLUICE_API_KEY) are required")
        request = None if args.operation == "cancel" else request_from_args(args)
        client = Client(
            args.url,
            api_key=args.key,
            worker_id=args.worker,
            max_queue_wait_ms=args.max_queue_wait_ms,
            max_rate_limit_wait_ms=args.max_rate_limit_wait_ms,
            max_request_timeout_ms=args.max_request_timeout_ms,
            retry_queue_full=args.retry_queue_full,
            durable=_DURABLE_MODES[args.durable],
            transport=transport,
            **client_options,
        )
    except (_UsageError, ValueError, TypeError) as exc:
        return fail({"error": str(exc), "reason": "invalid", "not_started": True}, EXIT_INVALID)

    cancel = threading.Event()
    with client, _sigint_sets(cancel):
        try:
            if request is None:
                result: dict[str, Any] = {"state": client.cancel_request(args.cancel_request_id)}
            else:
                result = client.execute(request, cancel=cancel, request_id=args.request_id)
        except WorkspaceToolError as exc:
            # What Sluice or the worker said, in words, rather than only inside "body".
            payload = {**exc.to_dict(), "error": describe(exc)}
            said = worker_said(exc.body)
            if said:
                payload["said"] = said
            return fail(payload, exit_code(exc))
    print(json.dumps(result, ensure_ascii=False), file=out)
    return EXIT_OK


@contextlib.contextmanager
def _sigint_sets(event: threading.Event) -> Iterator[None]:
    """Turn Ctrl-C into the cancel event while the call runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, lambda *_: event.set())
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run() -> NoReturn:
    """Console-script entry point."""
    sys.exit(main())
