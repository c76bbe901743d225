from __future__ import annotations

from sluice_client.cli import run

if __name__ == "__main__":
    run()
