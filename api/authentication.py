"""DRF authentication from `Authorization: Bearer <secret>`: API keys and worker tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from admission import refusals
from admission.dbthread import in_db_thread
from api.execute.context import edge_of
from workspaces.access import Caller, caller_for_api_key
from workspaces.auth import bearer_token
from workspaces.models import Worker
from workspaces.secrets import hash_secret

API_KEY_REQUIRED = "A valid API key is required (Authorization: Bearer <key>)."


@dataclass(frozen=True)
class ApiUser:
    caller: Caller
    is_authenticated: bool = True


@dataclass(frozen=True)
class WorkerUser:
    worker: Worker
    is_authenticated: bool = True


class ApiKeyAuthentication(BaseAuthentication):
    """A principal's API key, for views that run on Django's sync path."""

    def authenticate(self, request: Request) -> tuple[Any, str] | None:
        token = bearer_token(get_authorization_header(request))
        caller = caller_for_api_key(token) if token else None
        if caller is None:
            raise AuthenticationFailed(API_KEY_REQUIRED)
        return ApiUser(caller), token or ""

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class AsyncApiKeyAuthentication(ApiKeyAuthentication):
    """The same key check, awaited on the event loop (api/base.py): the query runs in the
    database pool, so a waiting call never holds a thread.

    A view may take over the lookup with a `lookup_caller(token)` coroutine of its own: the
    workspace endpoint reads the key, the worker and its offer in one query.
    """

    async def authenticate(self, request: Request) -> tuple[Any, str] | None:  # type: ignore[override]
        if edge_of(request._request).overloaded:
            # Past a cap of calls in flight (api/execute/edge.py): refused before any lookup,
            # so an overload costs no query.
            raise refusals.service_overloaded()
        token = bearer_token(get_authorization_header(request))
        view = request.parser_context.get("view") if request.parser_context else None
        lookup = getattr(view, "lookup_caller", None)
        if lookup is not None:
            caller = await lookup(token)
        else:
            caller = await in_db_thread(caller_for_api_key, raw_key=token) if token else None
        if caller is None:
            raise AuthenticationFailed(API_KEY_REQUIRED)
        return ApiUser(caller), token or ""


class WorkerTokenAuthentication(BaseAuthentication):
    """A worker token names exactly one worker; it can act only as that worker."""

    def authenticate(self, request: Request) -> tuple[Any, str] | None:
        token = bearer_token(get_authorization_header(request))
        worker = Worker.objects.filter(token_hash=hash_secret(token)).first() if token else None
        if worker is None:
            # Worded for a worker token: the API-key message would send the operator of a
            # worker with a rotated token looking for an API key.
            raise refusals.worker_token_refused(given=bool(token))
        return WorkerUser(worker), token or ""

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"
