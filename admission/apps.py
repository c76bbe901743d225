from __future__ import annotations

from django.apps import AppConfig


class AdmissionConfig(AppConfig):
    name = "admission"
    verbose_name = "Admission and completion log"
