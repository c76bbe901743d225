"""`manage.py bootstrap --json`: idempotently create a tenant, a principal with a fresh API key,
and a worker with a fresh token (contract §1). Secrets are printed once, stored as hashes."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction
from sluice_protocol import ProtocolError, validate_worker_id

from workspaces.models import ApiKey, Principal, Tenant, Worker
from workspaces.secrets import API_KEY_PREFIX, WORKER_TOKEN_PREFIX, new_secret


def bootstrap(*, tenant: str, user: str, worker_id: str) -> dict[str, str]:
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
    return {
        "tenant": tenant,
        "user": user,
        "api_key": api_key,
        "worker_id": worker_id,
        "worker_token": token,
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

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            worker_id = validate_worker_id(options["worker"])
        except ProtocolError as exc:
            raise CommandError(exc.message) from None
        for name in ("tenant", "user"):
            if not options[name] or len(options[name]) > 128:
                raise CommandError(f"--{name} must be 1..128 characters")
        result = bootstrap(tenant=options["tenant"], user=options["user"], worker_id=worker_id)
        if options["json"]:
            self.stdout.write(json.dumps(result))
        else:
            for key, value in result.items():
                self.stdout.write(f"{key}: {value}")
