"""What a fuzzed answer must satisfy, and what the filesystem must still look like afterwards.

Shared by `make fuzz` (fuzz/run.py, fuzz/focused.py) and tests/test_openapi_schema.py, so the
suite and the fuzzer judge a response by the same rules:

* not a 5xx that the document does not list (a 500 never is);
* an error answer on an API path is JSON (the document's media type for that status);
* the status is documented for the operation, and the body and documented headers validate
  against the OpenAPI document served at /v1/schema/;
* no response carries the canary's secret (a file outside the workspace read through a link).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema_rs

# The API's own paths answer typed JSON errors; /metrics is a scraper's text endpoint.
JSON_ERROR_PREFIXES = ("/v1/", "/healthz")


def _template_regex(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")


@dataclass
class ResponseOracle:
    """Judges (method, path, status, headers, body) against an OpenAPI 3.1 document."""

    document: dict[str, Any]
    secrets: tuple[str, ...] = ()
    _validators: dict[tuple[str, str, str, str], jsonschema_rs.Validator] = field(
        default_factory=dict
    )

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any]] | None:
        for template, item in self.document["paths"].items():
            if _template_regex(template).match(path) and method.lower() in item:
                return template, item[method.lower()]
        return None

    def request_valid(self, method: str, path: str, payload: Any) -> bool:
        """Whether the document accepts `payload` as the operation's JSON request body."""
        match = self.operation(method, path)
        if match is None:
            raise KeyError(f"{method} {path} is not in the document")
        template, operation = match
        schema = operation["requestBody"]["content"]["application/json"]["schema"]
        validator = self._validator((method.lower(), template, "request", ""), schema)
        try:
            return validator.is_valid(payload)
        except UnicodeEncodeError:
            # A lone surrogate (JSON allows "\ud800"): no string of the protocol may hold one.
            return False

    def _validator(self, key: tuple[str, str, str, str], schema: Any) -> jsonschema_rs.Validator:
        if key not in self._validators:
            # $refs point into #/components/schemas, so each schema is validated as part of a
            # root that carries the components.
            root = {"components": self.document["components"], "allOf": [schema]}
            self._validators[key] = jsonschema_rs.Draft202012Validator(root)
        return self._validators[key]

    def problems(
        self,
        method: str,
        path: str,
        status: int,
        headers: dict[str, str],
        body: bytes,
    ) -> list[str]:
        """Every rule the answer breaks, as short sentences; [] when it is fine."""
        found: list[str] = []
        text = body.decode("utf-8", errors="replace")
        for secret in self.secrets:
            if secret in text:
                found.append(
                    "the response carries the canary's content (read outside the workspace)"
                )
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if status >= 400 and path.startswith(JSON_ERROR_PREFIXES) and media != "application/json":
            found.append(f"{status} error body is {media or 'untyped'}, not JSON: {text[:120]!r}")
        match = self.operation(method, path)
        if match is None:
            if status >= 500:
                found.append(f"{status} on an undocumented route: {text[:200]!r}")
            return found
        template, operation = match
        response = operation["responses"].get(str(status))
        if response is None:
            found.append(f"status {status} is not documented for {method.upper()} {template}")
            return found
        content = response.get("content", {})
        if media not in content:
            found.append(f"{status} answered {media!r}; documented: {sorted(content)}")
        elif media == "application/json":
            try:
                payload = json.loads(body)
            except ValueError:
                found.append(f"{status} body is not valid JSON: {text[:120]!r}")
            else:
                key = (method.lower(), template, str(status), media)
                validator = self._validator(key, content[media]["schema"])
                for error in list(validator.iter_errors(payload))[:3]:
                    found.append(
                        f"{status} body outside the schema at {error.instance_path}: {error.message[:200]}"
                    )
        lowered = {name.lower(): value for name, value in headers.items()}
        for name, spec in response.get("headers", {}).items():
            value = lowered.get(name.lower())
            if value is None:
                if spec.get("required"):
                    found.append(f"{status} lacks the required header {name}")
                continue
            key = (method.lower(), template, str(status), "header:" + name)
            if not self._validator(key, spec["schema"]).is_valid(value):
                found.append(f"{status} header {name}: {value!r} is outside the schema")
        return found


# --------------------------------------------------------------------------------------------
# Filesystem: a snapshot of a directory tree (minus the workspace) taken before and after.

Entry = tuple[str, int, int, str]  # kind, mode, mtime_ns, sha256 of content / link target


def snapshot(root: Path, *, skip: Path) -> dict[str, Entry]:
    """Every file, directory and link under `root` except `skip` and everything below it.

    Directories are included with their mtime, so a file created and removed again outside
    the workspace still shows up as a changed directory.
    """
    entries: dict[str, Entry] = {}
    for directory, dirs, files in os.walk(root, followlinks=False):
        here = Path(directory)
        # os.walk lists a link to a directory among `dirs` but never descends into it.
        dirs[:] = [d for d in dirs if here / d != skip]
        for name in [*dirs, *files]:
            path = here / name
            info = path.lstat()
            if path.is_symlink():
                kind, digest = "link", os.readlink(path)
            elif path.is_dir():
                kind, digest = "dir", ""
            else:
                kind, digest = "file", hashlib.sha256(path.read_bytes()).hexdigest()
            entries[str(path.relative_to(root))] = (kind, info.st_mode, info.st_mtime_ns, digest)
    info = root.lstat()
    entries["."] = ("dir", info.st_mode, info.st_mtime_ns, "")
    return entries


def snapshot_changes(before: dict[str, Entry], after: dict[str, Entry]) -> list[str]:
    changes = [f"created {p}" for p in sorted(set(after) - set(before))]
    changes += [f"removed {p}" for p in sorted(set(before) - set(after))]
    changes += [
        f"changed {p} ({'content' if before[p][3] != after[p][3] else 'mode/mtime'})"
        for p in sorted(set(before) & set(after))
        if before[p] != after[p]
    ]
    return changes
