"""The password hasher of the test process: Django's own PBKDF2 at 1,000 iterations instead of
a million (a third of a second for every user a test creates).

It keeps the algorithm's name, and a PBKDF2 hash carries its iteration count, so every API
process of the session (with Django's default hashers) verifies these hashes as they are.
An API process that signs such a user in re-hashes the password at its own strength (Django
upgrades a hash at login), which ends every session made for that user before: a test that
does both gives the user a full-strength hash (`make_password(..., hasher="pbkdf2_sha256")`,
as tests/dashboard/test_dashboard_browser.py does).
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
