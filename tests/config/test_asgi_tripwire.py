"""Tripwire for config/asgi.py: the workspace API's short way through Django's ASGI handler
calls five of its methods that Django does not document. They are pinned here to the
installed Django, so an upgrade that renames, re-types or drops one fails this test before
it breaks a running API (then re-measure the fast path against plain ASGIHandler)."""

from __future__ import annotations

import inspect

import django
from django.core.handlers.asgi import ASGIHandler

# name: (parameters after self, is a coroutine function)
USED = {
    "read_body": (["receive"], True),
    "create_request": (["scope", "body_file"], False),
    "run_get_response": (["request"], True),
    "listen_for_disconnect": (["receive"], True),
    "send_response": (["response", "send"], True),
}


def test_the_installed_django_is_the_one_the_fast_path_was_written_for() -> None:
    assert django.VERSION[:2] == (5, 2)


def test_the_handler_methods_the_fast_path_calls_keep_their_shape() -> None:
    for name, (parameters, is_async) in USED.items():
        method = getattr(ASGIHandler, name)
        assert list(inspect.signature(method).parameters)[1:] == parameters, name
        assert inspect.iscoroutinefunction(method) is is_async, name
