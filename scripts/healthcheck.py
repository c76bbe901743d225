"""Container health checks (compose.yaml): `python -m scripts.healthcheck api|drainer`.

`api`: this container's API answers `/healthz` 200 (Postgres and the admission Redis answer).
`drainer`: this container's `drain_completions` is reading the completion stream: its consumer
(named after the host name, which is the container's) asked Redis for rows within the last
STALE_MS. Exits 0 when healthy, 1 with one line saying why not.
"""

from __future__ import annotations

import os
import socket
import sys
import urllib.error
import urllib.request

# A live drainer touches its consumer at least every 5 s (its look for pending rows; Redis 7.2+
# counts every blocking read too).
STALE_MS = 30_000


def api() -> str | None:
    url = f"http://127.0.0.1:{os.environ.get('PORT') or '8000'}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return None if response.status == 200 else f"{url}: {response.status}"
    except urllib.error.HTTPError as exc:
        return f"{url}: {exc.code} {exc.read().decode(errors='replace')}"
    except OSError as exc:
        return f"{url}: {exc}"


def drainer() -> str | None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from admission.completion import GROUP, stream_key
    from admission.connections import sync_client

    mine = f"{socket.gethostname()}:"
    client = sync_client(decode_responses=True, socket_connect_timeout=2, socket_timeout=5)
    try:
        consumers = client.xinfo_consumers(stream_key(), GROUP)
    except Exception as exc:
        return f"cannot read the drainers of {stream_key()}: {exc}"
    finally:
        client.close()
    idle = [int(c["idle"]) for c in consumers if str(c["name"]).startswith(mine)]
    if not idle:
        return f"no drainer named {mine}* reads {stream_key()}"
    if min(idle) > STALE_MS:
        return f"the drainer {mine}* last read {min(idle) // 1000} s ago"
    return None


def main(argv: list[str]) -> int:
    checks = {"api": api, "drainer": drainer}
    if len(argv) != 1 or argv[0] not in checks:
        print(f"usage: python -m scripts.healthcheck {'|'.join(checks)}", file=sys.stderr)
        return 2
    problem = checks[argv[0]]()
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
