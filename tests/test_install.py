"""The installable parts install alone: `pip install ./client` (and from a git URL's client/
subdirectory) in a fresh venv, with nothing from the server's checkout but what pip builds.

The tests have no network, so the fresh venv cannot download httpx or a build backend. They are
lent from this venv instead: the distributions the package needs (and `wheel`, which setuptools
needs to build a wheel) are linked into a directory the fresh venv puts on its path. Nothing else
of this venv is visible there, in particular not its editable sluice-protocol.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
from livesupport import Process, git_workspace, unique
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _closure(names: list[str]) -> set[str]:
    """The distributions `names` need at run time, themselves included (no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for spec in importlib.metadata.requires(name) or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _lend(names: list[str], into: Path) -> None:
    """Link every top-level file of the `names` closure (code and .dist-info) into `into`."""
    into.mkdir()
    for name in _closure(names):
        dist = importlib.metadata.distribution(name)
        site = Path(str(dist.locate_file("")))
        tops = {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}
        for top in tops:
            if (site / top).exists() and not (into / top).exists():
                (into / top).symlink_to(site / top)


def _fresh_venv(tmp_path: Path, lend: list[str]) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    lent = tmp_path / "lent"
    _lend(lend, lent)
    purelib = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # Appended after the venv's own site-packages: what pip installs there comes first.
    (Path(purelib) / "lent.pth").write_text(f"{lent}\n")
    return venv


def _pip(venv: Path, *args: str, cwd: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--no-index",
            "--no-build-isolation",
            *args,
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _checkout(tmp_path: Path, *parts: str) -> Path:
    """A copy of the named parts of this checkout, committed to a git repository of its own."""
    repo = tmp_path / "repo"
    for part in parts:
        shutil.copytree(
            ROOT / part,
            repo / part,
            ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"),
        )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "copy"], check=True)
    return repo


def _assert_client_installed(venv: Path) -> None:
    python = str(venv / "bin" / "python")
    site = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    where = subprocess.run(
        [python, "-c", "import sluice_client, sluice_protocol; print(sluice_protocol.__file__)"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert where.startswith(site), where
    requires = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.requires('sluice-client'))"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "sluice-protocol" not in requires, requires
    helped = subprocess.run(
        [str(venv / "bin" / "sluice-client"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    assert "read_file" in helped.stdout


@pytest.mark.timeout(600)
def test_pip_install_client_directory_in_a_fresh_venv(tmp_path: Path) -> None:
    repo = _checkout(tmp_path, "client", "protocol")
    venv = _fresh_venv(tmp_path, ["httpx", "wheel"])
    _pip(venv, "./client", cwd=repo)
    _assert_client_installed(venv)


@pytest.mark.timeout(600)
def test_pip_install_client_from_a_git_url_subdirectory(tmp_path: Path) -> None:
    repo = _checkout(tmp_path, "client", "protocol")
    venv = _fresh_venv(tmp_path, ["httpx", "wheel"])
    _pip(venv, f"git+file://{repo}#subdirectory=client", cwd=tmp_path)
    _assert_client_installed(venv)


# What the server needs and a worker must not: none of it may be importable in the worker's venv.
SERVER_ONLY = ["psycopg", "uvicorn", "rest_framework", "drf_spectacular", "whitenoise"]
SERVER_ONLY += ["prometheus_client", "adrf"]
WORKER_PARTS = ("worker", "protocol", "config", "workspaces", "admission")


def _installed_worker(tmp_path: Path, *, from_git: bool = False) -> Path:
    repo = _checkout(tmp_path, *WORKER_PARTS)
    venv = _fresh_venv(
        tmp_path, ["Django", "celery", "redis", "kombu", "packaging", "httpx", "wheel"]
    )
    if from_git:
        _pip(venv, f"git+file://{repo}#subdirectory=worker", cwd=tmp_path)
    else:
        _pip(venv, "./worker", cwd=repo)
    python = str(venv / "bin" / "python")
    missing = subprocess.run(
        [python, "-c", "import importlib.util as u, sys; "
         "print([m for m in sys.argv[1:] if u.find_spec(m)])", *SERVER_ONLY],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    ).stdout.strip()  # fmt: skip
    assert missing == "[]", missing
    return venv


@pytest.mark.timeout(600)
def test_pip_install_worker_from_a_git_url_gives_sluice_worker_without_the_servers_packages(
    tmp_path: Path,
) -> None:
    venv = _installed_worker(tmp_path, from_git=True)
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    helped = subprocess.run(
        [str(venv / "bin" / "sluice-worker"), "--help"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: sluice-worker")
    for flag in ("--pairing-code", "--credentials", "--workspace", "--linked-worktree-lanes"):
        assert flag in helped.stdout


@pytest.mark.timeout(600)
def test_a_paired_sluice_worker_from_its_own_venv_serves_calls(
    tmp_path: Path, api: Any, live_env: dict[str, str], account_factory: Any
) -> None:
    venv = _installed_worker(tmp_path)
    owner = account_factory()
    worker_id = unique("pip")
    repo = git_workspace(
        tmp_path / "workspace", files={"README.md": "from a pip-installed worker\n"}
    )
    # A worker machine's shell: the server's Redis and key prefix (ACL users are off in the
    # tests, so pairing hands out no Redis URL of the worker's own), nothing else of the server.
    keep = ("PATH", "HOME", "LANG", "TMPDIR", "REDIS_URL", "ADMISSION_REDIS_URL")
    env = {k: v for k, v in live_env.items() if k in keep}
    env |= {"SLUICE_REDIS_PREFIX": live_env["SLUICE_REDIS_PREFIX"], "PYTHONUNBUFFERED": "1"}
    with api.client() as http:
        code = http.post(
            "/v1/bridge/pairings", headers=owner.auth, json={"workerId": worker_id}
        ).json()["code"]
        worker = Process(
            [str(venv / "bin" / "sluice-worker"), "--pairing-code", code, "--api", api.url,
             "--workspace", f"repo={repo}", "--credentials", str(tmp_path / "worker.json"),
             "--allow-unsandboxed-commands"],
            env,
            "sluice-worker",
            cwd=tmp_path,
        )  # fmt: skip
        try:
            worker.wait_for("ready", timeout_s=90)
            headers = owner.auth | {"X-LibreChat-Code-Worker-ID": worker_id}
            body = {"protocolVersion": 1, "workspaceId": "repo"}
            read = http.post(
                "/v1/workspace-tools/execute",
                headers=headers,
                json=body | {"operation": "read_file", "path": "README.md"},
            )
            assert read.status_code == 200, read.text
            assert read.json()["content"] == "from a pip-installed worker"
            ran = http.post(
                "/v1/workspace-tools/execute",
                headers=headers,
                json=body | {"operation": "execute_command", "command": "echo ran"},
            )
            assert ran.status_code == 200, ran.text
            assert "ran" in ran.json()["stdout"]
        finally:
            code_ = worker.stop(40)
        assert code_ == 0, worker.output()
        assert f"worker {worker_id} deregistered" in worker.output()
        assert "Traceback" not in worker.output()
