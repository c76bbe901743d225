"""Protocol v1 field rules: every bound is tested on both sides, requests and results alike."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from sluice_protocol import (
    MATCH_TEXT_MAX_CHARS,
    READ_MAX_BYTES,
    WORKER_ERROR_STATUS,
    ProtocolError,
    is_safe_relative_path,
    isolation_key,
    keys_conflict,
    parse_queue_wait_header,
    validate_error_result,
    validate_request,
    validate_request_id,
    validate_result,
    validate_worker_id,
    worker_error_status,
)

MIB = 1024 * 1024
HEX64 = "0123456789abcdef" * 4
WORKSPACE = "ws-1"
SURROGATE = "\ud800"


def request(operation: str, **fields: object) -> dict[str, Any]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": WORKSPACE, **fields}


def refusal(body: object) -> ProtocolError:
    with pytest.raises(ProtocolError) as caught:
        validate_request(body)
    assert caught.value.code == "INVALID_WORKSPACE_TOOL_REQUEST"
    return caught.value


# --------------------------------------------------------------------------------------------
# ProtocolError


def test_protocol_error_carries_code_and_message() -> None:
    error = ProtocolError("RESULT_INVALID", "bad result")
    assert (error.code, error.message, str(error)) == ("RESULT_INVALID", "bad result", "bad result")
    assert isinstance(error, ValueError)


def test_protocol_error_survives_pickling_across_processes() -> None:
    error = pickle.loads(pickle.dumps(ProtocolError("INVALID_WORKER_ID", "nope")))
    assert (error.code, error.message) == ("INVALID_WORKER_ID", "nope")


# --------------------------------------------------------------------------------------------
# Safe relative paths

PATH_CASES = [
    ("a", True),
    ("a/b/c.txt", True),
    ("a..b/.hidden", True),
    ("x" * 4096, True),
    ("x" * 4097, False),
    ("a/" * 2047 + "bc", True),  # 4096 characters
    ("é" * 4096, True),  # the bound is in characters, not bytes
    ("a/../b", False),
    ("..", False),
    ("a/..", False),
    ("./a", False),
    ("a/./b", False),
    ("a//b", False),
    ("a/", False),
    ("/a", False),
    ("/", False),
    ("a\\b", False),
    ("..\\a", False),
    ("a\x00b", False),
    ("a" + SURROGATE, False),
    (None, False),
    (5, False),
    (b"a", False),
    (["a"], False),
]


@pytest.mark.parametrize(("path", "safe"), PATH_CASES)
def test_safe_relative_path_follows_the_contract(path: object, safe: bool) -> None:
    assert is_safe_relative_path(path) is safe


def test_empty_path_is_safe_only_when_allowed() -> None:
    assert is_safe_relative_path("") is False
    assert is_safe_relative_path("", allow_empty=True) is True


@pytest.mark.parametrize(("path", "safe"), PATH_CASES[:20])
def test_request_path_is_refused_exactly_when_unsafe(path: str, safe: bool) -> None:
    body = request("read_file", path=path)
    if safe:
        assert validate_request(body)["path"] == path
    else:
        assert "path" in refusal(body).message


@pytest.mark.parametrize(
    ("operation", "field", "extra"),
    [
        ("read_file", "path", {}),
        ("list_files", "path", {}),
        ("list_files", "afterPath", {}),
        ("search_text", "path", {"query": "x"}),
        ("write_file", "path", {"content": ""}),
        ("preview_edit", "path", {"edits": [{"oldText": "a", "newText": "b"}]}),
        ("edit_file", "path", {"edits": [{"oldText": "a", "newText": "b"}]}),
        ("execute_command", "cwd", {"command": "ls"}),
    ],
)
@pytest.mark.parametrize("hostile", ["/etc", "a/../../b", "a\\b", "a\x00b", "a//b", "./a"])
def test_every_path_field_refuses_unsafe_paths(
    operation: str, field: str, extra: dict[str, object], hostile: str
) -> None:
    assert field in refusal(request(operation, **extra, **{field: hostile})).message


# --------------------------------------------------------------------------------------------
# Requests: defaults and shape


@pytest.mark.parametrize(
    ("body", "expected_fields"),
    [
        (request("read_file", path="a"), {"path": "a", "startLine": 1, "maxLines": 200}),
        (request("list_files"), {"path": "", "maxResults": 100}),
        (request("search_text", query="q"), {"query": "q", "path": "", "maxResults": 50}),
        (
            request("write_file", path="a", content="x"),
            {"path": "a", "content": "x", "overwrite": False},
        ),
        (
            request("preview_edit", path="a", edits=[{"oldText": "o", "newText": "n"}]),
            # replaceAll gets no default: naming it at all asks for `matches` (§2.2.1).
            {"path": "a", "edits": [{"oldText": "o", "newText": "n"}]},
        ),
        (
            request("edit_file", path="a", edits=[{"oldText": "o", "newText": ""}]),
            {"path": "a", "edits": [{"oldText": "o", "newText": ""}]},
        ),
        (
            request("execute_command", command="ls"),
            {"command": "ls", "cwd": "", "timeoutMs": 30000, "maxOutputBytes": 262144},
        ),
    ],
)
def test_defaults_are_filled_in(body: dict[str, Any], expected_fields: dict[str, object]) -> None:
    common = {"protocolVersion": 1, "operation": body["operation"], "workspaceId": WORKSPACE}
    assert validate_request(body) == {**common, **expected_fields}


def test_validated_request_is_a_new_dict_and_the_body_is_untouched() -> None:
    body = request("edit_file", path="a", edits=[{"oldText": "o", "newText": "n"}])
    before = copy.deepcopy(body)
    validated = validate_request(body)
    assert body == before
    assert validated is not body
    assert validated["edits"] is not body["edits"]
    assert validated["edits"][0] is not body["edits"][0]  # type: ignore[index]


def test_optional_common_fields_stay_absent_unless_sent() -> None:
    validated = validate_request(request("list_files"))
    assert "workspaceInstanceId" not in validated
    assert "worktree" not in validated
    both = validate_request(request("list_files", workspaceInstanceId=HEX64, worktree="lane-1"))
    assert (both["workspaceInstanceId"], both["worktree"]) == (HEX64, "lane-1")


@pytest.mark.parametrize("body", [None, [], "{}", 1, True, [request("list_files")]])
def test_a_body_that_is_not_an_object_is_refused(body: object) -> None:
    refusal(body)


@pytest.mark.parametrize(
    "body",
    [
        request("list_files", hostPath="/srv"),
        request("list_files", query="x"),  # a field of another operation
        request("read_file", path="a", PATH="a"),  # keys are case-sensitive
        request("edit_file", path="a", edits=[{"oldText": "o", "newText": "n", "extra": 1}]),
        request(
            "preview_edit",
            path="a",
            edits=[{"oldText": "o", "newText": "n"}, {"oldText": "o", "newText": "n", "x": 1}],
        ),
    ],
)
def test_unknown_keys_anywhere_are_refused_by_name(body: dict[str, Any]) -> None:
    message = refusal(body).message
    assert "unknown field" in message
    assert any(name in message for name in ("hostPath", "query", "PATH", "extra", "edits[1].x"))


def test_unknown_key_inside_an_edit_names_its_position() -> None:
    body = request("edit_file", path="a", edits=[{"oldText": "o", "newText": "n", "bogus": 1}])
    assert refusal(body).message == "unknown field edits[0].bogus"


@pytest.mark.parametrize(
    ("body", "missing"),
    [
        ({"operation": "list_files", "workspaceId": WORKSPACE}, "protocolVersion"),
        ({"protocolVersion": 1, "workspaceId": WORKSPACE}, "operation"),
        ({"protocolVersion": 1, "operation": "list_files"}, "workspaceId"),
        (request("read_file"), "path"),
        (request("search_text"), "query"),
        (request("write_file", path="a"), "content"),
        (request("write_file", content=""), "path"),
        (request("preview_edit", path="a"), "edits"),
        (request("edit_file", edits=[{"oldText": "o", "newText": "n"}]), "path"),
        (request("edit_file", path="a", edits=[{"newText": "n"}]), "edits[0].oldText"),
        (request("edit_file", path="a", edits=[{"oldText": "o"}]), "edits[0].newText"),
        (request("execute_command"), "command"),
    ],
)
def test_missing_required_fields_are_refused_by_name(body: dict[str, Any], missing: str) -> None:
    assert refusal(body).message == f"missing field {missing}"


# --------------------------------------------------------------------------------------------
# Requests: every bound on both sides. Each row: operation, the other required fields, the
# field under test, its value, accepted or not.

READ = {"path": "a"}
SEARCH = {"query": "q"}
WRITE = {"path": "a", "content": ""}
EDIT = {"path": "a", "edits": [{"oldText": "o", "newText": "n"}]}
COMMAND = {"command": "ls"}

BOUNDS = [
    # Common fields.
    ("list_files", {}, "protocolVersion", 1, True),
    ("list_files", {}, "protocolVersion", 2, False),
    ("list_files", {}, "protocolVersion", 0, False),
    ("list_files", {}, "protocolVersion", True, False),
    ("list_files", {}, "protocolVersion", 1.0, False),
    ("list_files", {}, "protocolVersion", "1", False),
    ("list_files", {}, "protocolVersion", None, False),
    ("list_files", {}, "operation", "delete_file", False),
    ("list_files", {}, "operation", "LIST_FILES", False),
    ("list_files", {}, "operation", None, False),
    ("list_files", {}, "workspaceId", "a", True),
    ("list_files", {}, "workspaceId", "A0._:-z", True),
    ("list_files", {}, "workspaceId", "a" * 128, True),
    ("list_files", {}, "workspaceId", "a" * 129, False),
    ("list_files", {}, "workspaceId", "", False),
    ("list_files", {}, "workspaceId", "-a", False),
    ("list_files", {}, "workspaceId", ".a", False),
    ("list_files", {}, "workspaceId", "a/b", False),
    ("list_files", {}, "workspaceId", "a b", False),
    ("list_files", {}, "workspaceId", "a\n", False),
    ("list_files", {}, "workspaceId", "é", False),
    ("list_files", {}, "workspaceId", "a\x1fb", False),
    ("list_files", {}, "workspaceId", 5, False),
    ("list_files", {}, "workspaceInstanceId", HEX64, True),
    ("list_files", {}, "workspaceInstanceId", HEX64.upper(), False),
    ("list_files", {}, "workspaceInstanceId", HEX64[:63], False),
    ("list_files", {}, "workspaceInstanceId", HEX64 + "0", False),
    ("list_files", {}, "workspaceInstanceId", "g" * 64, False),
    ("list_files", {}, "workspaceInstanceId", HEX64 + "\n", False),
    ("list_files", {}, "workspaceInstanceId", None, False),
    ("list_files", {}, "worktree", "lane-1", True),
    ("list_files", {}, "worktree", "a" * 128, True),
    ("list_files", {}, "worktree", "a" * 129, False),
    ("list_files", {}, "worktree", "lane.lock", False),
    ("list_files", {}, "worktree", "lane.locked", True),
    ("list_files", {}, "worktree", "a:b", False),
    ("list_files", {}, "worktree", ".hidden", False),
    ("list_files", {}, "worktree", "a/b", False),
    ("list_files", {}, "worktree", "", False),
    ("list_files", {}, "worktree", None, False),
    # read_file.
    ("read_file", READ, "startLine", 0, False),
    ("read_file", READ, "startLine", 1, True),
    ("read_file", READ, "startLine", 10**9, True),
    ("read_file", READ, "startLine", -1, False),
    ("read_file", READ, "startLine", True, False),
    ("read_file", READ, "startLine", 1.0, False),
    ("read_file", READ, "startLine", "1", False),
    ("read_file", READ, "startLine", None, False),
    ("read_file", READ, "maxLines", 0, False),
    ("read_file", READ, "maxLines", 1, True),
    ("read_file", READ, "maxLines", 500, True),
    ("read_file", READ, "maxLines", 501, False),
    ("read_file", READ, "maxLines", 500.0, False),
    ("read_file", READ, "path", "", False),
    ("read_file", READ, "path", None, False),
    # list_files.
    ("list_files", {}, "path", "", True),
    ("list_files", {}, "path", "src", True),
    ("list_files", {}, "path", None, False),
    ("list_files", {}, "maxResults", 0, False),
    ("list_files", {}, "maxResults", 1, True),
    ("list_files", {}, "maxResults", 500, True),
    ("list_files", {}, "maxResults", 501, False),
    ("list_files", {}, "maxResults", False, False),
    ("list_files", {}, "afterPath", "a/b", True),
    ("list_files", {}, "afterPath", "", False),
    ("list_files", {}, "afterPath", None, False),
    # search_text.
    ("search_text", SEARCH, "query", "", False),
    ("search_text", SEARCH, "query", "a", True),
    ("search_text", SEARCH, "query", " ", True),
    ("search_text", SEARCH, "query", "x" * 4096, True),
    ("search_text", SEARCH, "query", "x" * 4097, False),
    ("search_text", SEARCH, "query", "é" * 4096, True),  # characters, not bytes
    ("search_text", SEARCH, "query", "a\rb", False),
    ("search_text", SEARCH, "query", "a\nb", False),
    ("search_text", SEARCH, "query", "a\r\n", False),
    ("search_text", SEARCH, "query", "a\x00b", False),
    ("search_text", SEARCH, "query", "a\tb", True),
    ("search_text", SEARCH, "query", SURROGATE, False),
    ("search_text", SEARCH, "query", ["a"], False),
    ("search_text", SEARCH, "path", "", True),
    ("search_text", SEARCH, "maxResults", 0, False),
    ("search_text", SEARCH, "maxResults", 1, True),
    ("search_text", SEARCH, "maxResults", 200, True),
    ("search_text", SEARCH, "maxResults", 201, False),
    # write_file.
    ("write_file", WRITE, "content", "", True),
    ("write_file", WRITE, "content", "x" * MIB, True),
    ("write_file", WRITE, "content", "x" * (MIB + 1), False),
    ("write_file", WRITE, "content", "é" * (MIB // 2), True),  # 2 bytes each: exactly 1 MiB
    ("write_file", WRITE, "content", "é" * (MIB // 2) + "x", False),
    ("write_file", WRITE, "content", "€" * (MIB // 3 + 1), False),  # 3 bytes each: 1 MiB + 2
    ("write_file", WRITE, "content", "a" + SURROGATE, False),
    ("write_file", WRITE, "content", None, False),
    ("write_file", WRITE, "content", b"x", False),
    ("write_file", WRITE, "path", "", False),
    ("write_file", WRITE, "overwrite", True, True),
    ("write_file", WRITE, "overwrite", False, True),
    ("write_file", WRITE, "overwrite", 0, False),
    ("write_file", WRITE, "overwrite", "true", False),
    ("write_file", WRITE, "overwrite", None, False),
    # preview_edit and edit_file.
    ("preview_edit", EDIT, "edits", [], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "n"}] * 100, True),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "n"}] * 101, False),
    ("preview_edit", EDIT, "edits", {"oldText": "o", "newText": "n"}, False),
    ("preview_edit", EDIT, "edits", ["o"], False),
    ("preview_edit", EDIT, "edits", None, False),
    ("preview_edit", EDIT, "edits", [{"oldText": "", "newText": "n"}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": ""}], True),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": None}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": 1, "newText": "n"}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": SURROGATE}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "x" * MIB, "newText": "n"}], True),
    ("preview_edit", EDIT, "edits", [{"oldText": "x" * (MIB + 1), "newText": "n"}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "é" * (MIB // 2)}], True),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "é" * (MIB // 2) + "x"}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "n", "replaceAll": True}], True),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "n", "replaceAll": 1}], False),
    ("preview_edit", EDIT, "edits", [{"oldText": "o", "newText": "n", "replaceAll": None}], False),
    ("preview_edit", EDIT, "expectedBaseSha256", HEX64, False),  # edit_file only
    ("edit_file", EDIT, "edits", [], False),
    ("edit_file", EDIT, "edits", [{"oldText": "o", "newText": "n"}] * 101, False),
    ("edit_file", EDIT, "expectedBaseSha256", HEX64, True),
    ("edit_file", EDIT, "expectedBaseSha256", HEX64.upper(), False),
    ("edit_file", EDIT, "expectedBaseSha256", HEX64[:63], False),
    ("edit_file", EDIT, "expectedBaseSha256", HEX64 + "a", False),
    ("edit_file", EDIT, "expectedBaseSha256", None, False),
    # execute_command.
    ("execute_command", COMMAND, "command", "", False),
    ("execute_command", COMMAND, "command", " ", False),
    ("execute_command", COMMAND, "command", " \t\n ", False),
    ("execute_command", COMMAND, "command", "\u3000", False),  # ideographic space is blank too
    ("execute_command", COMMAND, "command", " ls ", True),
    ("execute_command", COMMAND, "command", "echo a\nb", True),
    ("execute_command", COMMAND, "command", "ls\x00", False),
    ("execute_command", COMMAND, "command", "x" * 32768, True),
    ("execute_command", COMMAND, "command", "x" * 32769, False),
    ("execute_command", COMMAND, "command", "é" * 16384, True),  # 32768 bytes
    ("execute_command", COMMAND, "command", "é" * 16384 + "x", False),  # 32769 bytes
    ("execute_command", COMMAND, "command", "€" * 10922 + "xx", True),  # 32768 bytes
    ("execute_command", COMMAND, "command", "€" * 10923, False),  # 32769 bytes
    ("execute_command", COMMAND, "command", "ls " + SURROGATE, False),
    ("execute_command", COMMAND, "command", ["ls"], False),
    ("execute_command", COMMAND, "cwd", "", True),
    ("execute_command", COMMAND, "cwd", "src/app", True),
    ("execute_command", COMMAND, "cwd", None, False),
    ("execute_command", COMMAND, "timeoutMs", 0, False),
    ("execute_command", COMMAND, "timeoutMs", 1, True),
    ("execute_command", COMMAND, "timeoutMs", 300000, True),
    ("execute_command", COMMAND, "timeoutMs", 300001, False),
    ("execute_command", COMMAND, "timeoutMs", 1000.0, False),
    ("execute_command", COMMAND, "timeoutMs", None, False),
    ("execute_command", COMMAND, "maxOutputBytes", 0, False),
    ("execute_command", COMMAND, "maxOutputBytes", 1, True),
    ("execute_command", COMMAND, "maxOutputBytes", MIB, True),
    ("execute_command", COMMAND, "maxOutputBytes", MIB + 1, False),
    ("execute_command", COMMAND, "maxOutputBytes", True, False),
]


@pytest.mark.parametrize(
    ("operation", "others", "field", "value", "accepted"),
    BOUNDS,
    ids=[f"{row[0]}-{row[2]}-{index}" for index, row in enumerate(BOUNDS)],
)
def test_each_field_bound_holds_on_both_sides(
    operation: str, others: dict[str, object], field: str, value: object, accepted: bool
) -> None:
    body = {**request(operation, **others), field: value}
    if accepted:
        assert validate_request(body)[field] is not None
    else:
        # The message names the field so a caller can fix its request.
        assert field in refusal(body).message


def test_write_of_one_mib_plus_one_byte_is_refused() -> None:
    message = refusal(request("write_file", path="a", content="x" * (MIB + 1))).message
    assert message == "content must be at most 1048576 bytes in UTF-8"


def test_refusal_messages_never_echo_the_value() -> None:
    secret = "hunter2-secret-token"
    for body in (
        request("execute_command", command=secret + "\x00"),
        request("read_file", path="/" + secret),
        request("search_text", query=secret + "\n"),
    ):
        assert secret not in refusal(body).message


# --------------------------------------------------------------------------------------------
# Headers and identifiers


@pytest.mark.parametrize(
    "header",
    [
        "0",
        "007",
        "01",
        "-5",
        "+5",
        "5.0",
        "1e3",
        " 5",
        "5 ",
        "5\n",
        "\n5",
        "5_0",
        "",
        "abc",
        "300001",
        "999999",
        "1000000",
        "9" * 5000,
        "٣",  # Arabic-Indic three: int() would take it
        "\uff11",  # fullwidth one
        "5\x00",
    ],
)
def test_bad_queue_wait_header_is_refused(header: str) -> None:
    with pytest.raises(ProtocolError) as caught:
        parse_queue_wait_header(header)
    assert caught.value.code == "INVALID_WORKSPACE_QUEUE_WAIT"


@pytest.mark.parametrize(
    ("header", "wait_ms"),
    [(None, 30000), ("1", 1), ("10", 10), ("30000", 30000), ("299999", 299999), ("300000", 300000)],
)
def test_good_queue_wait_header_is_parsed(header: str | None, wait_ms: int) -> None:
    assert parse_queue_wait_header(header) == wait_ms


@pytest.mark.parametrize(
    ("worker_id", "valid"),
    [
        ("w", True),
        ("worker-1.local_A", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        ("-w", False),
        (".w", False),
        ("_w", False),
        ("w:1", False),
        ("w/1", False),
        ("w 1", False),
        ("w\n", False),
        ("wé", False),
        ("w٣", False),
    ],
)
def test_worker_id_pattern_is_ascii_and_anchored(worker_id: str, valid: bool) -> None:
    if valid:
        assert validate_worker_id(worker_id) == worker_id
    else:
        with pytest.raises(ProtocolError) as caught:
            validate_worker_id(worker_id)
        assert caught.value.code == "INVALID_WORKER_ID"


@pytest.mark.parametrize(
    ("request_id", "valid"),
    [
        ("a" * 16, True),
        ("A-b_" * 4, True),
        ("x" * 128, True),
        ("a" * 15, False),
        ("x" * 129, False),
        ("a" * 16 + "\n", False),
        ("a" * 16 + ".", False),
        ("a" * 15 + " ", False),
        ("é" * 16, False),
        ("٣" * 16, False),
        ("", False),
    ],
)
def test_request_id_pattern_is_ascii_and_anchored(request_id: str, valid: bool) -> None:
    if valid:
        assert validate_request_id(request_id) == request_id
    else:
        with pytest.raises(ProtocolError) as caught:
            validate_request_id(request_id)
        assert caught.value.code == "INVALID_REQUEST_ID"


# --------------------------------------------------------------------------------------------
# Isolation keys

OTHER_HEX64 = "f" * 64


def key(**fields: object) -> tuple[str, str]:
    return isolation_key(validate_request(request("list_files", **fields)))


def test_isolation_key_joins_workspace_instance_and_lane() -> None:
    assert key() == (WORKSPACE, "")
    assert key(worktree="lane") == (WORKSPACE, "lane")
    assert key(workspaceInstanceId=HEX64) == (f"{WORKSPACE}\x1f{HEX64}", "")
    assert key(workspaceInstanceId=HEX64, worktree="l") == (f"{WORKSPACE}\x1f{HEX64}", "l")


@pytest.mark.parametrize(
    ("a", "b", "conflict"),
    [
        ({}, {}, True),  # the checkout with itself
        ({"worktree": "a"}, {"worktree": "a"}, True),  # a lane with itself
        ({"worktree": "a"}, {}, True),  # a lane with its checkout
        ({}, {"worktree": "a"}, True),  # the checkout with its lane
        ({"worktree": "a"}, {"worktree": "b"}, False),  # sibling lanes
        ({"workspaceId": "other"}, {}, False),  # different workspaces
        ({"workspaceId": "other", "worktree": "a"}, {"worktree": "a"}, False),
        ({"workspaceInstanceId": HEX64}, {"workspaceInstanceId": HEX64}, True),
        ({"workspaceInstanceId": HEX64}, {"workspaceInstanceId": OTHER_HEX64}, False),
        ({"workspaceInstanceId": HEX64}, {}, False),  # an instance vs the bare workspace
        (
            {"workspaceInstanceId": HEX64, "worktree": "a"},
            {"workspaceInstanceId": HEX64},
            True,
        ),
        (
            {"workspaceInstanceId": HEX64, "worktree": "a"},
            {"workspaceInstanceId": OTHER_HEX64, "worktree": "a"},
            False,
        ),
    ],
)
def test_keys_conflict_truth_table(
    a: dict[str, object], b: dict[str, object], conflict: bool
) -> None:
    key_a, key_b = key(**a), key(**b)
    assert keys_conflict(key_a, key_b) is conflict
    assert keys_conflict(key_b, key_a) is conflict  # symmetric


# --------------------------------------------------------------------------------------------
# Worker error answers


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("NOT_FOUND", 422),
        ("INVALID_PATH", 422),
        ("INVALID_REQUEST", 422),
        ("READ_LIMIT_EXCEEDED", 422),
        ("WRITE_DISABLED", 403),
        ("COMMAND_DISABLED", 403),
        ("EDIT_CONFLICT", 409),
        ("FILE_EXISTS", 409),
        ("WRITE_LIMIT_EXCEEDED", 413),
        ("WORKER_MISMATCH", 409),
        ("EDIT_NOT_STARTED", 503),
        ("COMMAND_UNAVAILABLE", 503),
        ("SEARCH_TOOL_UNAVAILABLE", 503),
        ("COMMAND_TIMEOUT", 504),
        ("GIT_TIMEOUT", 504),
        ("_UNAVAILABLE", None),
        ("UNAVAILABLE", None),
        ("command_UNAVAILABLE", None),
        ("COMMAND_UNAVAILABLE\n", None),
        ("COMMAND-TIMEOUT", None),
        ("TIMEOUT", None),
        ("TEAPOT", None),
        ("", None),
        # The API's own codes: a worker speaking them could make a client resend a call that ran.
        ("WORKSPACE_QUEUE_TIMEOUT", None),
        ("WORKER_OFFLINE", None),
        ("RESULT_INVALID", None),
    ],
)
def test_worker_error_status_maps_known_codes_only(code: str, status: int | None) -> None:
    assert worker_error_status(code) == status


def test_worker_error_table_matches_the_contract() -> None:
    assert len(WORKER_ERROR_STATUS) == 11
    assert set(WORKER_ERROR_STATUS.values()) == {403, 409, 413, 422, 503}


def test_valid_worker_error_is_unpacked() -> None:
    assert validate_error_result({"error": "no such file", "code": "NOT_FOUND"}) == (
        422,
        "NOT_FOUND",
        "no such file",
    )
    assert validate_error_result({"code": "COMMAND_TIMEOUT", "error": "x" * 4096})[0] == 504


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        "NOT_FOUND",
        {"error": "x"},
        {"code": "NOT_FOUND"},
        {"error": "x", "code": "NOT_FOUND", "detail": "extra"},
        {"error": "x", "code": "TEAPOT"},
        {"error": "x", "code": "WORKSPACE_QUEUE_TIMEOUT"},
        {"error": "x", "code": None},
        {"error": "x", "code": 404},
        {"error": None, "code": "NOT_FOUND"},
        {"error": 5, "code": "NOT_FOUND"},
        {"error": "x" * 4097, "code": "NOT_FOUND"},
        {"error": SURROGATE, "code": "NOT_FOUND"},
    ],
)
def test_malformed_worker_error_is_result_invalid(body: object) -> None:
    with pytest.raises(ProtocolError) as caught:
        validate_error_result(body)
    assert caught.value.code == "RESULT_INVALID"


# --------------------------------------------------------------------------------------------
# Results: one valid pair per operation, then hostile variants of it.

DROP = object()


def common(operation: str) -> dict[str, object]:
    return {"protocolVersion": 1, "operation": operation, "workspaceId": WORKSPACE}


PAIRS: dict[str, tuple[dict[str, Any], dict[str, object]]] = {
    "read_file": (
        request("read_file", path="src/a.py", startLine=3, maxLines=2),
        {
            "path": "src/a.py",
            "content": "c\nd",
            "startLine": 3,
            "endLine": 4,
            "truncated": True,
            "nextStartLine": 5,
        },
    ),
    "list_files": (
        request("list_files", path="src", afterPath="src/a", maxResults=3),
        {"paths": ["src/b", "src/c/d", "src/c0"], "truncated": True, "nextAfterPath": "src/c0"},
    ),
    "search_text": (
        request("search_text", query="x", path="src", maxResults=2),
        {
            "matches": [
                {"path": "src/a", "line": 1, "column": 1, "text": "x"},
                {"path": "src/b/c", "line": 7, "column": 3, "text": "  x"},
            ],
            "truncated": True,
        },
    ),
    "write_file": (
        request("write_file", path="a.txt", content="héllo"),
        {"path": "a.txt", "created": True, "bytesWritten": 6},
    ),
    "preview_edit": (
        request("preview_edit", path="a.txt", edits=[{"oldText": "a", "newText": "b"}]),
        {
            "path": "a.txt",
            "content": "b\n",
            "hasUtf8Bom": False,
            "baseSha256": HEX64,
            "replacements": 1,
            "bytesWritten": 2,
        },
    ),
    "edit_file": (
        request(
            "edit_file",
            path="a.txt",
            edits=[{"oldText": "a", "newText": "b"}, {"oldText": "c", "newText": "d"}],
        ),
        {"path": "a.txt", "replacements": 2, "bytesWritten": 4},
    ),
    "execute_command": (
        request("execute_command", command="ls", maxOutputBytes=10),
        {"exitCode": 0, "stdout": "a\n", "stderr": "", "truncated": False, "timedOut": False},
    ),
}


def check_result(operation: str, /, **changes: object) -> None:
    """Validate the operation's sample result with some fields changed (DROP removes one)."""
    body, fields = PAIRS[operation]
    result: dict[str, object] = {**common(operation), **fields}
    for name, value in changes.items():
        if value is DROP:
            result.pop(name, None)
        else:
            result[name] = value
    validate_result(validate_request(body), result)


