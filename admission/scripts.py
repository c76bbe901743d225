"""Loads the Lua scripts in admission/lua/ and registers them once per Redis client.

`register_script` sends EVALSHA and falls back to EVAL (loading the script) when Redis
answers NOSCRIPT, so a Redis restart or a fresh cluster node costs one extra round trip once.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

LUA_DIR = Path(__file__).resolve().parent / "lua"


@functools.cache
def lua_source(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")


def register(client: Any, name: str) -> Any:
    """Return a callable Script for `name` (sync or async, following the client)."""
    return client.register_script(lua_source(name))
