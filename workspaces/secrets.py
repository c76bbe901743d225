"""Credentials: API keys and worker tokens are random, shown once, and stored as hashes.

Also the keyed hash used wherever the completion log or metrics must name a tenant,
principal or isolation key without revealing it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.conf import settings

API_KEY_PREFIX = "slk_"
WORKER_TOKEN_PREFIX = "slw_"


def hash_secret(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def new_secret(kind_prefix: str) -> tuple[str, str, str]:
    """Return (raw secret, visible prefix, hash). The raw value is never stored."""
    visible = kind_prefix + secrets.token_hex(4)
    raw = f"{visible}_{secrets.token_urlsafe(32)}"
    return raw, visible, hash_secret(raw)


def secret_matches(raw: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(raw), stored_hash)


def keyed_hash(kind: str, value: str) -> str:
    """A stable, non-reversible name for `value` (HMAC-SHA256 with ISOLATION_KEY_SECRET)."""
    mac = hmac.new(
        settings.ISOLATION_KEY_SECRET.encode(), f"{kind}\x1f{value}".encode(), hashlib.sha256
    )
    return mac.hexdigest()[:32]
