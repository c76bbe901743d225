"""Edit features and instruction files a worker offers per workspace, and what a call needs.

Contract §2.2.1: a worker advertises at registration which edit features it supports
(`editFeatures`) and which instruction files it can serve whole (`instructionFiles`); a call
that uses something its worker did not advertise is refused 409 WORKER_MISMATCH before it is
queued or dispatched. Pure functions without Django, so the worker (which advertises) and the
API (which checks) share one list of names.

A worker registered without `editFeatures` predates the field: it is taken to offer what every
Sluice worker did before it (`replace_all` and `expected_base_sha256`), but not tolerant
matching, and no instruction files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

EXPECTED_BASE_SHA256 = "expected_base_sha256"
REPLACE_ALL = "replace_all"
TOLERANT_MATCH = "tolerant_match"
EDIT_FEATURES = (EXPECTED_BASE_SHA256, REPLACE_ALL, TOLERANT_MATCH)
LEGACY_EDIT_FEATURES = frozenset({EXPECTED_BASE_SHA256, REPLACE_ALL})


@dataclass(frozen=True)
class Needs:
    """What one validated request uses beyond the operation itself."""

    edit_features: frozenset[str]
    instruction_file: str | None


def effective_edit_features(advertised: Iterable[str] | None) -> frozenset[str]:
    """The features a workspace offers; None is an old worker that sent no `editFeatures`."""
    return LEGACY_EDIT_FEATURES if advertised is None else frozenset(advertised)


def request_needs(request: Mapping[str, object]) -> Needs:
    features: set[str] = set()
    edits = request.get("edits")
    # Naming the field at all counts, whatever its value: a request that names `matching` or
    # `replaceAll` expects `matches` in its result, which only a worker with the feature sends.
    if "matching" in request:
        features.add(TOLERANT_MATCH)
    if isinstance(edits, list) and any(isinstance(e, dict) and "replaceAll" in e for e in edits):
        features.add(REPLACE_ALL)
    if "expectedBaseSha256" in request:
        features.add(EXPECTED_BASE_SHA256)
    instruction = None
    if request.get("operation") == "read_file" and "instructionSha256" in request:
        instruction = str(request["path"])
    return Needs(frozenset(features), instruction)


def offer_gap(
    needs: Needs, *, edit_features: frozenset[str], instruction_files: frozenset[str]
) -> str | None:
    """What the offer lacks for these needs, as words for the refusal; None when it covers them."""
    missing = sorted(needs.edit_features - edit_features)
    if missing:
        return f"the edit feature {missing[0]}"
    if needs.instruction_file is not None and needs.instruction_file not in instruction_files:
        return f"the instruction file {needs.instruction_file}"
    return None
