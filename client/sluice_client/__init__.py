"""Client for Sluice workspace tool calls: retries only what was not started."""

from __future__ import annotations

# Defined before the imports below: _base reads it for the User-Agent.
__version__ = "0.1.0"

from sluice_client.async_client import AsyncClient
from sluice_client.errors import WorkspaceToolError
from sluice_client.policy import Budgets
from sluice_client.sync_client import Client

__all__ = ["AsyncClient", "Budgets", "Client", "WorkspaceToolError", "__version__"]