def assert_result_invalid(operation: str, /, **changes: object) -> None:
    with pytest.raises(ProtocolError) as caught:
        check_result(operation, **changes)
    assert caught.value.code == "RESULT_INVALID"


@pytest.mark.parametrize("operation", sorted(PAIRS))
def test_a_valid_result_passes(operation: str) -> None:
    check_result(operation)


@pytest.mark.parametrize("operation", sorted(PAIRS))
@pytest.mark.parametrize(
    "changes",
    [
        {"hostPath": "/srv/repo"},
        {"protocolVersion": 2},
        {"protocolVersion": True},
        {"protocolVersion": DROP},
        {"workspaceId": "other"},
        {"workspaceId": DROP},
        {"operation": "delete_file"},
        {"operation": DROP},
    ],
)
def test_common_result_keys_must_match_the_request(
    operation: str, changes: dict[str, object]
) -> None:
    assert_result_invalid(operation, **changes)


@pytest.mark.parametrize("operation", sorted(PAIRS))
def test_result_of_another_operation_is_refused(operation: str) -> None:
    other = "list_files" if operation != "list_files" else "read_file"
    assert_result_invalid(operation, operation=other)


@pytest.mark.parametrize(
    ("operation", "field"),
    [(operation, field) for operation, (_, fields) in PAIRS.items() for field in fields],
)
def test_dropping_any_field_of_a_valid_result_breaks_it(operation: str, field: str) -> None:
    # The samples carry only required fields, plus nextStartLine / nextAfterPath on truncated
    # pages, where they are required too.
    assert_result_invalid(operation, **{field: DROP})


