"""Simulated agents for the soak: each one an asyncio task calling its tenant's worker.

An agent loops until told to stop: it picks an operation (reads, lists, searches, writes,
edits, short commands), a workspace of its worker and sometimes a linked-worktree lane, sends
the call to one of the API processes under a fresh `X-LibreChat-Workspace-Request-Id`, and
records what came back. Now and then it gives up on a call after a short random wait (a client
disconnect while the call waits or runs). Commands append `<request id> start|end <ns>` to the
log file of their isolation key, so the checks can tell whether any ran twice or overlapped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

EXECUTE = "/v1/workspace-tools/execute"
# Share of calls the agent abandons after a short wait, and how short.
DISCONNECT_SHARE = 0.06
DISCONNECT_AFTER_S = (0.02, 0.8)
# Pause between an agent's calls: agents think, they do not hammer (the default rate limit,
# 120 per 30 s per principal, is then rarely reached, and a refusal is a typed 429 anyway).
THINK_S = (0.1, 1.0)
OPERATIONS = [
    ("read_file", 24),
    ("list_files", 10),
    ("search_text", 10),
    ("write_file", 10),
    ("edit_file", 8),
    ("preview_edit", 4),
    ("execute_command", 30),
    ("long_command", 4),
]


@dataclass
class Target:
    worker_id: str
    workspaces: list[str]
    lanes: list[str]  # lane names offered on workspaces[0], [] when the worker offers none


@dataclass
class CallRecord:
    request_id: str
    agent: int
    worker_id: str
    workspace: str
    lane: str
    operation: str
    api: int
    sent: float  # time.time()
    took: float
    status: int = 0  # 0: the client gave up (disconnect) or the transport failed
    code: str = ""
    content_type: str = ""
    disconnected: bool = False
    transport_error: str = ""
    log_file: str = ""  # commands only: the per-key log the command appends to


@dataclass
class Agent:
    number: int
    api_key: str
    target: Target
    api_urls: list[str]
    log_dir: Path
    records: list[CallRecord]
    rng: random.Random = field(default_factory=random.Random)
    # What this agent last wrote into its own file, per workspace and lane.
    versions: dict[tuple[str, str], int] = field(default_factory=dict)

    def key_log(self, workspace: str, lane: str) -> Path:
        return self.log_dir / f"{self.target.worker_id}.{workspace}.{lane or '_'}.log"

    def body(self, operation: str, workspace: str, lane: str, request_id: str) -> dict[str, Any]:
        base: dict[str, Any] = {"protocolVersion": 1, "workspaceId": workspace}
        if lane:
            base["worktree"] = lane
        own = f"agents/agent-{self.number}.txt"
        version = self.versions.get((workspace, lane), 0)
        if operation == "read_file":
            return base | {"operation": "read_file", "path": "README.md", "maxLines": 50}
        if operation == "list_files":
            return base | {"operation": "list_files", "path": "", "maxResults": 50}
        if operation == "search_text":
            return base | {"operation": "search_text", "query": "needle", "maxResults": 20}
        if operation == "write_file":
            self.versions[(workspace, lane)] = version + 1
            return base | {
                "operation": "write_file",
                "path": own,
                "content": f"agent {self.number}\nv={version + 1}\n",
                "overwrite": True,
            }
        if operation in ("edit_file", "preview_edit"):
            return base | {
                "operation": operation,
                "path": own,
                "edits": [{"oldText": f"v={version}\n", "newText": f"v={version + 1}\n"}],
            }
        log = self.key_log(workspace, lane)
        seconds = (
            self.rng.uniform(1.0, 2.0) if operation == "long_command" else self.rng.uniform(0, 0.2)
        )
        return base | {
            "operation": "execute_command",
            "command": (
                f'echo "{request_id} start $(date +%s%N)" >> {log}; sleep {seconds:.3f}; '
                f'echo "{request_id} end $(date +%s%N)" >> {log}'
            ),
            "timeoutMs": 10_000,
        }

    def pick(self) -> tuple[str, str, str]:
        names, weights = zip(*OPERATIONS, strict=True)
        operation = self.rng.choices(names, weights)[0]
        workspace = self.rng.choice(self.target.workspaces)
        lane = ""
        if self.target.lanes and workspace == self.target.workspaces[0] and self.rng.random() < 0.4:
            lane = self.rng.choice(self.target.lanes)
        if operation in ("edit_file", "preview_edit") and (workspace, lane) not in self.versions:
            operation = "write_file"  # an agent edits only a file it has written
        return operation, workspace, lane

    async def run(self, stop: asyncio.Event) -> None:
        # uvicorn closes a keep-alive connection idle for 5 s. A client that keeps it longer
        # races that close: its next request can go out on a connection the server is closing
        # and fail without reaching it. So idle connections are dropped after 3 s here (and a
        # proxy in front must do the same, docs/deploy.md).
        clients = [
            httpx.AsyncClient(
                base_url=url,
                timeout=httpx.Timeout(120.0, connect=5.0),
                limits=httpx.Limits(keepalive_expiry=3.0),
            )
            for url in self.api_urls
        ]
        headers = {
            "Authorization": f"Bearer {self.api_key}",
            "X-LibreChat-Code-Worker-ID": self.target.worker_id,
        }
        try:
            while not stop.is_set():
                await self.one_call(clients, headers)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.rng.uniform(*THINK_S))
        finally:
            for client in clients:
                await client.aclose()

    async def one_call(self, clients: list[httpx.AsyncClient], headers: dict[str, str]) -> None:
        operation, workspace, lane = self.pick()
        request_id = f"soak-{uuid.uuid4().hex}"
        body = self.body(operation, workspace, lane, request_id)
        api = self.rng.randrange(len(clients))
        record = CallRecord(
            request_id=request_id,
            agent=self.number,
            worker_id=self.target.worker_id,
            workspace=workspace,
            lane=lane,
            operation=body["operation"],
            api=api,
            sent=time.time(),
            took=0.0,
            log_file=str(self.key_log(workspace, lane)) if operation.endswith("command") else "",
        )
        self.records.append(record)
        headers = headers | {"X-LibreChat-Workspace-Request-Id": request_id}
        started = time.monotonic()
        try:
            if self.rng.random() < DISCONNECT_SHARE:
                status, content_type, text = await self.call_and_give_up(
                    self.api_urls[api], headers, body, self.rng.uniform(*DISCONNECT_AFTER_S)
                )
                if status == 0:
                    record.disconnected = True
                    record.took = time.monotonic() - started
                    return
            else:
                response = await clients[api].post(EXECUTE, json=body, headers=headers)
                status = response.status_code
                content_type = response.headers.get("content-type", "")
                text = response.text
        except (httpx.HTTPError, OSError) as exc:
            record.transport_error = repr(exc)[:200]
            record.took = time.monotonic() - started
            return
        record.took = time.monotonic() - started
        record.status = status
        record.content_type = content_type
        try:
            record.code = str(json.loads(text).get("code", "")) if status != 200 else ""
        except ValueError:
            record.code = "<not json>"
        if status == 429 and not record.code:
            record.code = "RATE_LIMITED"
        if operation == "edit_file" and status == 200:
            self.versions[(workspace, lane)] = self.versions.get((workspace, lane), 0) + 1

    @staticmethod
    async def call_and_give_up(
        url: str,
        headers: dict[str, str],
        body: dict[str, Any],
        after_s: float,
        on_sent: Callable[[], None] | None = None,
    ) -> tuple[int, str, str]:
        """POST on a connection of its own and close it `after_s` after the request is written,
        unless the answer came first: (status, content type, body), or (0, "", "") when the
        client gave up. The wait starts once the whole request is on the wire, so the server
        always has the complete call when the connection closes; `on_sent` is called then."""
        parts = urlsplit(url)
        data = json.dumps(body).encode()
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        try:
            writer.write(
                f"POST {EXECUTE} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                f"Connection: close\r\n{head}\r\n".encode()
                + data
            )
            await writer.drain()
            if on_sent is not None:
                on_sent()
            try:
                raw = await asyncio.wait_for(reader.read(), timeout=after_s)
            except TimeoutError:
                return 0, "", ""
        finally:
            writer.close()
        head_raw, _, payload = raw.partition(b"\r\n\r\n")
        lines = head_raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        fields = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
        lower = {k.lower(): v for k, v in fields.items()}
        if lower.get("transfer-encoding", "").lower() == "chunked":
            payload = dechunk(payload)
        return status, lower.get("content-type", ""), payload.decode("utf-8", "replace")


def dechunk(data: bytes) -> bytes:
    """The body of a chunked HTTP/1.1 answer (the API streams answers without Content-Length)."""
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out
