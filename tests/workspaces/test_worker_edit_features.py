"""§2.2.1 end to end: HTTP -> admission -> Celery -> a real `runworker` -> result.

The worker advertises its edit features and instruction files at registration; every answer
is held to LibreChat's own result rule (tests/librechat_rules.py).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest
from librechat_rules import assert_librechat_accepts_edit, assert_librechat_accepts_read
from livesupport import git_workspace
from workerkit import call, request

from workspaces.models import WorkerWorkspace

pytestmark = pytest.mark.e2e

AGENTS = b"# Agents\r\n\r\nRun `make test` before you commit.\r\n"
BOM_CRLF = b"\xef\xbb\xbfalpha\r\n    beta  \r\n    gamma\r\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = git_workspace(tmp_path / "repo", files={"twice.py": "  if a:\n    b\n  if a:\n    b\n"})
    (root / "AGENTS.md").write_bytes(AGENTS)
    (root / "crlf.txt").write_bytes(BOM_CRLF)
    return root


def answer(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_registration_advertises_edit_features_and_instruction_files(owner, worker) -> None:
    offer = WorkerWorkspace.objects.get(worker__worker_id=owner.worker_id, workspace_id="repo")
    assert sorted(offer.edit_features or []) == [
        "expected_base_sha256",
        "replace_all",
        "tolerant_match",
    ]
    assert offer.instruction_files == [
        {"path": "AGENTS.md", "bytes": len(AGENTS), "sha256": hashlib.sha256(AGENTS).hexdigest()}
    ]


def test_matches_are_present_only_when_asked(http, owner, worker, repo) -> None:
    plain = request("preview_edit", path="crlf.txt", edits=[{"oldText": "alpha", "newText": "A"}])
    result = answer(call(http, owner, plain))
    assert "matches" not in result
    assert_librechat_accepts_edit(plain, result)
    asked = {**plain, "edits": [{"oldText": "alpha", "newText": "A", "replaceAll": True}]}
    result = answer(call(http, owner, asked))
    assert result["matches"] == [{"strategy": "exact", "occurrences": 1}]
    assert result["replacements"] == 1
    assert_librechat_accepts_edit(asked, result)


def test_an_ambiguous_tolerant_edit_is_a_conflict_and_changes_nothing(
    http, owner, worker, repo
) -> None:
    before = (repo / "twice.py").read_bytes()
    body = request(
        "edit_file",
        path="twice.py",
        edits=[{"oldText": "if a:\n  b", "newText": "Q"}],
        matching="tolerant",
    )
    response = call(http, owner, body)
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "EDIT_CONFLICT"
    assert (repo / "twice.py").read_bytes() == before


def test_preview_and_edit_agree_byte_for_byte_with_bom_and_crlf(http, owner, worker, repo) -> None:
    edits = [{"oldText": "beta\ngamma", "newText": "BETA\nGAMMA"}]
    preview_body = request("preview_edit", path="crlf.txt", edits=edits, matching="tolerant")
    preview = answer(call(http, owner, preview_body))
    assert_librechat_accepts_edit(preview_body, preview)
    assert (repo / "crlf.txt").read_bytes() == BOM_CRLF
    edit_body = {**preview_body, "operation": "edit_file"}
    edited = answer(call(http, owner, edit_body))
    assert_librechat_accepts_edit(edit_body, edited)
    written = (repo / "crlf.txt").read_bytes()
    assert written == b"\xef\xbb\xbfalpha\r\n    BETA\r\n    GAMMA\r\n"
    assert written == b"\xef\xbb\xbf" + preview["content"].encode()
    assert preview["bytesWritten"] == edited["bytesWritten"] == len(written)
    assert (
        preview["matches"] == edited["matches"] == [{"strategy": "line-trimmed", "occurrences": 1}]
    )


def test_an_instruction_read_answers_the_exact_bytes(http, owner, worker, repo) -> None:
    body = request(
        "read_file", path="AGENTS.md", instructionSha256=hashlib.sha256(AGENTS).hexdigest()
    )
    result = answer(call(http, owner, body))
    assert_librechat_accepts_read(body, result)
    assert result["content"].encode() == AGENTS
    assert (result["startLine"], result["endLine"], result["truncated"]) == (1, 4, False)
    assert "nextStartLine" not in result


def test_an_instruction_file_the_worker_did_not_advertise_is_a_mismatch_not_started(
    http, owner, worker, repo
) -> None:
    # Created after registration: the worker advertised only AGENTS.md.
    (repo / "CLAUDE.md").write_text("late\n")
    sha = hashlib.sha256(b"late\n").hexdigest()
    response = call(http, owner, request("read_file", path="CLAUDE.md", instructionSha256=sha))
    assert response.status_code == 409, response.text
    assert response.json()["code"] == "WORKER_MISMATCH"
    assert "not started" in response.json()["error"]
    assert "CLAUDE.md" in response.json()["error"]


def test_an_old_worker_without_edit_features_gets_no_tolerant_edits(
    api, account_factory, tmp_path: Path
) -> None:
    account = account_factory()
    registration = {
        "workerId": account.worker_id,
        "workspaces": [{"workspaceId": "repo", "operations": ["edit_file", "preview_edit"]}],
        "slots": 1,
    }
    with api.client() as http:
        worker_auth = {"Authorization": f"Bearer {account.worker_token}"}
        assert (
            http.post("/v1/workers/register", json=registration, headers=worker_auth).status_code
            == 200
        )
        offer = WorkerWorkspace.objects.get(worker__worker_id=account.worker_id)
        assert offer.edit_features is None and offer.instruction_files == []
        edits = [{"oldText": "a", "newText": "b"}]
        tolerant = call(
            http, account, request("edit_file", path="f", edits=edits, matching="tolerant")
        )
        assert tolerant.status_code == 409 and tolerant.json()["code"] == "WORKER_MISMATCH"
        assert "tolerant_match" in tolerant.json()["error"]
        read = request("read_file", path="AGENTS.md", instructionSha256="0" * 64)
        assert call(http, account, read).json()["code"] == "WORKER_MISMATCH"


def test_an_edit_plan_that_outlives_its_deadline_answers_not_started(
    http, owner, worker, repo
) -> None:
    """Issue 34: 100 edits whose every answer is a long count over a 4 MB file. The plan needs
    many times the call's 3 s; the worker stops it at the deadline and says so, rather than
    the API answering 504 "may have run" while the worker burns on."""
    from admission.policy import policy_update

    text = "a" * 4_000_000
    (repo / "big.txt").write_text(text)
    edits = [{"oldText": "a" * (1000 + n), "newText": "b"} for n in range(100)]
    policy_update({"JOB_TIMEOUT": "3000"})
    try:
        response = call(http, owner, request("edit_file", path="big.txt", edits=edits))
    finally:
        policy_update({"JOB_TIMEOUT": "300000"})
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "EDIT_NOT_STARTED"
    assert "not started" in response.json()["error"]
    assert (repo / "big.txt").read_text() == text
    # Not quarantined: the workspace takes the next call.
    read = call(http, owner, request("read_file", path="crlf.txt"))
    assert read.status_code == 200, read.text
