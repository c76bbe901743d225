"""`make fuzz`: fuzz a live local Sluice (uvicorn API + a real `runworker`) and judge it.

    .venv/bin/python -m fuzz.run [--examples N] [--focused-examples N] [--seed S] [--skip PHASE]

Sets up its own throwaway database (`sluice_fuzz`, through benchmarks/harness.py) and Redis
prefix, an account, a temporary git workspace beside a canary file and links that point out of
it (fuzz/sandbox.py), then runs three phases against the live server:

1. probes      deterministic calls that provoke each answer (fuzz/probes.py);
2. schemathesis the OpenAPI document at /v1/schema/ drives generated calls (fuzz/st_hooks.py);
3. focused     hypothesis fuzz of paths, headers and the queue-wait header (fuzz/focused.py).

Fails (exit 1) on: any 500 (or other undocumented 5xx), a non-JSON error body, a response
outside the schema, a probe answering other than the contract says, a file outside the
workspace created, removed or changed, the canary's content in a response, a quarantine the run
caused, or an ERROR logged by the API or the worker; findings that a reported bug in
fuzz/known.py explains are listed as KNOWN instead. See docs/fuzzing.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tests")]
import harness  # noqa: E402  (sets sys.path for tests/ and Django up on the fuzz database)

from fuzz import oracle, sandbox  # noqa: E402
from fuzz.known import known_log  # noqa: E402

ARTIFACTS = ROOT / "artifacts" / "fuzz"
PHASES = ("probes", "schemathesis", "focused")
# What schemathesis judges. `positive_data_acceptance` is left out: the schema cannot say that a
# request id is single-use or that a worker must exist, so valid-looking calls are refused by
# design. `negative_data_rejection` stays: the server must refuse what the schema forbids.
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "no_canary_leak",
)


def say(text: str) -> None:
    print(f"[fuzz] {text}", flush=True)


def log_errors(process: Any) -> tuple[list[str], list[str]]:
    """ERROR lines a process logged (JSON lines of config/logging.py, or a bare traceback),
    split into (unexplained, explained by a known bug)."""
    failures: list[str] = []
    known: list[str] = []
    for line in process.lines:
        try:
            record = json.loads(line)
        except ValueError:
            if line.startswith("Traceback") or "Internal Server Error" in line:
                failures.append(line[:300])
            continue
        if not isinstance(record, dict) or record.get("level") not in ("ERROR", "CRITICAL"):
            continue
        # Django logs each 5xx answer at ERROR; answers are judged on their own, by the oracle.
        if record.get("logger") == "django.request":
            continue
        text = f"{record.get('logger')}: {record.get('message')}"[:300]
        bug = known_log(record)
        (known if bug else failures).append(f"{bug.id}: {text}" if bug else text)
    return failures, known


# What the worker says when run_operation raised something unexpected; it also logs an ERROR,
# which log_errors judges. Any other reason is an unknown outcome the fuzzer must not cause.
UNEXPECTED_FAILURE = "The worker failed while running the call."


def release_quarantines(phase: str) -> list[str]:
    """Release every open quarantine so the next phase starts clean; unexplained ones fail."""
    from django.utils import timezone

    from admission.models import Quarantine

    failures = []
    for row in Quarantine.objects.filter(released_at__isnull=True):
        if row.reason not in ("probe", UNEXPECTED_FAILURE):
            failures.append(f"{phase} quarantined {row}: {row.operation}: {row.reason}")
        if row.reason != "probe":
            say(f"{phase}: released a quarantine of {row} ({row.operation}: {row.reason})")
    Quarantine.objects.filter(released_at__isnull=True).update(
        released_at=timezone.now(), released_by="fuzz"
    )
    return failures


def run_probes(ctx: dict[str, Any], judge: oracle.ResponseOracle) -> tuple[list[str], list[str]]:
    from fuzz import probes

    live = probes.Live(ctx["api"].url, ctx["main"]["api_key"], ctx["main"]["worker_id"], "fuzz")
    answers = probes.run_all(
        live,
        spare_worker_id=ctx["probe_spare"]["worker_id"],
        spare_token=ctx["probe_spare"]["worker_token"],
        slow=True,
    )
    failures, known = [], []
    for answer in answers:
        r = answer.response
        problems = [p for p in [answer.mismatch()] if p]
        problems += judge.problems(
            answer.method, answer.path, r.status_code, dict(r.headers), r.content
        )
        if answer.known_bug and problems:
            known.append(f"{answer.known_bug}: probe {answer.label!r} still fails")
        elif answer.known_bug:
            failures.append(
                f"XPASS probe {answer.label!r}: {answer.known_bug} looks fixed; delete it from "
                "fuzz/known.py and its xfail mark in tests/test_openapi_schema.py"
            )
        elif problems:
            failures.append(f"{answer.label}: " + "; ".join(problems))
    statuses = Counter(a.response.status_code for a in answers)
    say(f"probes: {len(answers)} calls, statuses {dict(sorted(statuses.items()))}")
    return failures, known


def write_st_config(directory: Path) -> Path:
    config = directory / "schemathesis.toml"
    config.write_text(
        "[auth.openapi.apiKey]\n"
        'bearer = "${FUZZ_API_KEY}"\n'
        "[auth.openapi.workerToken]\n"
        'bearer = "${FUZZ_WORKER_TOKEN}"\n'
        # 502/503/504 are typed answers the document lists (a worker refusal, a queue timeout);
        # a 500, or any 5xx the document does not list for the operation, still fails.
        "[checks.not_a_server_error]\n"
        'expected-statuses = ["1xx", "2xx", "3xx", "4xx", "502", "503", "504"]\n'
    )
    return config


def run_schemathesis(
    ctx: dict[str, Any], examples: int, seed: int, extra: list[str]
) -> tuple[list[str], list[str], dict[str, Any]]:
    url = ctx["api"].url
    report = ARTIFACTS / "schemathesis"
    env = {
        **ctx["env"],
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
        "SCHEMATHESIS_HOOKS": "fuzz.st_hooks",
        "FUZZ_API_KEY": ctx["keys"]["schemathesis"],
        "FUZZ_WORKER_TOKEN": ctx["spare"]["worker_token"],
        "FUZZ_WORKER_ID": ctx["main"]["worker_id"],
        "FUZZ_SPARE_WORKER_ID": ctx["spare"]["worker_id"],
        "FUZZ_SECRETS": ",".join(ctx["box"].secrets),
        "FUZZ_SEED": str(seed),
        "FUZZ_KNOWN_LOG": str(ctx["tmp"] / "known.jsonl"),
    }
    st = Path(sys.executable).with_name("st")
    # One worker: with several, CPython 3.11 fails inside hypothesis ("SystemError: AST
    # constructor recursion depth mismatch", threads compiling strategies at once) and the run
    # ends in a crash that is schemathesis's, not an answer of Sluice's.
    command = [
        str(st), "--config-file", str(write_st_config(ctx["tmp"])), "--no-color",
        "run", f"{url}/v1/schema/", "--url", url,
        "--max-examples", str(examples), "--seed", str(seed),
        "--phases", "examples,coverage,fuzzing",
        "--checks", ",".join(CHECKS),
        "--workers", "1", "--request-timeout", "60", "--continue-on-failure",
        "--report", "junit,ndjson", "--report-dir", str(report),
        "--suppress-health-check", "all",
        *extra,
    ]  # fmt: skip
    say(f"schemathesis: {examples} examples per operation, seed {seed}")
    started = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    (report / "output.txt").write_text(output)
    summary = _st_summary(output)
    summary["seconds"] = round(seconds, 1)
    summary["exit"] = done.returncode
    say(f"schemathesis: exit {done.returncode} after {seconds:.0f} s; {summary.get('line', '')}")
    failures = []
    if done.returncode != 0:
        tail = "\n".join(output.splitlines()[-60:])
        failures.append(f"schemathesis failed (full output in {report / 'output.txt'}):\n{tail}")
    log = ctx["tmp"] / "known.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    bugs = Counter(json.loads(line)["bug"] for line in lines)
    summary["known"] = dict(bugs)
    known = [f"{bug}: {count} schemathesis failures" for bug, count in sorted(bugs.items())]
    return failures, known, summary


def _st_summary(output: str) -> dict[str, Any]:
    """The figures of schemathesis' closing summary ("Test cases:" then "N generated, ...")."""
    lines = output.splitlines()
    summary: dict[str, Any] = {}
    for index, line in enumerate(lines[:-1]):
        if line.strip() == "Test cases:":
            summary["line"] = lines[index + 1].strip()
            generated = re.search(r"([0-9]+) generated", summary["line"])
            summary["cases"] = int(generated.group(1)) if generated else None
        elif line.startswith("Filtered:"):
            summary["filtered"] = line.split(":", 1)[1].strip()
    return summary


