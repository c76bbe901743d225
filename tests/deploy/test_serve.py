"""The image's default command and compose.yaml, read without starting anything (the image
itself is tests/deploy/test_image.py's)."""

from __future__ import annotations

import yaml
from livesupport import ROOT

from scripts.devprocs import api_serve_args
from scripts.serve import serve_command


def test_the_image_serves_as_make_run_on_port_and_processes_from_the_environment() -> None:
    command = serve_command({"PORT": "9123", "API_PROCESSES": "3"})
    assert command[1:4] == ["-m", "uvicorn", "config.asgi:application"]
    assert command[command.index("--port") + 1] == "9123"
    assert command[command.index("--host") + 1] == "0.0.0.0"
    assert command[-len(api_serve_args(3)) :] == api_serve_args(3)


def test_a_stopping_api_waits_as_long_as_the_longest_command_may_run() -> None:
    def grace(env: dict[str, str]) -> str:
        command = serve_command(env)
        return command[command.index("--timeout-graceful-shutdown") + 1]

    assert grace({}) == "300"
    assert grace({"JOB_TIMEOUT": "90500"}) == "91"
    assert grace({"JOB_TIMEOUT": "90500", "GRACEFUL_SHUTDOWN_S": "12"}) == "12"


def test_compose_runs_the_four_services_each_with_a_health_check() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "redis", "api", "drainer"}
    for name, service in services.items():
        # The shell form: podman-compose 1.0 turns the exec form into a broken command.
        assert service["healthcheck"]["test"][0] == "CMD-SHELL", name
    assert services["api"]["image"] == services["drainer"]["image"]
    assert "command" not in services["api"]  # the image's own: migrate, then serve
    assert services["drainer"]["command"] == ["python", "manage.py", "drain_completions"]
    assert services["api"]["healthcheck"]["test"][1] == "python -m scripts.healthcheck api"
    assert services["drainer"]["healthcheck"]["test"][1] == "python -m scripts.healthcheck drainer"
