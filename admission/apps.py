from __future__ import annotations

from typing import Any

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "admission"
    verbose_name = "Admission and completion log"

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from workspaces.models import Worker

        # Every way a worker row goes (admin, a tenant deleted with its workers, revocation):
        # inside the deleting transaction, so a Redis that refuses keeps the row.
        post_delete.connect(_revoke_redis_user, sender=Worker, dispatch_uid="worker-redis-user")

        from admission.policy import connect_policy_signals

        connect_policy_signals()


def _revoke_redis_user(sender: Any, instance: Any, **_: Any) -> None:
    from admission.credentials import worker_credentials_revoke

    worker_credentials_revoke(worker_id=instance.worker_id)
