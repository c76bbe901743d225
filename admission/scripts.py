"""Loads the Lua scripts in admission/lua/ and registers them once per Redis client.

`register_script` sends EVALSHA and falls back to EVAL (loading the script) when Redis
answers NOSCRIPT, so a Redis restart or a fresh cluster node costs one extra round trip once.
Admission scripts share helpers: `_common.lua` is prepended to them (`with_common=True`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

LUA_DIR = Path(__file__).resolve().parent / "lua"


@functools.cache
def lua_source(name: str, with_common: bool = False) -> str:
    body = (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")
    if with_common:
        body = (LUA_DIR / "_common.lua").read_text(encoding="utf-8") + "\n" + body
    return body


def register(client: Any, name: str, *, with_common: bool = False) -> Any:
    """Return a callable Script for `name` (sync or async, following the client)."""
    return client.register_script(lua_source(name, with_common))