def run_focused(
    ctx: dict[str, Any], judge: oracle.ResponseOracle, examples: int, seed: int
) -> tuple[list[str], list[str], dict[str, Any]]:
    from fuzz import focused

    target = focused.Target(
        url=ctx["api"].url,
        api_key=ctx["keys"]["focused"],
        worker_id=ctx["main"]["worker_id"],
        workspace=ctx["box"].workspace,
        judge=judge,
    )
    started = time.monotonic()
    focused.run(target, examples=examples, seed=seed)
    seconds = time.monotonic() - started
    failures = [f"{label}: {problem}" for label, problem in target.findings]
    known = [f"{bug}: {count} focused answers" for bug, count in sorted(target.known.items())]
    say(
        f"focused: {target.calls} calls in {seconds:.0f} s, statuses "
        f"{dict(sorted(target.statuses.items()))}, {len(target.findings)} findings"
    )
    return failures, known, {"calls": target.calls, "seconds": round(seconds, 1)}


def principal_hash(tenant: str, user: str) -> str:
    from workspaces.access import principal_hash as scope
    from workspaces.models import Principal

    principal = Principal.objects.get(tenant__name=tenant, name=user)
    return scope(tenant_id=principal.tenant_id, principal_id=principal.pk)


def completion_figures(users: dict[str, str]) -> dict[str, dict[str, int]]:
    """Execute calls per phase from the completion log: "status code" -> count.

    Rows reach Postgres through a Redis stream in batches, so the count is read until it
    stops growing (at most ~10 s).
    """
    from django.db.models import Count

    from admission.models import CompletionLog

    last, stable_since = -1, time.monotonic()
    give_up = stable_since + 10
    while time.monotonic() - stable_since < 2 and time.monotonic() < give_up:
        count = CompletionLog.objects.count()
        if count != last:
            last, stable_since = count, time.monotonic()
        time.sleep(0.5)
    figures = {}
    for phase, user in users.items():
        rows = (
            CompletionLog.objects.filter(principal_hash=principal_hash("fuzz", user))
            .values("http_status", "code")
            .annotate(n=Count("id"))
        )
        figures[phase] = {
            f"{r['http_status']} {r['code'] or 'ok'}": r["n"]
            for r in sorted(rows, key=lambda r: (r["http_status"], r["code"]))
        }
    return figures


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="schemathesis: max per operation")
    parser.add_argument("--focused-examples", type=int, default=500, help="per focused target")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--skip", action="append", default=[], choices=PHASES)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument(
        "--st-arg", action="append", default=[], help="one more argument for `st run` (repeatable)"
    )
    return parser.parse_args()


