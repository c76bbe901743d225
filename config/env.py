"""Typed readers for settings that come from the environment."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


def env_str(name: str, default: str) -> str:
    value = os.environ.get(name, "")
    return value if value != "" else default


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be a boolean (1/0, true/false), not {value!r}")


def env_int(name: str, default: int, *, low: int, high: int) -> int:
    raw = os.environ.get(name, "").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, not {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be within {low}..{high}, not {value}")
    return value


def _prepare_threshold(value: str) -> int | None:
    if value.lower() in {"off", "none", ""}:
        return None
    return int(value)


def database_from_url(url: str) -> dict[str, Any]:
    """Turn postgres://user:pass@host:port/name?options into a Django DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"}:
        raise ValueError(f"DATABASE_URL must be a postgres:// URL, not {parts.scheme!r}")
    options: dict[str, str] = {}
    for pair in filter(None, parts.query.split("&")):
        key, _, value = pair.partition("=")
        options[key] = unquote(value)
    host = unquote(parts.hostname or "")
    # pgserver hands out URLs whose host is a socket directory passed as ?host=/path.
    if "host" in options:
        host = options.pop("host")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")) or "postgres",
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(parts.port or ""),
        # Server-side binding, and prepared statements after 5 uses (Django turns them off
        # by default): the admission path's queries are planned once per connection instead
        # of on every call. Behind a transaction-pooling PgBouncer, add ?prepare_threshold=off.
        "OPTIONS": {
            "server_side_binding": True,
            **options,
            "prepare_threshold": _prepare_threshold(options.get("prepare_threshold", "5")),
        },
        # Persistent connections: the async endpoint's thread pool reuses them.
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


def local_secret(path: Path) -> str:
    """A random secret for this checkout, made once and kept in `path` (readable by its owner only)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    candidate = path.with_name(f"{path.name}.{os.getpid()}")
    candidate.write_text(secrets.token_urlsafe(48))
    candidate.chmod(0o600)
    try:
        # Two processes starting at once: the first link wins and both read its key.
        os.link(candidate, path)
    except FileExistsError:
        pass
    finally:
        candidate.unlink()
    return path.read_text().strip()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # Someone else's process: alive, though not ours to signal.
    return True


def read_instance_env(path: Path) -> dict[str, str]:
    """The URLs a running `make run` recorded in `path` (`scripts/dev.py`), or {} when none runs.

    A file left behind by a run that was killed outright names a pid that is gone, so it is
    ignored rather than pointing operator commands at servers that no longer exist.
    """
    try:
        text = path.read_text()
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return {}
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            values[key.strip()] = value.strip()
    try:
        pid = int(values.get("SLUICE_RUN_PID", ""))
    except ValueError:
        return {}
    return values if pid_alive(pid) else {}
