#!/usr/bin/env python
"""Django's command-line utility for Sluice."""

from __future__ import annotations

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    from config import role

    if sys.argv[1:2] == ["runworker"]:
        role.mark_worker()
    role.mark_help_only(sys.argv)
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018 - reads the settings: any refusal surfaces here
    except (ImproperlyConfigured, ValueError) as exc:
        # A process that cannot start says why in one line, not with a traceback.
        command = sys.argv[1] if len(sys.argv) > 1 else "manage.py"
        sys.stderr.write(f"{command}: cannot start: {exc}\n")
        sys.exit(2)
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
