"""The admin login throttle (django-axes, config/login_throttle.py): five wrong passwords for one
username from one address pause that pair; nobody else is paused; `axes_reset` lifts it.

Through Django's test client for the rules, and through a real uvicorn process (the ASGI path
`make run` serves) for the page a paused sign-in gets.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client
from livesupport import ApiServer, start_api

PASSWORD = "correct horse battery"
LOGIN = "/admin/login/?next=/admin/"


@pytest.fixture
def operator(db: None) -> User:
    return User.objects.create_user("operator", password=PASSWORD, is_staff=True)


def sign_in(client: Client, username: str, password: str) -> Any:
    return client.post(LOGIN, {"username": username, "password": password, "next": "/admin/"})


def signed_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def fail_five_times(client: Client, username: str = "operator") -> list[int]:
    return [sign_in(client, username, f"guess-{n}").status_code for n in range(5)]


def test_five_wrong_passwords_pause_the_account_from_that_address_even_for_the_right_one(
    operator: User,
) -> None:
    guesser = Client(REMOTE_ADDR="198.51.100.7")
    # Four wrong ones get the form again; the fifth gets the pause.
    assert fail_five_times(guesser) == [200, 200, 200, 200, 429]
    right = sign_in(guesser, "operator", PASSWORD)
    assert right.status_code == 429
    assert right["Retry-After"] == "900"
    page = right.content.decode()
    assert "Sign-in paused" in page and "15 minutes" in page and "axes_reset" in page
    assert 'id="header"' in page  # the admin's own frame
    assert 'name="password"' not in page
    assert not signed_in(guesser)


def test_the_pause_holds_for_that_pair_only(operator: User) -> None:
    User.objects.create_user("colleague", password=PASSWORD, is_staff=True)
    assert fail_five_times(Client(REMOTE_ADDR="198.51.100.7"))[-1] == 429

    # Another account from the same address ...
    same_address = Client(REMOTE_ADDR="198.51.100.7")
    assert sign_in(same_address, "colleague", PASSWORD).status_code == 302
    assert signed_in(same_address)
    # ... and the same account from another address still sign in.
    elsewhere = Client(REMOTE_ADDR="203.0.113.20")
    assert sign_in(elsewhere, "operator", PASSWORD).status_code == 302
    assert signed_in(elsewhere)


def test_a_forwarding_header_is_not_the_address_failures_are_counted_by(operator: User) -> None:
    # With no proxy in front, X-Forwarded-For is whatever the client wrote: a new one for each
    # guess must not make each guess a first one.
    statuses = [
        Client(REMOTE_ADDR="198.51.100.7", HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
        .post(LOGIN, {"username": "operator", "password": f"guess-{n}"})
        .status_code
        for n in range(5)
    ]
    assert statuses == [200, 200, 200, 200, 429]


def test_axes_reset_lifts_the_pause(operator: User) -> None:
    guesser = Client(REMOTE_ADDR="198.51.100.7")
    assert fail_five_times(guesser)[-1] == 429
    call_command("axes_reset", verbosity=0)
    assert sign_in(guesser, "operator", PASSWORD).status_code == 302
    assert signed_in(guesser)


def test_a_right_password_before_the_limit_starts_the_count_again(operator: User) -> None:
    guesser = Client(REMOTE_ADDR="198.51.100.7")
    for _ in range(2):
        assert [sign_in(guesser, "operator", f"typo-{n}").status_code for n in range(4)] == [
            200
        ] * 4
        assert sign_in(guesser, "operator", PASSWORD).status_code == 302
        guesser.post("/admin/logout/")


def _csrf(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "no CSRF token in the form"
    return match.group(1)


@pytest.mark.e2e
def test_the_pause_page_comes_from_a_real_asgi_server_served_as_make_run_serves(
    live_env: dict[str, str], transactional_db: None
) -> None:
    User.objects.create_user("operator", password=PASSWORD, is_staff=True)
    server = start_api(live_env, drainer=False, processes=2)
    try:
        _pause_over_a_socket(server)
    finally:
        server.process.stop()


def _pause_over_a_socket(server: ApiServer) -> None:
    with server.client() as http:
        token = _csrf(http.get("/admin/login/").text)

        def attempt(password: str, n: int = 0) -> httpx.Response:
            return http.post(
                LOGIN,
                data={
                    "username": "operator",
                    "password": password,
                    "csrfmiddlewaretoken": token,
                    "next": "/admin/",
                },
                # make run has no proxy in front: a loopback client that names another
                # address for each guess is still counted as itself.
                headers={"X-Forwarded-For": f"192.0.2.{n}"},
            )

        assert [attempt(f"guess-{n}", n).status_code for n in range(5)] == [200] * 4 + [429]
        right = attempt(PASSWORD)
        assert right.status_code == 429, right.text
        assert right.headers["retry-after"] == "900"
        assert "Sign-in paused" in right.text
        assert http.get("/admin/").status_code == 302  # still signed out
