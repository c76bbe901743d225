from __future__ import annotations

from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Contention dashboard"

    def ready(self) -> None:
        # Registration lives in a lower layer and announces; the dashboard listens and records.
        from admission.registration import worker_event
        from dashboard.events import on_worker_event

        worker_event.connect(on_worker_event, dispatch_uid="dashboard.worker_event")
