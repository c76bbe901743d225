"""What the image's tests share: the container engine `make image` picks, and the build."""

from __future__ import annotations

import os
import shutil
import subprocess

from livesupport import ROOT

# The engine `make image` picks first (scripts/image.sh).
ENGINE = next((name for name in ("podman", "docker") if shutil.which(name)), None)
IMAGE = "sluice:latest"


def engine(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    assert ENGINE
    result = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=timeout)
    if check:
        assert result.returncode == 0, f"{ENGINE} {' '.join(args)}:\n{result.stderr[-3000:]}"
    return result


def build_image() -> str:
    """`make image`, as an operator runs it: none of this test run's settings leak into it.
    After the first build on a machine it reuses the base and the layers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DJANGO"))}
    build = subprocess.run(
        ["make", "image"],
        cwd=ROOT,
        env={**env, "CONTAINER_ENGINE": str(ENGINE), "IMAGE": IMAGE},
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return IMAGE
