"""ASGI entry point: `uvicorn config.asgi:application`."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_asgi_application()

# Every API process drains the completion-row buffer into Postgres (admission/completion.py).
if os.environ.get("SLUICE_COMPLETION_DRAINER", "1") != "0":
    from admission.completion import start_drainer

    start_drainer()
