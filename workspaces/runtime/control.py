"""The worker's conversation with the API: redeem a pairing code, register, heartbeat,
deregister.

Heartbeats go straight to Redis when the worker has its own Redis credentials (contract §4.4:
its ACL user may run the heartbeat script on its own registration key and nothing else), so
tenants' traffic on the API can never make a worker miss one (contract §2.8): a burst that
stalls the API left both tenants' workers without their registration. The HTTP heartbeat is
still sent, in the background, for what only Postgres keeps (the admin's "last heard from"),
and it is the fallback whenever the Redis path cannot answer (no script loaded after a Redis
restart, no registration left): it tells "lost" from "replaced", which Redis alone cannot.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from sluice_protocol import ProtocolError, validate_worker_id

log = logging.getLogger("sluice.worker")


class PairingRefused(RuntimeError):
    """The pairing code could not be redeemed; the message is the one line runworker prints."""


REDEEM_PATH = "/v1/bridge/pairings/redeem"


def redeem_pairing(api_url: str, code: str) -> dict[str, Any]:
    """Spend a pairing code for the worker's id, token and Redis URLs (contract §4.5).

    One attempt, never retried: a code is single use, so a retry after an answer that was lost
    on the way would only be told the code was used."""
    url = api_url.rstrip("/") + REDEEM_PATH
    try:
        response = httpx.post(
            url,
            json={"protocolVersion": 1, "code": code},
            timeout=httpx.Timeout(30.0, connect=5.0),
            follow_redirects=False,
        )
    except httpx.TransportError as exc:
        raise PairingRefused(
            f"cannot reach the API at {api_url} to redeem the pairing code: {exc}"
        ) from None
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if response.status_code != 200:
        why = answer.get("error") if isinstance(answer, dict) else None
        code_name = answer.get("code") if isinstance(answer, dict) else None
        raise PairingRefused(
            f"the pairing code was refused ({response.status_code}"
            + (f" {code_name}" if code_name else "")
            + f"): {why or response.text[:200]}"
        )
    if not (
        isinstance(answer, dict)
        and isinstance(answer.get("workerId"), str)
        and isinstance(answer.get("workerToken"), str)
        and answer["workerToken"]
    ):
        raise PairingRefused(f"the API at {api_url} answered the pairing with something else")
    try:
        # It names the credentials file: never a path of the API's choosing.
        validate_worker_id(answer["workerId"])
    except ProtocolError:
        raise PairingRefused(
            f"the API at {api_url} answered the pairing with a bad worker id"
        ) from None
    return answer


class RegistrationRefused(RuntimeError):
    pass


class RegistrationUnanswered(RegistrationRefused):
    """Every attempt found the API unreachable or unable to answer (5xx): worth trying later."""


class ControlPlane:
    def __init__(
        self,
        api_url: str,
        *,
        worker_id: str,
        token: str,
        sandbox_profile: str | None = None,
        redis_beat: Callable[[str], int] | None = None,
    ) -> None:
        self.worker_id = worker_id
        # incarnation -> 1 renewed, 0 replaced, -1 no registration (admission heartbeat.lua).
        self.redis_beat = redis_beat
        self._http_beat: threading.Thread | None = None
        self._http_verdict: bool | str | None = None
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
        raise RegistrationUnanswered("the API did not accept the registration; giving up")

    def heartbeat(self, incarnation: str) -> bool | str | None:
        """True: alive. False: replaced by another incarnation. "revoked": the token is no
        longer accepted (revoked, rotated, or the worker paired again elsewhere). "lost": the
        registration is gone but nobody replaced it (register again). None: neither path could
        answer."""
        if self.redis_beat is None:
            return self.http_heartbeat(incarnation)
        if self._http_verdict is not None:
            # The background HTTP beat learned the token was revoked, or another incarnation
            # replaced this one.
            return self._http_verdict
        try:
            renewed = self.redis_beat(incarnation)
        except Exception as exc:  # a RedisError, NOSCRIPT/NOPERM after a Redis restart
            log.warning("Redis heartbeat failed; asking the API", extra={"error": str(exc)})
            return self.http_heartbeat(incarnation)
        if renewed == 0:
            return False
        if renewed < 0:
            return self.http_heartbeat(incarnation)
        self._note_alive(incarnation)
        return True

    def _note_alive(self, incarnation: str) -> None:
        """The HTTP beat for Postgres's bookkeeping, one at a time, never waited for."""
        if self._http_beat is not None and self._http_beat.is_alive():
            return

        def beat() -> None:
            verdict = self.http_heartbeat(incarnation)
            if verdict is False or verdict == "revoked":
                self._http_verdict = verdict

        self._http_beat = threading.Thread(target=beat, name="http-heartbeat", daemon=True)
        self._http_beat.start()

    def http_heartbeat(self, incarnation: str) -> bool | str | None:
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
        if response.status_code == 401:
            return "revoked"
        if response.status_code in (403, 409):
            # Replaced: this incarnation is over.
            return False
        return None

    def deregister(self, incarnation: str) -> bool:
        """True when the server took the deregistration; otherwise it says why (a warning)."""
        try:
            answer = self.http.post(
                "/v1/workers/deregister",
                json={"workerId": self.worker_id, "incarnationId": incarnation},
            )
        except httpx.TransportError:
            log.warning("could not deregister; the registration expires by itself")
            return False
        if answer.status_code >= 300:
            log.warning(
                "could not deregister (HTTP %d); the registration expires by itself",
                answer.status_code,
            )
            return False
        return True
