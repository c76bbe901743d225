"""The worker-facing API: register, heartbeat, deregister (worker token auth)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from sluice_protocol import INSTRUCTION_FILES, INSTRUCTION_MAX_BYTES, OPERATIONS

from admission.refusals import Refusal
from admission.registration import (
    SANDBOX_PROFILES,
    OfferedWorkspace,
    worker_deregister,
    worker_heartbeat,
    worker_register,
)
from api.authentication import WorkerTokenAuthentication
from api.schema.answers import operation
from api.schema.components import Deregistered, HeartbeatOk, Registered
from workspaces.features import EDIT_FEATURES
from workspaces.runtime.config import MAX_SLOTS, WORKSPACE_ID


class StrictSerializer(serializers.Serializer):
    """Refuses unknown keys instead of ignoring them."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({unknown[0]: ["unknown field"]})
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """JSON true/false only (DRF's own also takes 0, "yes", "true" ...)."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer only (DRF's own also takes "2" and 2.0)."""

    def to_internal_value(self, data: Any) -> int:
        if type(data) is not int:
            self.fail("invalid")
        return int(super().to_internal_value(data))


class StrictStringMixin:
    """A JSON string only (DRF's string fields turn 0 into "0")."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str):
            self.fail("invalid")  # type: ignore[attr-defined]
        return super().to_internal_value(data)  # type: ignore[misc]


class StrictCharField(StrictStringMixin, serializers.CharField):
    pass


class StrictRegexField(StrictStringMixin, serializers.RegexField):
    pass


class InstructionFileSerializer(StrictSerializer):
    path = serializers.ChoiceField(sorted(INSTRUCTION_FILES))
    bytes = StrictIntegerField(min_value=0, max_value=INSTRUCTION_MAX_BYTES)
    sha256 = StrictRegexField(r"^[0-9a-f]{64}\Z")


class OfferedWorkspaceSerializer(StrictSerializer):
    workspaceId = StrictRegexField(WORKSPACE_ID.pattern + r"\Z")
    operations = serializers.ListField(
        child=serializers.ChoiceField(sorted(OPERATIONS)), min_length=1, max_length=len(OPERATIONS)
    )
    linkedWorktreeLanes = StrictBooleanField(default=False)
    # §2.2.1. Absent (an older worker) is not the same as [] (a worker that offers none).
    editFeatures = serializers.ListField(
        child=serializers.ChoiceField(list(EDIT_FEATURES)),
        max_length=len(EDIT_FEATURES),
        required=False,
    )
    instructionFiles = serializers.ListField(
        child=InstructionFileSerializer(),
        max_length=len(INSTRUCTION_FILES),
        default=list,
    )

    def validate_editFeatures(self, value: list[str]) -> list[str]:
        if len(value) != len(set(value)):
            raise serializers.ValidationError("edit features must be unique")
        return value

    def validate_instructionFiles(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if len({f["path"] for f in value}) != len(value):
            raise serializers.ValidationError("instruction file paths must be unique")
        return value


class RegisterSerializer(StrictSerializer):
    workerId = StrictCharField(max_length=128)
    workspaces = serializers.ListField(
        child=OfferedWorkspaceSerializer(), min_length=1, max_length=256
    )
    slots = StrictIntegerField(min_value=1, max_value=MAX_SLOTS)
    # §4.4: how the worker confines its commands. Optional, so an older worker still registers.
    sandboxProfile = serializers.ChoiceField(sorted(SANDBOX_PROFILES), required=False)

    def validate_workspaces(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ids = [w["workspaceId"] for w in value]
        if len(ids) != len(set(ids)):
            raise serializers.ValidationError("workspace ids must be unique")
        return value


class IncarnationSerializer(StrictSerializer):
    workerId = StrictCharField(max_length=128)
    incarnationId = StrictRegexField(r"^[0-9a-f]{32}\Z")


def _own_worker(request: Request, worker_id: str) -> Any:
    worker = request.user.worker  # type: ignore[union-attr]
    if worker_id != worker.worker_id:
        raise Refusal("FORBIDDEN", "This worker token belongs to another worker.")
    return worker


# What every worker route refuses; heartbeat adds its own two.
_WORKER_CODES = [
    "INVALID_REQUEST",
    "UNAUTHENTICATED",
    "FORBIDDEN",
    "UNSUPPORTED_MEDIA_TYPE",
    "ADMISSION_UNAVAILABLE",
    "DATABASE_UNAVAILABLE",
]


class _WorkerApi(APIView):
    authentication_classes = [WorkerTokenAuthentication]
    permission_classes = [IsAuthenticated]


class WorkerRegisterApi(_WorkerApi):
    @extend_schema(
        **operation(
            "registerWorker", request=RegisterSerializer, ok=(200, Registered), codes=_WORKER_CODES
        )
    )
    def post(self, request: Request) -> Response:
        data = RegisterSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        worker = _own_worker(request, data.validated_data["workerId"])
        offered = [
            OfferedWorkspace(
                w["workspaceId"],
                sorted(set(w["operations"])),
                w["linkedWorktreeLanes"],
                edit_features=w.get("editFeatures"),
                instruction_files=[dict(f) for f in w["instructionFiles"]],
            )
            for w in data.validated_data["workspaces"]
        ]
        return Response(
            worker_register(
                worker=worker,
                workspaces=offered,
                slots=data.validated_data["slots"],
                sandbox_profile=data.validated_data.get("sandboxProfile", ""),
            )
        )


class WorkerHeartbeatApi(_WorkerApi):
    @extend_schema(
        **operation(
            "heartbeatWorker",
            request=IncarnationSerializer,
            ok=(200, HeartbeatOk),
            codes=[*_WORKER_CODES, "WORKER_SUPERSEDED", "WORKER_REGISTRATION_LOST"],
        )
    )
    def post(self, request: Request) -> Response:
        data = IncarnationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        worker = _own_worker(request, data.validated_data["workerId"])
        state = worker_heartbeat(worker=worker, incarnation=data.validated_data["incarnationId"])
        if state == "replaced":
            raise Refusal("WORKER_SUPERSEDED", "Another incarnation of this worker registered.")
        if state == "lost":
            raise Refusal("WORKER_REGISTRATION_LOST", "This registration is gone; register again.")
        return Response({"ok": True})


class WorkerDeregisterApi(_WorkerApi):
    @extend_schema(
        **operation(
            "deregisterWorker",
            request=IncarnationSerializer,
            ok=(200, Deregistered),
            codes=_WORKER_CODES,
        )
    )
    def post(self, request: Request) -> Response:
        data = IncarnationSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        worker = _own_worker(request, data.validated_data["workerId"])
        told = worker_deregister(worker=worker, incarnation=data.validated_data["incarnationId"])
        return Response({"ok": True, "offline": max(told, 0)})
