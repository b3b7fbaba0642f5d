"""Argument checks shared by the op handlers: every value from a socket is hostile until checked."""

from __future__ import annotations

from typing import Any

from gpu_worker.protocol import ErrorCode, ProtocolError


def bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def get_int(args: dict[str, Any], key: str, lo: int = 0, hi: int = 2**63 - 1, default: int | None = None) -> int:
    value = args.get(key, default)
    if not is_int(value) or not lo <= value <= hi:
        raise bad(f"{key} must be an integer in [{lo}, {hi}]")
    return value


def get_str(args: dict[str, Any], key: str, max_len: int, default: str | None = None) -> str:
    value = args.get(key, default)
    if not isinstance(value, str) or len(value) > max_len:
        raise bad(f"{key} must be a string of at most {max_len} characters")
    return value


def get_bool(args: dict[str, Any], key: str, default: bool) -> bool:
    value = args.get(key, default)
    if not isinstance(value, bool):
        raise bad(f"{key} must be a boolean")
    return value


def token_list(value: object, vocab: int, max_len: int, key: str = "tokens", min_len: int = 1) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not min_len <= len(value) <= max_len:
        raise bad(f"{key} must be a list of {min_len}..{max_len} token ids")
    if not all(is_int(t) and 0 <= t < vocab for t in value):
        raise bad(f"{key} must hold integers in [0, {vocab})")
    return tuple(value)
