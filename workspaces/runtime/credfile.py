"""The worker credentials file: a worker's id, token and own Redis URLs, in one 0600 JSON file.

`bootstrap --credentials-out FILE` writes it, and so does `runworker --pairing-code` with what
redeeming the code returned (`save_pairing`); `runworker --credentials FILE`
reads it, by default from `$XDG_CONFIG_HOME/sluice/worker-<id>.json` (`~/.config/...`). The
file holds what lets anyone act as the worker, so a file that its group or other users can
read is refused rather than used.

Keys: `worker_id`, `worker_token`, and when the server issued a Redis user of the worker's own,
`redis_url` (the Celery broker), `admission_redis_url` and `admission_redis_cluster`. Any other
key (bootstrap's `--json` output has the tenant, user and API key too) is ignored.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workspaces.runtime.config import WorkerConfigError

FILE_KEYS = ("worker_id", "worker_token", "redis_url", "admission_redis_url")


@dataclass(frozen=True)
class WorkerCredentials:
    worker_id: str
    worker_token: str
    redis_url: str | None = None
    admission_redis_url: str | None = None
    admission_redis_cluster: bool = False


def default_path(worker_id: str) -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sluice" / f"worker-{worker_id}.json"


def load_credentials(path: Path) -> WorkerCredentials:
    """Raises WorkerConfigError (one line) for a missing, unsafe or malformed file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise WorkerConfigError(f"credentials file {path} does not exist") from None
    except OSError as exc:
        raise WorkerConfigError(f"cannot open credentials file {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(f.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise WorkerConfigError(f"credentials file {path} is not a regular file")
        if mode & 0o077:
            raise WorkerConfigError(
                f"credentials file {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"run: chmod 600 {path}"
            )
        raw = f.read(1 << 16)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise WorkerConfigError(f"credentials file {path} is not JSON") from None
    if not isinstance(data, dict):
        raise WorkerConfigError(f"credentials file {path} must hold one JSON object")
    for key in FILE_KEYS:
        if key in data and not (isinstance(data[key], str) and data[key]):
            raise WorkerConfigError(f"credentials file {path}: {key} must be a non-empty string")
    for key in ("worker_id", "worker_token"):
        if key not in data:
            raise WorkerConfigError(f"credentials file {path} has no {key}")
    cluster = data.get("admission_redis_cluster", False)
    if not isinstance(cluster, bool):
        raise WorkerConfigError(
            f"credentials file {path}: admission_redis_cluster must be a boolean"
        )
    return WorkerCredentials(
        worker_id=data["worker_id"],
        worker_token=data["worker_token"],
        redis_url=data.get("redis_url"),
        admission_redis_url=data.get("admission_redis_url") or data.get("redis_url"),
        admission_redis_cluster=cluster,
    )


def write_credentials(path: Path, payload: dict[str, Any]) -> None:
    """Write `payload` (the worker's keys only) as a 0600 file, replacing any file there.

    Made 0600 from its first byte (never written and then chmod-ed), then renamed over the
    old one, so a reader never sees a half-written or briefly readable file."""
    data = {k: payload[k] for k in (*FILE_KEYS, "admission_redis_cluster") if k in payload}
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def save_pairing(answer: dict[str, Any], path: str | None) -> Path:
    """Write what redeeming a pairing code returned (camelCase on the wire) as the credentials
    file: at `path`, else the default file of the worker id it names. Returns the path."""
    worker_id = answer["workerId"]
    target = Path(path).expanduser() if path is not None else default_path(worker_id)
    payload: dict[str, Any] = {"worker_id": worker_id, "worker_token": answer["workerToken"]}
    if answer.get("redisUrl"):
        payload["redis_url"] = answer["redisUrl"]
        payload["admission_redis_url"] = answer.get("admissionRedisUrl") or answer["redisUrl"]
        if answer.get("admissionRedisCluster") is True:
            payload["admission_redis_cluster"] = True
    write_credentials(target, payload)
    return target


def resolve_credentials(
    *, worker_id: str | None, token: str | None, path: str | None, celery_app: Any = None
) -> tuple[str, str | None]:
    """(worker id, token) for runworker, and the worker's own Redis URLs put in place.

    The file is `path`, else the default file for `worker_id` when there is one; without a file
    the worker uses --worker-id, the token it was given and the REDIS_URL of its environment.
    A token given on the command line or in SLUICE_WORKER_TOKEN wins over the file's."""
    if path is not None:
        chosen: Path | None = Path(path).expanduser()
    elif worker_id is not None and default_path(worker_id).exists():
        chosen = default_path(worker_id)
    else:
        chosen = None
    if chosen is None:
        if worker_id is None:
            raise WorkerConfigError("--worker-id is required (or --credentials FILE)")
        return worker_id, token
    creds = load_credentials(chosen)
    if worker_id is not None and worker_id != creds.worker_id:
        raise WorkerConfigError(
            f"credentials file {chosen} is for worker {creds.worker_id}, not {worker_id}"
        )
    if creds.redis_url:
        use_redis(creds, celery_app)
    return creds.worker_id, token or creds.worker_token


def use_redis(creds: WorkerCredentials, celery_app: Any = None) -> None:
    """Point this process's broker and admission clients (and `celery_app`, the project's
    Celery app that runworker hands in) at the worker's own Redis user.

    Before anything connects: the admission client is made on first use, and the Celery app
    reads its broker URL when the consumer starts."""
    from django.conf import settings

    settings.CELERY_BROKER_URL = creds.redis_url
    settings.REDIS_URL = creds.redis_url
    settings.ADMISSION_REDIS_URL = creds.admission_redis_url or creds.redis_url
    settings.ADMISSION_REDIS_CLUSTER = creds.admission_redis_cluster
    if celery_app is not None:
        celery_app.conf.broker_url = creds.redis_url
