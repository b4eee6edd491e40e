"""Guest names: the one rule, for every way a name comes in (the CLI, vmgpud's API, the qemu
hook, the OCI runtime).

A guest name becomes part of host paths (the region `/dev/shm/vmgpu-NAME`, the forwarder's log
and statistics files in vmgpud's state directory), a scheduler slot and the ledger's key, so it
is restricted to characters that are safe in all of them: letters, digits, '.', '_' and '-',
not starting with '.' or '-' (no hidden files, no options), at most MAX_LEN characters.
"""

from __future__ import annotations

import re

from vmgpu.errors import InvalidArgument

MAX_LEN = 64
_RULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
RULE_TEXT = f"1 to {MAX_LEN} letters, digits, '.', '_' or '-', not starting with '.' or '-'"


def _shown(name: str) -> str:
    """The name as an error message can show it: quoted, escaped, shortened."""
    text = repr(name[:40])
    return text + (f" (+{len(name) - 40} more characters)" if len(name) > 40 else "")


def check_guest(name: object, what: str = "guest name") -> str:
    """name if it is a valid guest name; InvalidArgument saying why not otherwise."""
    if not isinstance(name, str):
        raise InvalidArgument(f"{what} must be text, not {type(name).__name__}")
    if not name:
        raise InvalidArgument(f"{what} is empty; use {RULE_TEXT}")
    if len(name) > MAX_LEN:
        raise InvalidArgument(f"{what} {_shown(name)} is {len(name)} characters long; use {RULE_TEXT}")
    if not _RULE.fullmatch(name):
        raise InvalidArgument(f"{what} {_shown(name)} is not allowed; use {RULE_TEXT}")
    return name


def is_guest(name: object) -> bool:
    try:
        check_guest(name)
    except InvalidArgument:
        return False
    return True
