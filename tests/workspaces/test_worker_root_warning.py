"""A worker started as root says so in one line of its own, not Celery's eight."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from livesupport import git_workspace

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="the warning is about running as root"),
]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return git_workspace(tmp_path / "repo")


def test_a_root_worker_warns_once_in_its_own_words(worker) -> None:
    lines = list(worker.process.lines)
    assert not [line for line in lines if "SecurityWarning" in line or "superuser" in line]
    assert len([line for line in lines if "running as root" in line]) == 1
