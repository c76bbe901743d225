"""Fixtures the worker end-to-end tests share: the owner, a worker on the test's `repo`, an HTTP client.

Each test module defines its own `repo` (what the workspace holds); the rest is the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from livesupport import ApiServer, Worker


@pytest.fixture
def owner(account_factory: Any) -> Any:
    return account_factory()


@pytest.fixture
def worker(owner: Any, repo: Path, worker_factory: Any) -> Worker:
    return worker_factory(owner, {"repo": repo}, slots=2)


@pytest.fixture
def http(api: ApiServer) -> Iterator[httpx.Client]:
    with api.client() as client:
        yield client
