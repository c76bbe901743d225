"""`manage.py bootstrap --json`: idempotently create a tenant, a principal with a fresh API key,
and a worker with a fresh token and a Redis ACL user of its own (contract §1, §4.4). Secrets
are printed once, stored as hashes. `--credentials-out FILE` also writes the worker's part
(id, token, Redis URLs) as the 0600 file `runworker --credentials FILE` reads."""

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


def bootstrap(*, tenant: str, user: str, worker_id: str) -> dict[str, Any]:
    """Raises RedisAclUnavailable (and saves nothing) when Redis cannot give the worker its user."""
    with transaction.atomic():
        tenant_row, _ = Tenant.objects.get_or_create(name=tenant)
        principal, _ = Principal.objects.get_or_create(tenant=tenant_row, name=user)
        api_key, prefix, key_hash = new_secret(API_KEY_PREFIX)
        ApiKey.objects.create(
            principal=principal, prefix=prefix, key_hash=key_hash, label="bootstrap"
        )
        token, _, token_hash = new_secret(WORKER_TOKEN_PREFIX)
        worker = Worker.objects.select_for_update().filter(worker_id=worker_id).first()
        if worker is None:
            worker = Worker.objects.create(
                worker_id=worker_id, tenant=tenant_row, token_hash=token_hash
            )
        elif worker.tenant_id != tenant_row.pk:
            raise CommandError(f"worker {worker_id} belongs to another tenant")
        else:
            # The new token replaces the old one.
            Worker.objects.filter(pk=worker.pk).update(token_hash=token_hash)
        if tenant_row.default_worker_id is None:
            Tenant.objects.filter(pk=tenant_row.pk).update(default_worker=worker)
        # Last, inside the transaction: a Redis that refuses leaves no new token behind.
        redis_creds = worker_credentials_issue(worker=worker)
    return {
        "tenant": tenant,
        "user": user,
        "api_key": api_key,
        "worker_id": worker_id,
        "worker_token": token,
        **(redis_creds.as_json() if redis_creds else {}),
    }


class Command(BaseCommand):
    help = (
        "Create (or reuse) a tenant, a user with a fresh API key, and a worker with a fresh token."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", default="demo")
        parser.add_argument("--user", default="demo")
        parser.add_argument("--worker", default="demo-worker")
        parser.add_argument(
            "--json", action="store_true", help="Print the result as one JSON object."
        )
        parser.add_argument(
            "--credentials-out",
            metavar="FILE",
            default=None,
            help="Also write the worker's id, token and Redis URLs to FILE (mode 0600), "
            "the file `runworker --credentials FILE` reads.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            worker_id = validate_worker_id(options["worker"])
        except ProtocolError as exc:
            raise CommandError(exc.message) from None
        for name in ("tenant", "user"):
            if not options[name] or len(options[name]) > 128:
                raise CommandError(f"--{name} must be 1..128 characters")
        try:
            result = bootstrap(tenant=options["tenant"], user=options["user"], worker_id=worker_id)
        except RedisAclUnavailable as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            db = settings.DATABASES["default"]
            where = f"{db['HOST'] or 'localhost'}:{db['PORT'] or 5432}/{db['NAME']}"
            raise CommandError(f"cannot use the database at {where}: {first}") from None
        except redis.RedisError as exc:
            raise CommandError(f"cannot reach Redis for the worker's ACL user: {exc}") from None
        if options["credentials_out"]:
            write_credentials(Path(options["credentials_out"]).expanduser(), result)
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key}: {value}")
