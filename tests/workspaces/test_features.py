"""What a call needs from its worker's offer (§2.2.1), and how an old worker is read."""

from __future__ import annotations

from typing import Any

import pytest

from workspaces.features import (
    LEGACY_EDIT_FEATURES,
    effective_edit_features,
    offer_gap,
    request_needs,
)

EDIT = {"oldText": "a", "newText": "b"}
ALL = frozenset({"expected_base_sha256", "replace_all", "tolerant_match"})


def req(operation: str, **fields: Any) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": "ws", **fields}


CASES = [
    (req("edit_file", path="a", edits=[EDIT]), frozenset(), frozenset(), None),
    (req("edit_file", path="a", edits=[{**EDIT, "replaceAll": False}]), ALL - {"replace_all"}, frozenset(), "replace_all"),
    (req("edit_file", path="a", edits=[EDIT], matching="exact"), LEGACY_EDIT_FEATURES, frozenset(), "tolerant_match"),
    (req("preview_edit", path="a", edits=[EDIT], matching="tolerant"), ALL, frozenset(), None),
    (req("edit_file", path="a", edits=[EDIT], expectedBaseSha256="0" * 64), frozenset(), frozenset(), "expected_base_sha256"),
    (req("read_file", path="AGENTS.md", instructionSha256="0" * 64), ALL, frozenset({"CLAUDE.md"}), "AGENTS.md"),
    (req("read_file", path="AGENTS.md", instructionSha256="0" * 64), frozenset(), frozenset({"AGENTS.md"}), None),
    (req("read_file", path="AGENTS.md", startLine=1, maxLines=200), frozenset(), frozenset(), None),
]  # fmt: skip


@pytest.mark.parametrize(("request_body", "features", "files", "missing"), CASES)
def test_offer_gap_names_what_the_worker_does_not_offer(
    request_body: dict[str, Any],
    features: frozenset[str],
    files: frozenset[str],
    missing: str | None,
) -> None:
    gap = offer_gap(request_needs(request_body), edit_features=features, instruction_files=files)
    if missing is None:
        assert gap is None
    else:
        assert gap is not None and missing in gap


def test_an_old_worker_offers_what_sluice_workers_always_did() -> None:
    assert effective_edit_features(None) == {"replace_all", "expected_base_sha256"}
    assert effective_edit_features([]) == frozenset()
