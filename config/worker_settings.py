"""Settings for a worker process alone (`sluice-worker`, the worker package): the server's
settings with only the apps a worker's code uses.

A worker never opens the database and serves no HTTP, so none of the server's apps, and none of
their packages (DRF, the schema generator, static files, Postgres driver), need be installed.
"""

from __future__ import annotations

from config import role

# Before the server's settings read it: a worker is given neither SECRET_KEY nor DATABASE_URL.
role.mark_worker()

from config.settings import *  # noqa: E402, F403

INSTALLED_APPS = ["workspaces", "admission"]
MIDDLEWARE = []
# A worker serves no URL; Django's start-up checks still read a URLconf: this module's own.
ROOT_URLCONF = "config.worker_settings"
urlpatterns: list[object] = []
# The policy cache (django-redis) is the API's; nothing a worker runs reads Django's cache.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
