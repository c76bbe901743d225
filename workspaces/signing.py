"""Signatures between the API and one worker, keyed by that worker's token.

Every worker can reach the shared Redis (it is the Celery broker), so a fence of values kept
in Redis (incarnation, ticket) does not tell the worker an assignment came from the API, nor
the API that a result came from the worker. Both sides know the SHA-256 of the worker's token
(the API stores only that hash; the worker hashes its token), and no other worker does: it
keys an HMAC over each assignment and each settlement.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any


def signing_key(token_hash_hex: str) -> bytes:
    return bytes.fromhex(token_hash_hex)


def signing_key_for_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def _canonical(purpose: str, body: Any) -> bytes:
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return purpose.encode() + b"\x00" + text.encode("utf-8", "surrogatepass")


def sign(key: bytes, purpose: str, body: Any) -> str:
    return hmac.new(key, _canonical(purpose, body), hashlib.sha256).hexdigest()


def verify(key: bytes, purpose: str, body: Any, signature: object) -> bool:
    return isinstance(signature, str) and hmac.compare_digest(sign(key, purpose, body), signature)


def unsigned(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "sig"}
