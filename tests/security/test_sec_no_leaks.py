"""Nothing secret or private reaches the logs, the metrics or the completion log.

A tenant and a user with distinctive names run a day's worth of calls on a workspace that sits
under a distinctive host directory: writes with distinctive content, a search for it, edits,
commands with distinctive text, and a spread of errors (validation, a symlink out of the
workspace, a missing file, an existing file, a failing and a timed-out command, a bad key, a
foreign worker). Then the output of both API processes and of the worker, two `/metrics`
scrapes and every completion row of these calls are searched for: the API key, the worker
token, the file content, the command text, the host path, and the raw tenant and user (their
names, and their database ids in any field meant for them).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import METRICS_AUTH, git_workspace
from secsupport import EXECUTE, body

from admission.models import CompletionLog
from workspaces.models import Principal
from workspaces.secrets import keyed_hash

pytestmark = pytest.mark.e2e

HEX32 = re.compile(r"[0-9a-f]{32}")


def test_keys_tokens_content_commands_paths_and_raw_identities_stay_out_of_logs_metrics_and_rows(
    api_servers: Any, api: Any, account_factory: Any, worker_factory: Any, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:12]
    content = f"SECRET-CONTENT-{tag}"
    edited = f"SECRET-EDIT-{tag}"
    command = f"CMD-MARKER-{tag}"
    host_dir = f"HOSTDIR-{tag}"
    owner = account_factory(tenant=f"acme-PRIVATE-{tag}", user=f"alice-PRIVATE-{tag}")
    outsider = account_factory()
    root = tmp_path / host_dir
    repo = git_workspace(root / "repo")
    (root / "outside").mkdir()
    (root / "outside" / "x.txt").write_text(f"{content} outside\n")
    (repo / "escape").symlink_to(root / "outside")
    worker = worker_factory(owner, {"repo": repo})

    calls: list[tuple[str, dict[str, Any], dict[str, str], int]] = [
        (
            "write",
            body("write_file", path="notes/s.txt", content=content, overwrite=False),
            {},
            200,
        ),
        (
            "exists",
            body("write_file", path="notes/s.txt", content=content, overwrite=False),
            {},
            409,
        ),
        ("read", body("read_file", path="notes/s.txt"), {}, 200),
        ("search", body("search_text", query=content), {}, 200),
        (
            "preview",
            body(
                "preview_edit", path="notes/s.txt", edits=[{"oldText": content, "newText": edited}]
            ),
            {},
            200,
        ),
        (
            "edit",
            body("edit_file", path="notes/s.txt", edits=[{"oldText": content, "newText": edited}]),
            {},
            200,
        ),
        ("list", body("list_files", path="notes"), {}, 200),
        (
            "command",
            body("execute_command", command=f"echo {command}; echo {command} >&2; exit 3"),
            {},
            200,
        ),
        (
            "timeout",
            body("execute_command", command=f"sleep 5 # {command}", timeoutMs=300),
            {},
            200,
        ),
        ("symlink", body("read_file", path="escape/x.txt"), {}, 422),
        ("missing", body("read_file", path=f"missing-{content}.txt"), {}, 422),
        ("bad cwd", body("execute_command", command=f"echo {command}", cwd="nowhere"), {}, 422),
        ("invalid", body("execute_command", command=f"echo {command}\x00"), {}, 400),
        ("unknown field", body("read_file", path="a", **{content: 1}), {}, 400),
        ("bad key", body("execute_command", command=f"echo {command}"), {"bad-key": "1"}, 401),
        ("foreign", body("execute_command", command=f"echo {command}"), {"foreign": "1"}, 404),
    ]
    request_ids = []
    with api.client() as http, httpx.Client(base_url=api_servers[1].url, timeout=60) as other:
        for n, (name, payload, how, status) in enumerate(calls):
            rid = f"noleak-{tag}-{n:02d}"
            request_ids.append(rid)
            headers = {
                **owner.auth,
                "X-LibreChat-Code-Worker-ID": owner.worker_id,
                "X-LibreChat-Workspace-Request-Id": rid,
            }
            if "bad-key" in how:
                headers["Authorization"] = f"Bearer slk_{tag}_not-a-key"
            if "foreign" in how:
                headers["X-LibreChat-Code-Worker-ID"] = outsider.worker_id
            # Half of the calls go through the second API process.
            answer = (http if n % 2 else other).post(EXECUTE, headers=headers, json=payload)
            assert answer.status_code == status, (name, answer.text)
            if name == "symlink":
                assert host_dir not in answer.text
        metrics = (
            http.get("/metrics", headers=METRICS_AUTH).text
            + other.get("/metrics", headers=METRICS_AUTH).text
        )

    # Every call leaves one row; 401s carry the request id too.
    deadline = time.monotonic() + 15
    while CompletionLog.objects.filter(request_id__in=request_ids).count() < len(calls):
        assert time.monotonic() < deadline, "completion rows did not land"
        time.sleep(0.1)
    rows = list(CompletionLog.objects.filter(request_id__in=request_ids).values())
    worker.stop()
    assert worker.process is not None
    haystacks = {
        "api 1 output": api_servers[0].process.output(),
        "api 2 output": api_servers[1].process.output(),
        "worker output": worker.process.output(),
        "metrics": metrics,
        "completion rows": json.dumps(rows, default=str),
    }
    principal = Principal.objects.select_related("tenant").get(name=owner.user)
    secrets = {
        "API key": owner.api_key,
        "API key (random part)": owner.api_key.split("_", 2)[2],
        "worker token": owner.worker_token,
        "worker token (random part)": owner.worker_token.split("_", 2)[2],
        "file content": content,
        "edited content": edited,
        "command text": command,
        "host directory": host_dir,
        "host path": str(root),
        "tenant name": owner.tenant,
        "user name": owner.user,
    }
    for where, text in haystacks.items():
        for what, secret in secrets.items():
            assert secret not in text, f"{what} found in {where}"

    # Tenants and principals appear only as keyed hashes, never as their database ids.
    tenant_hash = keyed_hash("tenant", str(principal.tenant_id))
    principal_hash = keyed_hash("principal", f"{principal.tenant_id}:{principal.pk}")
    for row in rows:
        assert row["tenant_hash"] in ("", tenant_hash), row
        assert row["principal_hash"] in ("", principal_hash), row
    assert sum(row["tenant_hash"] == tenant_hash for row in rows) == len(calls) - 1
    logged = [
        json.loads(line)
        for line in haystacks["api 1 output"].splitlines() + haystacks["api 2 output"].splitlines()
        if tag in line and line.startswith("{")
    ]
    completed = [r for r in logged if r["message"] == "Workspace tool request completed"]
    assert len(completed) == len(calls)
    for record in logged:
        for field, value in record.items():
            if re.search(r"tenant|principal|user", field):
                assert field.endswith("_hash"), (field, record)
                assert value == "" or HEX32.fullmatch(str(value)), (field, record)
