from __future__ import annotations

from rest_framework.authentication import BaseAuthentication


class ApiKeyAuthentication(BaseAuthentication):
    pass
