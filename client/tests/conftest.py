from __future__ import annotations

import pytest
from scripted import Runner


@pytest.fixture(params=["sync", "async"])
def runner(request: pytest.FixtureRequest) -> Runner:
    """The same scenario through both clients: they share one policy, so they must agree."""
    return Runner(request.param)


@pytest.fixture
def sync_runner() -> Runner:
    return Runner("sync")
