"""`manage.py bootstrap --json`: create what is missing of a tenant, a user (with a fresh API
key) and, with `--worker W`, a worker with a token and a Redis ACL user of its own (contract
§1, §4.4). Safe to run again: an existing worker keeps its token unless
`--rotate-worker-token` says otherwise, because a new token stops the worker running with the
old one. Secrets are printed once, stored as hashes. `--credentials-out FILE` also writes the
worker's part (id, token, Redis URLs) as the 0600 file `runworker --credentials FILE` reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, transaction
from sluice_protocol import ProtocolError, validate_worker_id

from admission.credentials import RedisAclUnavailable, worker_credentials_issue
from workspaces.models import ApiKey, Principal, Tenant, Worker
from workspaces.runtime.credfile import write_credentials
from workspaces.secrets import API_KEY_PREFIX, WORKER_TOKEN_PREFIX, new_secret

KEPT_TOKEN = (
    "worker {worker} already exists and keeps its token (a worker running with it goes on "
    "running); --rotate-worker-token issues a new one and stops that worker"
)


def bootstrap(
    *,
    tenant: str,
    user: str,
    worker_id: str | None = None,
    rotate_worker_token: bool = False,
    need_worker_token: bool = False,
) -> dict[str, Any]:
    """Create what is missing; return the new secrets (an API key always, a worker token only
    for a new worker or with `rotate_worker_token`).

    `need_worker_token`: refuse (CommandError, nothing saved) when the worker exists and keeps
    its token, since the caller has nothing to write without one. Raises RedisAclUnavailable
    (and saves nothing) when Redis cannot give the worker its user."""
    with transaction.atomic():
        tenant_row, _ = Tenant.objects.get_or_create(name=tenant)
        principal, _ = Principal.objects.get_or_create(tenant=tenant_row, name=user)
        api_key, prefix, key_hash = new_secret(API_KEY_PREFIX)
        ApiKey.objects.create(
            principal=principal, prefix=prefix, key_hash=key_hash, label="bootstrap"
        )
        result: dict[str, Any] = {"tenant": tenant, "user": user, "api_key": api_key}
        if worker_id is None:
            return result
        result["worker_id"] = worker_id
        worker = Worker.objects.select_for_update().filter(worker_id=worker_id).first()
        if worker is not None and worker.tenant_id != tenant_row.pk:
            raise CommandError(f"worker {worker_id} belongs to another tenant")
        if worker is not None and not rotate_worker_token:
            if need_worker_token:
                raise CommandError(KEPT_TOKEN.format(worker=worker_id))
        else:
            token, _, token_hash = new_secret(WORKER_TOKEN_PREFIX)
            if worker is None:
                worker = Worker.objects.create(
                    worker_id=worker_id, tenant=tenant_row, token_hash=token_hash
                )
            else:
                Worker.objects.filter(pk=worker.pk).update(token_hash=token_hash)
            # Last, inside the transaction: a Redis that refuses leaves no new token behind.
            redis_creds = worker_credentials_issue(worker=worker)
            result["worker_token"] = token
            result.update(redis_creds.as_json() if redis_creds else {})
        if tenant_row.default_worker_id is None:
            Tenant.objects.filter(pk=tenant_row.pk).update(default_worker=worker)
    return result


class Command(BaseCommand):
    help = (
        "Create what is missing of a tenant, a user and (with --worker) a worker, and print "
        "their new secrets once. Every run gives the user one more API key (earlier keys stay "
        "valid); a user's key needs no worker. A new worker gets a token; an existing worker "
        "keeps its token, so its running worker goes on running, unless --rotate-worker-token "
        "(which stops a worker still using the old one). Nothing else is ever rotated."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", default="demo", help="Tenant name (default: demo).")
        parser.add_argument("--user", default="demo", help="User name (default: demo).")
        parser.add_argument(
            "--worker",
            metavar="WORKER_ID",
            default=None,
            help="Also create this worker for the tenant (made the tenant's default worker "
            "when it has none). Without it, no worker is created or changed.",
        )
        parser.add_argument(
            "--rotate-worker-token",
            action="store_true",
            help="Give the existing --worker a new token and Redis password: a worker still "
            "running with the old ones stops at its next heartbeat.",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print the result as one JSON object."
        )
        parser.add_argument(
            "--credentials-out",
            metavar="FILE",
            default=None,
            help="Also write the worker's id, token and Redis URLs to FILE (mode 0600), "
            "the file `runworker --credentials FILE` reads. Needs a token: a new --worker, "
            "or --rotate-worker-token. FILE's directory must exist.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        worker_id: str | None = None
        if options["worker"] is not None:
            try:
                worker_id = validate_worker_id(options["worker"])
            except ProtocolError as exc:
                raise CommandError(exc.message) from None
        for name in ("tenant", "user"):
            if not options[name] or len(options[name]) > 128:
                raise CommandError(f"--{name} must be 1..128 characters")
        out: Path | None = None
        if options["credentials_out"]:
            if worker_id is None:
                raise CommandError("--credentials-out needs --worker")
            out = Path(options["credentials_out"]).expanduser()
            if not out.parent.is_dir():
                raise CommandError(
                    f"--credentials-out: directory {out.parent} does not exist; create it "
                    "first (mode 0700: the file lets anyone act as the worker)"
                )
        if options["rotate_worker_token"] and worker_id is None:
            raise CommandError("--rotate-worker-token needs --worker")
        try:
            result = bootstrap(
                tenant=options["tenant"],
                user=options["user"],
                worker_id=worker_id,
                rotate_worker_token=options["rotate_worker_token"],
                need_worker_token=out is not None,
            )
        except RedisAclUnavailable as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            db = settings.DATABASES["default"]
            where = f"{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
            raise CommandError(f"cannot use the database at {where}: {first}") from None
        except redis.RedisError as exc:
            raise CommandError(f"cannot reach Redis for the worker's ACL user: {exc}") from None
        if out is not None:
            write_credentials(out, result)
        if worker_id is not None and "worker_token" not in result:
            # On stderr: --json's stdout stays one JSON object.
            self.stderr.write(KEPT_TOKEN.format(worker=worker_id))
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key}: {value}")
