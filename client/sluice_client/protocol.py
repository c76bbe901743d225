"""The wire contract's field rules (protocol v1), shared by the client and the Sluice server.

The server imports this module to validate requests before anything is queued and to check
a worker's result before it is forwarded, so client and server can never disagree on a bound.
Pure Python, no dependencies.
"""

from __future__ import annotations

PROTOCOL_VERSION = 1

OPERATIONS = frozenset(
    {"read_file", "list_files", "search_text", "write_file", "preview_edit", "edit_file", "execute_command"}
)
# Operations that may change the workspace; their unknown outcome quarantines the key.
MUTATING_OPERATIONS = frozenset({"write_file", "edit_file", "execute_command"})

MAX_PATH_CHARS = 4096
MAX_QUERY_CHARS = 4096
MAX_WRITE_BYTES = 1024 * 1024
MAX_COMMAND_BYTES = 32 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024
DEFAULT_OUTPUT_BYTES = 256 * 1024
MAX_COMMAND_TIMEOUT_MS = 300_000
DEFAULT_COMMAND_TIMEOUT_MS = 30_000
MAX_QUEUE_WAIT_MS = 300_000
DEFAULT_QUEUE_WAIT_MS = 30_000
# A read_file window whose content would exceed this is refused with READ_LIMIT_EXCEEDED.
READ_MAX_BYTES = 1024 * 1024
# A search match's `text` is its line cut to this many characters.
MATCH_TEXT_MAX_CHARS = 4096