def set_up(tmp: Path, ctx: dict[str, Any]) -> None:
    """The throwaway database, accounts, sandbox, API and worker: everything a phase needs,
    into `ctx` as it is made, so that a failure half-way still stops what was started."""
    env = harness.prepare("sluice_fuzz", WORKSPACE_TOOLS_RATE_LIMIT="1000000/1s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from livesupport import Worker, start_api

    from fuzz.probes import new_api_key

    box = sandbox.build(tmp / "parent")
    ctx |= {
        "env": env,
        "tmp": tmp,
        "box": box,
        "before": oracle.snapshot(box.parent, skip=box.workspace),
        "canary": box.canary.read_bytes(),
        "main": harness.account("fuzz-worker", tenant="fuzz"),
        "spare": harness.account("fuzz-spare", tenant="fuzz"),
        "probe_spare": harness.account("fuzz-probe-spare", tenant="fuzz"),
    }
    # A principal per phase: request ids and rate budgets are per principal, and the completion
    # log tells the phases apart by it.
    ctx["keys"] = {user: new_api_key("fuzz", user) for user in ("schemathesis", "focused")}
    ctx["api"] = start_api(env)
    ctx["worker"] = Worker(
        worker_id=ctx["main"]["worker_id"],
        token=ctx["main"]["worker_token"],
        workspaces={sandbox.WORKSPACE_ID: box.workspace},
        api_url=ctx["api"].url,
        env=env,
        slots=4,
        lanes=True,
    )
    ctx["worker"].start()


def run_phases(
    ctx: dict[str, Any], args: argparse.Namespace, figures: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """(failures, known bugs) of the phases; each phase releases the quarantines it caused."""
    judge = oracle.ResponseOracle(
        httpx.get(f"{ctx['api'].url}/v1/schema/").json(), secrets=ctx["box"].secrets
    )
    failures: list[str] = []
    known: list[str] = []
    if "probes" not in args.skip:
        f, k = run_probes(ctx, judge)
        failures, known = failures + f, known + k
        failures += release_quarantines("probes")
    if "schemathesis" not in args.skip:
        f, k, figures["schemathesis"] = run_schemathesis(ctx, args.examples, args.seed, args.st_arg)
        failures, known = failures + f, known + k
        failures += release_quarantines("schemathesis")
    if "focused" not in args.skip:
        f, k, figures["focused"] = run_focused(ctx, judge, args.focused_examples, args.seed)
        failures, known = failures + f, known + k
        failures += release_quarantines("focused")
    # harness.account's principal is "bench"; the probes call as it.
    phases = {"probes": "bench", "schemathesis": "schemathesis", "focused": "focused"}
    figures["execute_calls"] = completion_figures(phases)
    for phase, counts in figures["execute_calls"].items():
        say(f"completion log, {phase}: {sum(counts.values())} execute calls: {counts}")
    return failures, known


def after_the_run(ctx: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(failures, known bugs) found once the processes stopped: their logs, the filesystem."""
    failures: list[str] = []
    known: list[str] = []
    for name, process in (("API", ctx["api"].process), ("worker", ctx["worker"].process)):
        (ARTIFACTS / f"{name.lower()}.log").write_text(process.output())
        unexplained, explained = log_errors(process)
        failures += [f"{name} logged an error: {line}" for line in unexplained]
        known += [f"{name} logged: {line}" for line in explained]
    box = ctx["box"]
    after = oracle.snapshot(box.parent, skip=box.workspace)
    failures += [
        f"outside the workspace: {c}" for c in oracle.snapshot_changes(ctx["before"], after)
    ]
    if box.canary.read_bytes() != ctx["canary"]:
        failures.append("the canary file changed")
    return failures, known


def main() -> int:
    args = parse_args()
    started = time.monotonic()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="sluice-fuzz-"))
    figures: dict[str, Any] = {"seed": args.seed}
    ctx: dict[str, Any] = {}
    try:
        set_up(tmp, ctx)
        say(f"API {ctx['api'].url}, workspace {ctx['box'].workspace}, seed {args.seed}")
        try:
            failures, known = run_phases(ctx, args, figures)
        finally:
            ctx["worker"].stop()
            ctx["api"].process.stop()
            harness.cleanup_redis()
        f, k = after_the_run(ctx)
        failures, known = failures + f, known + k
    finally:
        # Normally stopped already; after a failure half-way, whatever did start.
        if "worker" in ctx and ctx["worker"].process is not None:
            ctx["worker"].kill()
        if "api" in ctx:
            ctx["api"].process.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)

    figures["seconds"] = round(time.monotonic() - started, 1)
    summary = {**figures, "failures": failures, "known": known}
    (ARTIFACTS / "summary.json").write_text(json.dumps(summary, indent=2))
    for line in known:
        say(f"KNOWN (reported bug): {line}")
    for line in failures:
        say(f"FAIL: {line}")
    verdict = "FAILED" if failures else "passed"
    say(
        f"{verdict} in {figures['seconds']:.0f} s: {len(failures)} failures, {len(known)} known "
        f"bugs; figures in {ARTIFACTS / 'summary.json'}"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
