"""Which kind of Sluice process this is, decided by manage.py before Django reads the settings.

A worker (`manage.py runworker`) runs on a user's machine: it signs nothing with SECRET_KEY
and never opens Postgres, so it is given neither (contract §4.4). Everything else (the API,
operator commands) is a server process.
"""

from __future__ import annotations

WORKER = False
# Only help was asked for (`manage.py help X`, `X --help`): nothing is opened, so the settings
# need no database or secret, and help works where nothing runs yet.
HELP_ONLY = False


def mark_worker() -> None:
    global WORKER
    WORKER = True


def mark_help_only(argv: list[str]) -> None:
    global HELP_ONLY
    HELP_ONLY = (
        len(argv) < 2
        or argv[1] in ("help", "--help", "-h")
        or ("--help" in argv[2:] or "-h" in argv[2:])
    )
