"""Demo data for `make run`: two git checkouts under var/demo/, the admin password and the
demo API key.

Everything here is made once and reused on later runs.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from scripts.devprocs import VAR, manage, write_private
from workspaces.hostgit import run_git

DEMO_KEY_FILE = VAR / "demo-api-key"
# A later run keeps the demo key it printed before (if it is still an active key of the demo
# principal) and only rotates the worker's token, which every start needs fresh: bootstrap
# would mint one more API key per start. Prints null when there is nothing to reuse.
REUSE_CODE = """
import json, os
from admission.workers_admin import worker_token_rotate
from workspaces.models import ApiKey, Worker
from workspaces.secrets import hash_secret
key_ok = ApiKey.objects.filter(
    key_hash=hash_secret(os.environ["SLUICE_DEV_API_KEY"]), revoked_at__isnull=True,
    principal__is_active=True, principal__name="demo", principal__tenant__name="demo",
).exists()
worker = Worker.objects.filter(worker_id=os.environ["SLUICE_DEV_WORKER"], tenant__name="demo").first()
if key_ok and worker is not None:
    token, creds = worker_token_rotate(worker=worker)
    print(json.dumps({"worker_id": worker.worker_id, "worker_token": token,
                      **(creds.as_json() if creds else {})}))
else:
    print("null")
"""


def demo_account(env: dict[str, str], worker_id: str) -> tuple[dict[str, str], bool]:
    """The demo principal's API key and a fresh worker token; True when the key was reused."""
    stored = DEMO_KEY_FILE.read_text().strip() if DEMO_KEY_FILE.exists() else ""
    if stored:
        out = manage(
            env,
            "shell",
            "--no-imports",
            "-c",
            REUSE_CODE,
            extra_env={"SLUICE_DEV_API_KEY": stored, "SLUICE_DEV_WORKER": worker_id},
        )
        reused = json.loads(out.strip().splitlines()[-1])
        if reused:
            return {**reused, "api_key": stored}, True
    # bootstrap prints secrets once; the API key is kept (0600) so later runs show the same one.
    # The demo worker is this run's own (none of an earlier run is still up), so it may be
    # given a new token even when an earlier run made it.
    account: dict[str, str] = json.loads(
        manage(env, "bootstrap", "--json", "--worker", worker_id, "--rotate-worker-token")
        .strip()
        .splitlines()[-1]
    )
    write_private(DEMO_KEY_FILE, account["api_key"] + "\n")
    return account, False


APP_FILES = {
    # The linked worktrees live inside the checkout; git must not list them as untracked.
    ".gitignore": ".worktrees/\n",
    "README.md": "# Demo app\n\nA tiny project for trying Sluice's workspace tools.\n",
    "src/app.py": 'from util import greet\n\n\nif __name__ == "__main__":\n    print(greet("Sluice"))\n',
    "src/util.py": 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n',
    "tests/test_util.py": 'from util import greet\n\n\ndef test_greet():\n    assert greet("x") == "Hello, x!"\n',
}
DOCS_FILES = {
    "index.md": "# Docs\n\nSee [the guide](guide.md).\n",
    "guide.md": "# Guide\n\n1. Read a file.\n2. Search for text.\n3. Edit a file.\n",
}


def git(cwd: Path, *args: str) -> str:
    # Hooks and fsmonitor off: an agent's command may have planted either in a demo checkout.
    return run_git(
        cwd, "-c", "user.name=Sluice demo", "-c", "user.email=demo@sluice.invalid", *args
    ).stdout


def demo_repo(path: Path, files: dict[str, str]) -> None:
    if (path / ".git").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "Demo files")


def demo_lane(root: Path, name: str) -> None:
    """A real linked worktree at <root>/.worktrees/<name>, with one commit of its own."""
    lane = root / ".worktrees" / name
    if (lane / ".git").is_file():
        return
    git(root, "worktree", "prune")  # Forget a lane whose directory was deleted by hand.
    if git(root, "branch", "--list", name).strip():
        git(root, "worktree", "add", "-q", f".worktrees/{name}", name)
        return
    git(root, "worktree", "add", "-q", "-b", name, f".worktrees/{name}")
    (lane / "FEATURE.md").write_text(f"# {name}\n\nWork in progress on the {name} branch.\n")
    git(lane, "add", "-A")
    git(lane, "commit", "-q", "-m", f"Start {name}")


def demo_workspaces() -> dict[str, Path]:
    """Workspace id -> checkout: `app` (with lane `feature`) and `docs`."""
    app, docs = VAR / "demo" / "app", VAR / "demo" / "docs"
    demo_repo(app, APP_FILES)
    demo_lane(app, "feature")
    demo_repo(docs, DOCS_FILES)
    return {"app": app, "docs": docs}


METRICS_TOKEN_FILE = VAR / "metrics-token"


def metrics_token() -> str:
    """The scrape token of `/metrics`: made on the first run and kept in var/metrics-token,
    readable by this user only; a local Prometheus reads the file (`credentials_file`). Commands
    never see it: the worker hides this checkout's var/ from them."""
    path = METRICS_TOKEN_FILE
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    write_private(path, secrets.token_urlsafe(32) + "\n")
    return path.read_text().strip()


def admin_password() -> str:
    """Made on the first run and kept in var/admin-password.txt, readable by this user only."""
    path = VAR / "admin-password.txt"
    if path.exists() and path.read_text().strip():
        return path.read_text().strip()
    password = secrets.token_urlsafe(12)
    VAR.mkdir(exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(password + "\n")
    return password
