"""Reading a bearer secret out of an Authorization header (API keys, worker and metrics tokens)."""

from __future__ import annotations


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