@pytest.mark.parametrize("result", [None, [], "ok", 200])
def test_a_result_that_is_not_an_object_is_refused(result: object) -> None:
    with pytest.raises(ProtocolError) as caught:
        validate_result(validate_request(request("list_files")), result)
    assert caught.value.code == "RESULT_INVALID"


@pytest.mark.parametrize("operation", ["read_file", "write_file", "preview_edit", "edit_file"])
@pytest.mark.parametrize(
    "path", ["/etc/passwd", "/srv/repo/a.txt", "../a.txt", "src/../a.txt", "a\\b", "a\x00", ""]
)
def test_result_path_must_be_the_requested_safe_path(operation: str, path: str) -> None:
    assert_result_invalid(operation, path=path)


@pytest.mark.parametrize(
    "changes",
    [
        {"path": "src/b.py"},
        {"startLine": 4},
        {"startLine": True},
        {"endLine": 5},  # past startLine + maxLines - 1
        {"endLine": 1, "truncated": False, "nextStartLine": DROP},  # before startLine - 1
        {"endLine": 4.0},
        {"endLine": True},
        {"content": "c\nd\ne"},  # three lines in a two-line window
        # Lines keep no terminator: "c\nd\n" splits into three pieces, which LibreChat refuses.
        {"content": "c\nd\n"},
        {"content": "c\r\nd\r\n"},
        {"content": "c"},  # one line where startLine..endLine names two
        {"content": "", "truncated": False, "nextStartLine": DROP},  # empty for two lines
        # 1 Mi replacement characters are 3 MiB of UTF-8: more than LibreChat reads.
        {"content": "\ufffd" * (READ_MAX_BYTES - 2) + "\nd"},
        {"content": 5},
        {"content": "x" * (READ_MAX_BYTES + 1)},
        {"content": SURROGATE},
        {"truncated": "yes"},
        {"truncated": 1},
        {"nextStartLine": DROP},
        {"nextStartLine": 6},
        {"nextStartLine": True},
        {"truncated": False},  # nextStartLine without truncation
        # A truncated page without a single line would never make progress.
        {"endLine": 2, "content": "", "nextStartLine": 3},
    ],
)
def test_hostile_read_file_result_is_refused(changes: dict[str, object]) -> None:
    assert_result_invalid("read_file", **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"endLine": 3, "content": "c", "truncated": False, "nextStartLine": DROP},
        {"endLine": 2, "content": "", "truncated": False, "nextStartLine": DROP},  # past EOF
        {"endLine": 4, "content": "c\r\nd\r"},  # a "\r" before the "\n" stays in the line
        {"endLine": 3, "content": "", "nextStartLine": 4},  # one empty line, more to come
        {"endLine": 4, "content": "c\rstill c\nd"},  # "\r" alone does not end a line here
        {"content": "x" * (READ_MAX_BYTES - 2) + "\nd"},
        {"content": "\ufffd" * ((READ_MAX_BYTES - 2) // 3) + "\nd"},
    ],
)
def test_legitimate_read_file_results_pass(changes: dict[str, object]) -> None:
    check_result("read_file", **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"paths": ["src/c/d", "src/b", "src/c0"]},  # unsorted
        {"paths": ["src/b", "src/b", "src/c0"]},  # duplicate
        {"paths": ["other/x"], "nextAfterPath": "other/x"},  # outside the request path
        {"paths": ["srcx"], "nextAfterPath": "srcx"},  # shares a prefix, not a directory
        {"paths": ["src/a"], "nextAfterPath": "src/a"},  # equal to afterPath
        {"paths": ["src/0"], "nextAfterPath": "src/0"},  # before afterPath
        {"paths": ["/src/b"], "nextAfterPath": "/src/b"},
        {"paths": ["src/b\\c"], "nextAfterPath": "src/b\\c"},
        {"paths": ["src/b/../../x"], "nextAfterPath": "src/b/../../x"},
        {"paths": ["src/b\x00"], "nextAfterPath": "src/b\x00"},
        {"paths": ["src/b/"], "nextAfterPath": "src/b/"},
        {"paths": [""], "nextAfterPath": "src/b"},
        {"paths": ["src/b", 5]},
        {"paths": "src/b"},
        {"paths": ["src/b", "src/c", "src/d", "src/e"], "nextAfterPath": "src/e"},  # > maxResults
        {"nextAfterPath": "src/b"},
        {"nextAfterPath": DROP},
        {"truncated": False},  # nextAfterPath without truncation
        {"paths": []},  # truncated but empty: no progress possible
        {"truncated": 0, "nextAfterPath": DROP},
    ],
)
def test_hostile_list_files_result_is_refused(changes: dict[str, object]) -> None:
    assert_result_invalid("list_files", **changes)


