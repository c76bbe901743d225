"""`sluice-worker`: `manage.py runworker` without the server.

The same command and code, with the worker's own settings (config/worker_settings.py): no
database, no HTTP serving, so none of the server's packages. Every runworker flag works the
same, the pairing code included.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    # This process is a worker whatever the shell says: a server's DJANGO_SETTINGS_MODULE
    # would name apps this install does not have.
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.worker_settings"
    from config import role

    role.mark_worker()
    import django
    from django.core.exceptions import ImproperlyConfigured

    try:
        django.setup()
    except (ImproperlyConfigured, ValueError) as exc:
        # One line, as manage.py says it.
        sys.stderr.write(f"sluice-worker: cannot start: {exc}\n")
        sys.exit(2)
    from workspaces.management.commands.runworker import Command

    class WorkerCommand(Command):
        def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> Any:
            parser = super().create_parser(prog_name, subcommand, **kwargs)
            parser.prog = "sluice-worker"
            return parser

    WorkerCommand().run_from_argv(["sluice-worker", "runworker", *args])
