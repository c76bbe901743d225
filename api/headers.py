"""The headers every answer of the workspace endpoint carries: what the classic middleware it
skips (config/middleware.py) would have added. A module of its own, importable before Django's
apps are ready (config/logging.py imports the middleware's module)."""

API_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