def test_list_files_accepts_the_requested_path_itself_and_an_empty_last_page() -> None:
    check_result("list_files", paths=[], truncated=False, nextAfterPath=DROP)
    file_itself = validate_request(request("list_files", path="src/a.py"))
    validate_result(
        file_itself, {**common("list_files"), "paths": ["src/a.py"], "truncated": False}
    )
    root = validate_request(request("list_files"))
    validate_result(
        root, {**common("list_files"), "paths": ["a", "b/c", "src"], "truncated": False}
    )


def match(**changes: object) -> dict[str, object]:
    return {"path": "src/a", "line": 1, "column": 1, "text": "x", **changes}


@pytest.mark.parametrize(
    "matches",
    [
        [match(extra=True)],
        [match(path="other/a")],
        [match(path="srcx/a")],
        [match(path="/src/a")],
        [match(path="src/../a")],
        [match(path="")],
        [match(line=0)],
        [match(line=True)],
        [match(column=0)],
        [match(column=1.0)],
        [match(text="x" * (MATCH_TEXT_MAX_CHARS + 1))],
        # An emoji is two UTF-16 units for LibreChat: 1001 of them are 2002 units.
        [match(text="\U0001f600" * (MATCH_TEXT_MAX_CHARS // 2 + 1))],
        [match(text=None)],
        [{"path": "src/a", "line": 1, "column": 1}],
        [match(), match(), match()],  # more than maxResults
        ["src/a:1:x"],
        match(),
    ],
)
def test_hostile_search_text_result_is_refused(matches: object) -> None:
    assert_result_invalid("search_text", matches=matches)


def test_search_text_match_text_may_reach_its_bound() -> None:
    check_result("search_text", matches=[match(text="é" * MATCH_TEXT_MAX_CHARS)], truncated=False)


@pytest.mark.parametrize(
    "changes",
    [
        {"bytesWritten": 5},  # characters, not bytes
        {"bytesWritten": 7},
        {"bytesWritten": True},
        {"bytesWritten": 6.0},
        {"created": False},  # overwrite was not allowed, so the file must be new
        {"created": 1},
        {"path": "b.txt"},
    ],
)
def test_hostile_write_file_result_is_refused(changes: dict[str, object]) -> None:
    assert_result_invalid("write_file", **changes)


def test_write_file_may_report_an_overwrite_when_allowed() -> None:
    body = request("write_file", path="a.txt", content="", overwrite=True)
    result = {**common("write_file"), "path": "a.txt", "created": False, "bytesWritten": 0}
    validate_result(validate_request(body), result)


@pytest.mark.parametrize(
    "changes",
    [
        {"baseSha256": HEX64.upper()},
        {"baseSha256": HEX64[:63]},
        {"replacements": 0},
        {"replacements": 2},  # one single edit replaces exactly one occurrence
        {"replacements": True},
        {"hasUtf8Bom": 0},
        {"bytesWritten": -1},
        {"content": None},
        {"content": SURROGATE},
    ],
)
def test_hostile_preview_edit_result_is_refused(changes: dict[str, object]) -> None:
    assert_result_invalid("preview_edit", **changes)


def test_replace_all_counts_occurrences_in_matches_not_in_replacements() -> None:
    edits = [{"oldText": "a", "newText": "b", "replaceAll": True}]
    body = validate_request(request("edit_file", path="a.txt", edits=edits))
    matches = [{"strategy": "exact", "occurrences": 7}]
    result = {
        **common("edit_file"),
        "path": "a.txt",
        "replacements": 1,
        "bytesWritten": 9,
        "matches": matches,
    }
    validate_result(body, result)
    for replacements in (0, 7):
        with pytest.raises(ProtocolError):
            validate_result(body, {**result, "replacements": replacements})


@pytest.mark.parametrize(
    "changes",
    [
        {"replacements": 1},  # two edits
        {"replacements": 3},
        {"bytesWritten": 1.0},
        {"bytesWritten": -1},
        {"content": "b\n"},  # edit_file does not return content
    ],
)
def test_hostile_edit_file_result_is_refused(changes: dict[str, object]) -> None:
    assert_result_invalid("edit_file", **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"stdout": "x" * 11},  # maxOutputBytes is 10
        {"stderr": "x" * 11},
        # One budget for both streams, in UTF-8 bytes (LibreChat's rule).
        {"stdout": "x" * 6, "stderr": "y" * 5},
        {"stdout": "é" * 6},
        {"stdout": "x" * (MIB + 1)},
        {"stdout": SURROGATE},
        {"stdout": None},
        {"exitCode": None},  # neither a signal nor a timeout explains it
        {"exitCode": "0"},
        {"exitCode": True},
        {"exitCode": 0.0},
        {"signal": "KILL"},
        {"signal": "SIGkill"},
        {"signal": "SIG"},
        {"signal": "SIGKILL\n"},
        {"signal": None},
        {"timedOut": 0},
        {"truncated": None},
        {"cwd": ""},
    ],
)
def test_hostile_execute_command_result_is_refused(changes: dict[str, object]) -> None:
    assert_result_invalid("execute_command", **changes)


@pytest.mark.parametrize(
    "changes",
    [
        {"stdout": "é" * 5, "truncated": True},  # 10 bytes of UTF-8
        {"stdout": "", "stderr": "x" * 10},
        {"stdout": "x" * 4, "stderr": "y" * 6},
        {"exitCode": None, "signal": "SIGKILL"},
        {"exitCode": None, "timedOut": True},
        {"exitCode": 137, "signal": "SIGKILL"},
        {"exitCode": -9},
        {"exitCode": 1, "timedOut": True},
    ],
)
def test_legitimate_execute_command_results_pass(changes: dict[str, object]) -> None:
    check_result("execute_command", **changes)
