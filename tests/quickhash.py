"""The password hasher of the test process: Django's own PBKDF2 at 1,000 iterations instead of
a million (a third of a second for every user a test creates).

It keeps the algorithm's name, and a PBKDF2 hash carries its iteration count, so every API
process of the session (with Django's default hashers) verifies these hashes as they are.
"""

from __future__ import annotations

from django.contrib.auth.hashers import PBKDF2PasswordHasher


class QuickPBKDF2PasswordHasher(PBKDF2PasswordHasher):
    iterations = 1_000
