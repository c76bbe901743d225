"""DRF authentication from `Authorization: Bearer <secret>`: API keys and worker tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from workspaces.access import Caller, caller_for_api_key
from workspaces.models import Worker
from workspaces.secrets import hash_secret


def bearer_token(header: bytes | str | None) -> str | None:
    """The token of a well-formed `Bearer <token>` header, else None."""
    if not header:
        return None
    text = header.decode("latin-1") if isinstance(header, bytes) else header
    scheme, _, token = text.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token or len(token) > 256:
        return None
    return token


@dataclass(frozen=True)
class ApiUser:
    caller: Caller
    is_authenticated: bool = True


@dataclass(frozen=True)
class WorkerUser:
    worker: Worker
    is_authenticated: bool = True


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, str] | None:
        token = bearer_token(get_authorization_header(request))
        caller = caller_for_api_key(token) if token else None
        if caller is None:
            raise AuthenticationFailed("A valid API key is required (Authorization: Bearer <key>).")
        return ApiUser(caller), token or ""

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class WorkerTokenAuthentication(BaseAuthentication):
    """A worker token names exactly one worker; it can act only as that worker."""

    def authenticate(self, request: Request) -> tuple[Any, str] | None:
        token = bearer_token(get_authorization_header(request))
        worker = Worker.objects.filter(token_hash=hash_secret(token)).first() if token else None
        if worker is None:
            raise AuthenticationFailed(
                "A valid worker token is required (Authorization: Bearer <token>)."
            )
        return WorkerUser(worker), token or ""

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"
