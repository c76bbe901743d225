"""The worker's HTTP conversation with the API: register, heartbeat, deregister."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

log = logging.getLogger("sluice.worker")


class RegistrationRefused(RuntimeError):
    pass


class ControlPlane:
    def __init__(
        self, api_url: str, *, worker_id: str, token: str, sandbox_profile: str | None = None
    ) -> None:
        self.worker_id = worker_id
        # "bwrap" or "none" (§4.4); sent with every registration, re-registrations included.
        self.sandbox_profile = sandbox_profile
        self.http = httpx.Client(
            base_url=api_url.rstrip("/"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(10.0, connect=3.0),
        )

    def register(
        self, *, workspaces: list[dict[str, Any]], slots: int, attempts: int = 30
    ) -> dict[str, Any]:
        """Register, retrying while the API is unreachable; a refusal (4xx) is final."""
        body: dict[str, Any] = {
            "workerId": self.worker_id,
            "workspaces": workspaces,
            "slots": slots,
        }
        if self.sandbox_profile is not None:
            body["sandboxProfile"] = self.sandbox_profile
        for attempt in range(attempts):
            try:
                response = self.http.post("/v1/workers/register", json=body)
            except httpx.TransportError as exc:
                log.warning("API unreachable, retrying registration", extra={"error": str(exc)})
                time.sleep(min(0.2 * (attempt + 1), 2.0))
                continue
            if response.status_code == 200:
                return dict(response.json())
            if response.status_code < 500:
                raise RegistrationRefused(
                    f"registration refused ({response.status_code}): {response.text[:300]}"
                )
            time.sleep(min(0.2 * (attempt + 1), 2.0))
        raise RegistrationRefused("the API did not accept the registration; giving up")

    def heartbeat(self, incarnation: str) -> bool | str | None:
        """True: alive. False: replaced (or the token was rotated). "lost": the registration is
        gone but nobody replaced it (register again). None: the API could not be reached."""
        try:
            response = self.http.post(
                "/v1/workers/heartbeat",
                json={"workerId": self.worker_id, "incarnationId": incarnation},
            )
        except httpx.TransportError:
            return None
        if response.status_code == 200:
            return True
        if response.status_code == 410:
            return "lost"
        if response.status_code in (401, 403, 409):
            # Replaced, or our token was rotated or revoked: this incarnation is over.
            return False
        return None

    def deregister(self, incarnation: str) -> None:
        try:
            self.http.post(
                "/v1/workers/deregister",
                json={"workerId": self.worker_id, "incarnationId": incarnation},
            )
        except httpx.TransportError:
            log.warning("could not deregister; the registration expires by itself")
