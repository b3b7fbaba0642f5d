"""Wire protocol between a LIP (through the `symphony` SDK) and the gpu_worker.

This module is the single source of truth for the syscall protocol (docs/ARCHITECTURE.md §9). It is
imported by the worker's socket server *and* copied verbatim into the sandbox image as part of
the SDK, so it must depend on nothing but the standard library and ``msgpack``.

Transport: a Unix stream socket carrying length-prefixed msgpack frames.

* A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack.
* Request:  ``{"id": int, "op": str, "args": {str: value}}``
* Reply:    ``{"id": int, "ok": value}`` or ``{"id": int, "err": {"code": str, "message": str}}``

Several requests may be in flight on one connection (a LIP with threads); replies carry the
request ``id`` and may arrive in any order. The first request on a connection must be
``hello`` with the session token; anything else before it closes the connection.

Each op's arguments and reply are defined once, as a typed class at the end of this module
(:data:`LIP_OPS`); the worker decodes ``args`` with it and the SDK builds ``args`` from it.

The admin protocol (control plane → worker) uses the same framing on a separate socket that is
never mounted into a sandbox; its ops are :data:`ADMIN_OPS`.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Self, TypedDict, TypeGuard, TypeVar, dataclass_transform

import msgpack

PROTOCOL_VERSION = 1

# --- bounds -------------------------------------------------------------------------------
#: Largest frame either side accepts. A bigger length prefix closes the connection.
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: Most requests one connection may have outstanding; more get ``EBUSY`` replies.
MAX_IN_FLIGHT = 64
#: Most tokens one ``pred`` call may append (longer prompts are split by the SDK).
MAX_PRED_TOKENS = 8192
#: Most tokens one ``pred`` may choose and append in the worker (``steps``); a longer decode
#: is several calls.
MAX_PRED_STEPS = 1024
#: Most token ids a ``pred`` may name as ``stop`` (the ids that end its ``steps`` early).
MAX_STOP_TOKENS = 256
#: Most strings a ``pred`` may name as ``stop_strings`` (text that ends its ``steps`` early), and
#: the longest of them (characters): the worker detokenises the tokens it chooses to look for
#: them, so both bound what each step costs the engine thread.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 128
#: Most token ids of ``stop_context`` (the text a stop string may begin in before the call's own):
#: four per character of the longest stop string, the most a UTF-8 character takes in byte tokens.
MAX_STOP_CONTEXT_TOKENS = 4 * MAX_STOP_STRING_CHARS
#: ``pred``'s ``send_text``: the JSON object each text delta goes out in, at most this many bytes
#: (msgpack), and the held-back text a call goes on from (``send_pending``, characters: a stop
#: string's prefix, or whatever a program held back itself).
MAX_SEND_MESSAGE_BYTES = 1024
MAX_SEND_PENDING_CHARS = 4096
#: Longest string accepted by ``tokenize`` / ``send_to_user`` (characters).
MAX_TEXT_CHARS = 1_000_000
#: Longest KV file name (after the tenant prefix is added by the worker).
MAX_NAME_CHARS = 200
#: Most entries of any one map in a frame (e.g. a ``bias``), checked while decoding.
MAX_MAP_ENTRIES = 4096
#: Most items of any one array in a frame (e.g. ``tokens``, a ``mask`` id list), checked while decoding.
MAX_ARRAY_ITEMS = MAX_PRED_TOKENS * 8
#: Largest frame a session connection may send before ``hello`` succeeded (a hello is tiny).
MAX_HELLO_FRAME_BYTES = 4096
#: Most positions (logits rows) one ``pred`` may ask for.
MAX_POSITIONS = 1024
#: Longest ``sleep`` (seconds); the run's deadline bounds it too.
MAX_SLEEP_S = 3600.0
#: Most handles one ``dist_release`` may name (the SDK sends at most 4096).
MAX_DIST_RELEASE = 65536
#: Most messages ``apply_chat_template`` takes.
MAX_CHAT_MESSAGES = 1000
#: Largest ``k`` of ``dist_topk`` (and at most the vocabulary).
MAX_TOPK = 1024
#: Most bias vectors (``bias_create``) one session may hold at once.
MAX_BIAS_HANDLES = 64
#: Bytes of bias vectors one session may hold at once: each costs ``vocab_size * 4`` (one
#: float32 per token, however few tokens it biases), e.g. 49152 tokens: 192 KiB, 151936: 594 KiB.
MAX_BIAS_BYTES = 32 * 1024 * 1024
#: Largest magnitude of one bias offset (finite: a float32 logit plus it stays a number).
MAX_BIAS_OFFSET = 1e30
#: Largest channel message (``channel_send`` / ``channel_publish``), as compact UTF-8 JSON.
MAX_CHANNEL_MESSAGE_BYTES = 64 * 1024
#: Longest channel name.
MAX_CHANNEL_NAME_CHARS = 128
#: What a channel name is: letters, digits, ``_ . -`` (no separator: a name is local to its run
#: tree, and nothing in it can read as a path to another tree's channel); "." and ".." are not.
CHANNEL_NAME_PATTERN = r"[A-Za-z0-9_.-]{1,128}"

_LEN = struct.Struct(">I")
HEADER_BYTES = _LEN.size


# --- errors -------------------------------------------------------------------------------
class ErrorCode:
    """Error codes carried in ``err.code``; the SDK maps each to an exception class."""

    BAD_FRAME = "EBADFRAME"  # undecodable or wrongly shaped frame
    BAD_ARGS = "EINVAL"  # argument missing, wrong type or out of bounds
    UNKNOWN_OP = "ENOSYS"
    NOT_AUTHENTICATED = "EAUTH"
    PERMISSION = "EPERM"  # handle or name of another session/tenant, host not allowed
    NOT_FOUND = "ENOENT"  # KV file or handle does not exist
    EXISTS = "EEXIST"
    NO_SPACE = "ENOSPC"  # page or byte budget exceeded
    QUOTA = "EDQUOT"  # token/time quota of the session exceeded
    BUSY = "EBUSY"  # too many calls in flight
    TIMEOUT = "ETIMEDOUT"
    IO = "EIO"  # brokered I/O failed
    INTERNAL = "EINTERNAL"  # worker bug; the message is safe to show
    # Channels (gpu_worker/channels.py): each a code of its own so the SDK raises a class a
    # program can catch by name (symphony.ChannelFull, ...).
    CHANNEL_FULL = "ECHANFULL"  # a queue, a subscriber's queue or the tenant's queued bytes at their bound
    MESSAGE_TOO_LARGE = "EMSGSIZE"  # one message over MAX_CHANNEL_MESSAGE_BYTES
    TOO_MANY_CHANNELS = "ECHANLIMIT"  # the tree's channels or the run's subscriptions at their bound
    CHANNEL_CLOSED = "ECHANCLOSED"  # closed channel, ended tree or session, dropped subscription
    CHANNEL_TIMEOUT = "ECHANTIMEDOUT"  # recv's own timeout passed with no message


@dataclass(frozen=True)
class ProtocolError(Exception):
    """An error reply, raised on the worker side and re-raised by clients."""

    code: str
    message: str
    #: Which case of ``code`` this is, where a client must tell them apart (``ErrorReason``).
    reason: str | None = None

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_wire(self) -> dict[str, str]:
        wire = {"code": self.code, "message": self.message}
        if self.reason is not None:
            wire["reason"] = self.reason
        return wire


class ErrorReason:
    """``err.reason``: a case of a code that a program handles apart (the SDK raises a subclass)."""

    #: ENOSPC of the worker's shared device KV pool (the account's bound, or the pool full):
    #: load, not the request, so a retry later may succeed (gpu_worker/kvfs/accounts.py).
    KV_POOL_FULL = "kv_pool_full"
    #: ECHANCLOSED of a channel read that waited while every run that could send on the channel
    #: ended: the reader's children (and theirs), and every other run of its tree
    #: (gpu_worker/ops/channel_senders.py).
    SENDERS_GONE = "senders_gone"


# --- framing ------------------------------------------------------------------------------
def pack(obj: Any) -> bytes:
    """Encode one message as a length-prefixed frame."""
    body = msgpack.packb(obj, use_bin_type=True, default=wire_value)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _LEN.pack(len(body)) + body


#: What decoding may build from one frame: a hostile peer cannot make it allocate more.
_DECODE_LIMITS: dict[str, int] = {
    "max_str_len": MAX_FRAME_BYTES,
    "max_bin_len": MAX_FRAME_BYTES,
    "max_array_len": MAX_ARRAY_ITEMS,
    "max_map_len": MAX_MAP_ENTRIES,
    "max_ext_len": 0,
}
#: msgpack's words for an exceeded limit ("4097 exceeds max_map_len(4096)") -> what a user reads.
_LIMIT_WORDS = {
    "max_map_len": ("a map of {n} entries", "MAX_MAP_ENTRIES", "entries per map (e.g. a bias)"),
    "max_array_len": ("a list of {n} items", "MAX_ARRAY_ITEMS", "items per list (e.g. tokens or a mask)"),
    "max_str_len": ("a string of {n} bytes", "MAX_FRAME_BYTES", "bytes"),
    "max_bin_len": ("bytes of length {n}", "MAX_FRAME_BYTES", "bytes"),
    "max_ext_len": ("an ext value of {n} bytes", "ext types", "bytes (none are allowed)"),
}
_LIMIT_RE = re.compile(r"^(\d+) exceeds (max_\w+_len)\((\d+)\)$")


def _decode_error(exc: Exception) -> ProtocolError:
    """The BAD_FRAME a failed decode answers with, naming the protocol limit it broke."""
    m = _LIMIT_RE.match(str(exc))
    if m is not None and m.group(2) in _LIMIT_WORDS:
        what, name, unit = _LIMIT_WORDS[m.group(2)]
        return ProtocolError(
            ErrorCode.BAD_FRAME,
            f"frame refused: {what.format(n=m.group(1))} exceeds the protocol limit {name} of {m.group(3)} {unit}",
        )
    return ProtocolError(ErrorCode.BAD_FRAME, f"undecodable frame: {type(exc).__name__}")


def unpack_body(body: bytes) -> Any:
    """Decode a frame body with limits that keep a hostile peer from exhausting memory."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=True, **_DECODE_LIMITS)
    except Exception as exc:  # msgpack raises several unrelated types
        raise _decode_error(exc) from None


def request_id_of(body: bytes) -> int | None:
    """The ``id`` of a request frame that :func:`unpack_body` refused, or ``None``.

    A frame over a decode limit is refused as a whole, but its envelope is usually fine: reading
    only the top-level keys (skipping values without building them) finds the id, so the error
    reply goes to the call that sent the frame instead of leaving it waiting for a reply. The
    SDK packs ``id`` first; at most a few keys are looked at.
    """
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=True, max_buffer_size=max(len(body), 1), **_DECODE_LIMITS)
    unpacker.feed(body)
    try:
        for _ in range(min(unpacker.read_map_header(), 8)):
            if unpacker.unpack() == "id":
                req_id = unpacker.unpack()
                return req_id if _valid_id(req_id) else None
            unpacker.skip()
    except Exception:  # not a map, truncated, or a key over the limits: no id to be had
        return None
    return None


def _valid_id(req_id: object) -> TypeGuard[int]:
    return isinstance(req_id, int) and not isinstance(req_id, bool) and 0 <= req_id < 2**63


def frame_length(header: bytes) -> int:
    """Length announced by a 4-byte header; raises on a frame larger than allowed."""
    (length,) = _LEN.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"announced frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return length


def request(req_id: int, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": req_id, "op": op, "args": args or {}}


def ok_reply(req_id: int, value: Any) -> dict[str, Any]:
    """A success reply; a reply :class:`Message` becomes its map (nested ones when packed)."""
    return {"id": req_id, "ok": value.to_wire() if isinstance(value, Message) else value}


def err_reply(req_id: int | None, error: ProtocolError) -> dict[str, Any]:
    return {"id": req_id, "err": error.to_wire()}


def more_reply(req_id: int, value: Any) -> dict[str, Any]:
    """A progress frame of a call still in flight (``pred`` with ``stream``): part of its result
    sent early; the call's own ``ok`` or ``err`` reply still follows and is the whole answer."""
    return {"id": req_id, "more": value.to_wire() if isinstance(value, Message) else value}


def parse_more(msg: Any) -> tuple[int, Any] | None:
    """``(id, value)`` of a progress frame, or ``None`` for any other reply."""
    if isinstance(msg, dict) and "more" in msg and isinstance(msg.get("id"), int):
        return msg["id"], msg["more"]
    return None


def parse_request(msg: Any) -> tuple[int, str, dict[str, Any]]:
    """Validate the envelope of a request; argument shapes are checked per op by the server."""
    if not isinstance(msg, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, "request must be a map")
    req_id = msg.get("id")
    op = msg.get("op")
    args = msg.get("args", {})
    if not _valid_id(req_id):
        raise ProtocolError(ErrorCode.BAD_FRAME, "request id must be a non-negative integer")
    if not isinstance(op, str):
        raise ProtocolError(ErrorCode.BAD_FRAME, "op must be a string")
    if not isinstance(args, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, "args must be a map")
    return req_id, op, args


def parse_reply(msg: Any) -> tuple[int | None, Any, ProtocolError | None]:
    """Split a reply into ``(id, value, error)``; ``error`` is set for an ``err`` reply.

    The id is returned even for errors so a client with several calls in flight can hand the
    error to the caller that is waiting for it.
    """
    if not isinstance(msg, dict) or "id" not in msg:
        raise ProtocolError(ErrorCode.BAD_FRAME, "reply must be a map with an id")
    if "err" in msg:
        err = msg["err"] if isinstance(msg["err"], dict) else {}
        reason = err.get("reason")
        return (
            msg["id"],
            None,
            ProtocolError(
                str(err.get("code", ErrorCode.INTERNAL)),
                str(err.get("message", "")),
                reason[:64] if isinstance(reason, str) else None,
            ),
        )
    return msg["id"], msg.get("ok"), None


# --- typed messages -----------------------------------------------------------------------
# Every op is one class below: its arguments as fields, each with the check a value from the
# socket must pass, and its reply type. The worker decodes a request's ``args`` map with
# ``Args.decode`` before any handler runs (a refused value is EINVAL naming the field); the
# SDK builds the same map with ``Args.to_wire``. ``LIP_OPS`` and ``ADMIN_OPS`` are these
# classes by op name: the one list of ops both sides, the handler tables and the fuzzer use.
#
# Plain classes rather than dataclasses: this module is imported at every sandbox start, and
# generating ~50 dataclasses costs tens of milliseconds there; ``dataclass_transform`` lets a
# type checker read the fields, defaults and keyword constructors the same way.

_MISSING: Any = object()


def _bad(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_ARGS, message)


def _is_int(value: object) -> bool:
    return type(value) is int or (isinstance(value, int) and not isinstance(value, bool))


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Check:
    """How one field's wire value is checked and converted (``decode``) and written (``encode``).

    ``vocab`` is the served model's vocabulary size: token ids are checked against it."""

    __slots__ = ("message",)

    def __init__(self, message: str = "") -> None:
        self.message = message

    def refuse(self, name: str) -> ProtocolError:
        return _bad(self.message.format(name=name))

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        return value

    def encode(self, value: Any) -> Any:
        return value


class Int(Check):
    __slots__ = ("hi", "lo")

    def __init__(self, lo: int = 0, hi: int = 2**63 - 1, message: str = "") -> None:
        super().__init__(message or f"{{name}} must be an integer in [{lo}, {hi}]")
        self.lo, self.hi = lo, hi

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not _is_int(value) or not self.lo <= value <= self.hi:
            raise self.refuse(name)
        return value


#: A worker-side handle (KV file, Dist, grammar, grammar state): a non-negative integer.
HANDLE = Int(0)


class Number(Check):
    """An int or float in ``[lo, hi]`` (``(lo, hi]`` with ``open_lo``)."""

    __slots__ = ("hi", "lo", "open_lo")

    def __init__(self, lo: float, hi: float, open_lo: bool = False, message: str = "") -> None:
        super().__init__(message or f"{{name}} must be a number in {'(' if open_lo else '['}{lo}, {hi}]")
        self.lo, self.hi, self.open_lo = lo, hi, open_lo

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not _is_number(value) or not (self.lo < value if self.open_lo else self.lo <= value) or value > self.hi:
            raise self.refuse(name)
        return value


class Str(Check):
    __slots__ = ("max_len",)

    def __init__(self, max_len: int, message: str = "") -> None:
        super().__init__(message or f"{{name}} must be a string of at most {max_len} characters")
        self.max_len = max_len

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, str) or len(value) > self.max_len:
            raise self.refuse(name)
        return value


class NonEmptyStr(Str):
    __slots__ = ()

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if super().decode(name, value, vocab) == "":
            raise _bad(f"{name} must not be empty")
        return value


class OneOf(Check):
    __slots__ = ("values",)

    def __init__(self, *values: str) -> None:
        super().__init__("{name} must be " + " or ".join(f'"{v}"' for v in values))
        self.values = values

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if value not in self.values or not isinstance(value, str):
            raise self.refuse(name)
        return value


class Bool(Check):
    __slots__ = ()

    def __init__(self, message: str = "{name} must be a boolean") -> None:
        super().__init__(message)

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, bool):
            raise self.refuse(name)
        return value


class Required(Check):
    """Any msgpack value, which must be present (what it may be is checked by the handler)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("{name} is required")


class TokenIds(Check):
    """A list of ``min_len..max_len`` token ids of the served vocabulary, decoded as a tuple."""

    __slots__ = ("max_len", "min_len")

    def __init__(self, max_len: int, min_len: int = 1) -> None:
        super().__init__(f"{{name}} must be a list of {min_len}..{max_len} token ids")
        self.min_len, self.max_len = min_len, max_len

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, list | tuple) or not self.min_len <= len(value) <= self.max_len:
            raise self.refuse(name)
        for t in value:  # ``type(t) is int`` first: this runs per token of every ``pred``
            if not (type(t) is int or _is_int(t)) or not 0 <= t < vocab:
                raise _bad(f"{name} must hold integers in [0, {vocab})")
        return tuple(value)

    def encode(self, value: Any) -> Any:
        return list(value)


class ListOf(Check):
    """A list of at most ``max_len`` items; the handler reads the items."""

    __slots__ = ("max_len",)

    def __init__(self, max_len: int, message: str) -> None:
        super().__init__(message)
        self.max_len = max_len

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, list) or len(value) > self.max_len:
            raise self.refuse(name)
        return value


class StopStrings(Check):
    """``pred``'s ``stop_strings``: 1..``MAX_STOP_STRINGS`` non-empty strings of at most
    ``MAX_STOP_STRING_CHARS`` characters each, decoded as a tuple."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(
            f"{{name}} must be a list of 1..{MAX_STOP_STRINGS} non-empty strings"
            f" of at most {MAX_STOP_STRING_CHARS} characters each"
        )

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_STOP_STRINGS:
            raise self.refuse(name)
        for text in value:
            if not isinstance(text, str) or not 1 <= len(text) <= MAX_STOP_STRING_CHARS:
                raise self.refuse(name)
        return tuple(value)

    def encode(self, value: Any) -> Any:
        return list(value)


class SendMessage(Check):
    """``pred``'s ``send_text``: a JSON object of at most ``MAX_SEND_MESSAGE_BYTES`` (msgpack)
    with string keys, without a ``delta`` key (the worker adds it)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(
            f"{{name}} must be a JSON object of at most {MAX_SEND_MESSAGE_BYTES} bytes"
            ' with string keys and no "delta" key (the worker adds the text as "delta")'
        )

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, dict) or "delta" in value or not all(isinstance(k, str) for k in value):
            raise self.refuse(name)
        try:
            size = len(msgpack.packb(value, use_bin_type=True))
            json.dumps(value, allow_nan=False)  # what the stream's readers parse is JSON
        except (TypeError, ValueError):
            raise self.refuse(name) from None
        if size > MAX_SEND_MESSAGE_BYTES:
            raise self.refuse(name)
        return value


class Positions(Check):
    """``"last"`` or a list of offsets into the call's tokens (checked against their number by
    :meth:`Pred.rows`)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(f"{{name}} must be a list of 1..{MAX_POSITIONS} offsets into tokens")

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if value == "last":
            return None
        if not isinstance(value, list | tuple) or not 1 <= len(value) <= MAX_POSITIONS:
            raise self.refuse(name)
        return tuple(value)

    def encode(self, value: Any) -> Any:
        return list(value)


class Mask(Check):
    """A grammar state handle (an int) or the allowed token ids (decoded as a tuple)."""

    __slots__ = ()

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if _is_int(value):
            return value
        if not isinstance(value, list | tuple) or not value or len(value) > vocab:
            raise _bad("an allowed-token mask must list between 1 and vocab_size token ids")
        for t in value:
            if not _is_int(t) or not 0 <= t < vocab:
                raise _bad("mask token ids must be integers in [0, vocab_size)")
        return tuple(value)

    def encode(self, value: Any) -> Any:
        return value if _is_int(value) else list(value)


class Bias(Check):
    """A sparse ``{token_id: logit offset}``; keys travel as strings (``strict_map_key``)."""

    __slots__ = ()

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, dict) or len(value) > vocab:
            raise _bad("bias must be a map token_id -> offset")
        out: dict[int, float] = {}
        for key, offset in value.items():
            tid = int(key) if isinstance(key, str) and key.lstrip("-").isdigit() else key
            if not _is_int(tid) or not 0 <= tid < vocab:
                raise _bad(f"bias token id out of range: {key!r}")
            if not _is_number(offset) or offset != offset or offset in (float("inf"), float("-inf")):
                raise _bad("bias offsets must be finite numbers")
            out[tid] = float(offset)
        return out

    def encode(self, value: Any) -> Any:
        return {str(int(k)): float(v) for k, v in value.items()}


class DenseBias(Check):
    """One finite offset per vocabulary token: a list of numbers, or float32 little-endian bytes
    (``vocab_size * 4``; what the SDK sends, so a vocabulary past ``MAX_ARRAY_ITEMS`` fits a
    frame), decoded as an ``array("f")``."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(
            "{name} must hold vocab_size finite numbers (a list, or float32 little-endian bytes of vocab_size * 4)"
        )

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if isinstance(value, bytes):
            if len(value) != vocab * 4:
                raise self.refuse(name)
            out = array("f", value)
            if sys.byteorder == "big":
                out.byteswap()
        elif isinstance(value, list) and len(value) == vocab and all(map(_is_number, value)):
            try:
                out = array("f", value)
            except OverflowError:
                raise self.refuse(name) from None
        else:
            raise self.refuse(name)
        if not all(-MAX_BIAS_OFFSET <= v <= MAX_BIAS_OFFSET for v in out):  # NaN fails too
            raise _bad(f"{name} must be finite numbers of magnitude at most {MAX_BIAS_OFFSET:g}")
        return out

    def encode(self, value: Any) -> Any:
        if isinstance(value, bytes):
            return value
        out = value if isinstance(value, array) else array("f", [float(v) for v in value])
        if sys.byteorder == "big":
            out = array("f", out)
            out.byteswap()
        return out.tobytes()


class ChatMessages(Check):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(f"{{name}} must be a list of {{{{role, content}}}} maps (1..{MAX_CHAT_MESSAGES})")

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if not isinstance(value, list) or not 1 <= len(value) <= MAX_CHAT_MESSAGES:
            raise self.refuse(name)
        for m in value:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise _bad("each message must be a map with string role and content")
        return value


class Then(Check):
    """The choice fused into a ``pred``: ``"argmax"``, ``{"argmax": {...}}`` or ``{"sample": {...}}``,
    decoded as an :class:`Argmax` or :class:`Sample`."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__('{name} must be "argmax", {{"argmax": {{...}}}} or {{"sample": {{...}}}}')

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        if value == "argmax" or value == _PLAIN_ARGMAX_WIRE:  # greedy decoding's every token
            return _PLAIN_ARGMAX
        if not isinstance(value, dict) or len(value) != 1:
            raise self.refuse(name)
        ((kind, params),) = value.items()
        cls = _CHOICES.get(kind) if isinstance(kind, str) else None
        if cls is None or not isinstance(params, dict):
            raise self.refuse(name)
        return cls.decode(params, vocab)

    def encode(self, value: Any) -> Any:
        return {value.KIND: value.to_wire()}


class TraceContext(NamedTuple):
    """A W3C trace context (https://www.w3.org/TR/trace-context/): the trace a run belongs to
    and the span the worker's work for it hangs from (the run's span, as the control plane
    exports it). On the wire it is the ``traceparent`` header's text."""

    trace_id: int
    span_id: int
    flags: int = 1

    def header(self) -> str:
        return f"00-{self.trace_id:032x}-{self.span_id:016x}-{self.flags:02x}"


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class TraceParent(Check):
    """A version-00 W3C ``traceparent`` (lower-case hex, ids not all zero), decoded as a
    :class:`TraceContext`."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("{name} must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>")

    def decode(self, name: str, value: Any, vocab: int) -> Any:
        match = _TRACEPARENT.fullmatch(value) if isinstance(value, str) else None
        if match is None or int(match[1], 16) == 0 or int(match[2], 16) == 0:
            raise self.refuse(name)
        return TraceContext(int(match[1], 16), int(match[2], 16), int(match[3], 16))

    def encode(self, value: Any) -> Any:
        return value.header()


class Field:
    """One declared field: its wire name, check and default (``_MISSING``: required)."""

    __slots__ = ("check", "default", "name")

    def __init__(self, check: Check, default: Any = _MISSING) -> None:
        self.check = check
        self.default = default
        self.name = ""


def arg(check: Check | None = None, *, default: Any = _MISSING) -> Any:
    """Declare a message field: ``kv: int = arg(HANDLE)``; ``name: str | None = arg(Str(9), default=None)``."""
    return Field(check or Check(), default)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(arg,))
class Message:
    """A typed map on the wire: fields declared with :func:`arg` (or a plain default), in order."""

    FIELDS: ClassVar[tuple[Field, ...]] = ()
    #: Per field, precomputed for the per-call paths: (name, check, its decode or None, default)
    #: and (name, its encode or None, default).
    _DECODE: ClassVar[tuple[tuple[str, Check, Any, Any], ...]] = ()
    _ENCODE: ClassVar[tuple[tuple[str, Any, Any], ...]] = ()
    _CROSS_CHECKED: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = {f.name: f for f in cls.FIELDS}
        # Not ``inspect.get_annotations``: importing ``inspect`` would cost every sandbox start.
        for name in cls.__dict__.get("__annotations__", {}):  # noqa: RUF063
            if name.isupper() or name.startswith("_"):
                continue  # class constants
            declared = cls.__dict__.get(name, _MISSING)
            if not isinstance(declared, Field):
                declared = Field(Check(), declared)
            declared.name = name
            fields[name] = declared
            if name in cls.__dict__:
                delattr(cls, name)  # instances hold the values
        cls.FIELDS = tuple(fields.values())
        plain_decode, plain_encode = Check.decode, Check.encode
        cls._DECODE = tuple(
            (f.name, f.check, None if type(f.check).decode is plain_decode else f.check.decode, f.default)
            for f in cls.FIELDS
        )
        cls._ENCODE = tuple(
            (f.name, None if type(f.check).encode is plain_encode else f.check.encode, f.default) for f in cls.FIELDS
        )
        cls._CROSS_CHECKED = cls._validate is not Message._validate

    def __init__(self, **values: Any) -> None:
        own = self.__dict__
        for f in self.FIELDS:
            value = values.pop(f.name, f.default)
            if value is _MISSING:
                raise TypeError(f"{type(self).__name__} needs {f.name}")
            own[f.name] = value
        if values:
            raise TypeError(f"{type(self).__name__} has no field {', '.join(values)}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((type(self), repr(self)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"

    @classmethod
    def decode(cls, args: dict[str, Any], vocab: int = 0) -> Self:
        """Check and convert a map from the socket (every value is hostile until checked): a
        missing or refused field is EINVAL naming it. Keys no field declares are ignored."""
        out = object.__new__(cls)
        values = out.__dict__
        for name, check, decode, default in cls._DECODE:
            value = args.get(name, _MISSING)
            if value is _MISSING or (value is None and default is None):
                if default is _MISSING:
                    raise check.refuse(name)
                values[name] = default
            elif decode is None:
                values[name] = value
            else:
                values[name] = decode(name, value, vocab)
        if cls._CROSS_CHECKED:
            out._validate()
        return out

    def _validate(self) -> None:
        """Checks across fields, after each field passed its own (``decode``)."""

    def to_wire(self) -> dict[str, Any]:
        """The map sent on the wire; fields at their default are left out (the peer fills them in)."""
        values = self.__dict__
        out = {}
        for name, encode, default in self._ENCODE:
            value = values[name]
            if value is not default:
                out[name] = value if encode is None else encode(value)
        return out

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Self:
        """A reply map read back without checks (it comes from the worker)."""
        out = object.__new__(cls)
        for f in cls.FIELDS:
            out.__dict__[f.name] = value.get(f.name, None if f.default is _MISSING else f.default)
        return out


class Reply(Message):
    """A reply map: every field is sent (``to_wire`` keeps defaults)."""

    def to_wire(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Args(Message):
    """The arguments of one op; ``OP`` is its name and ``REPLY`` the type of its ``ok`` value."""

    OP: ClassVar[str] = ""
    REPLY: ClassVar[Any] = None


#: LIP-facing ops (session socket) and control-plane ops (admin socket), by name.
LIP_OPS: dict[str, type[Args]] = {}
ADMIN_OPS: dict[str, type[Args]] = {}

_A = TypeVar("_A", bound=type[Args])


def _op(table: dict[str, type[Args]], name: str, reply: Any) -> Callable[[_A], _A]:
    def register(cls: _A) -> _A:
        cls.OP, cls.REPLY = name, reply
        table[name] = cls
        return cls

    return register


def lip_op(name: str, reply: Any = None) -> Callable[[_A], _A]:
    return _op(LIP_OPS, name, reply)


def admin_op(name: str, reply: Any = None) -> Callable[[_A], _A]:
    return _op(ADMIN_OPS, name, reply)


def wire_value(value: Any) -> Any:
    """msgpack's ``default``: a :class:`Message` anywhere in a reply becomes its map."""
    if isinstance(value, Message):
        return value.to_wire()
    raise TypeError(f"cannot encode {type(value).__name__}")


# --- replies ------------------------------------------------------------------------------
class HelloReply(Reply):
    session_id: str
    tenant: str
    run_id: str
    vocab_size: int
    eos_token_ids: list[int]
    block_size: int
    protocol_version: int
    #: What one connection may have in flight before EBUSY (the SDK queues calls beyond it).
    max_in_flight: int = MAX_IN_FLIGHT


class KvRef(Reply):
    kv: int


class DistRefs(Reply):
    """``pred`` without ``then``: one Dist handle per requested position."""

    dists: list[int]


class ChosenTokens(Reply):
    """``pred`` with ``then``: the token chosen at each requested position. ``stop_string``: the
    one of the call's ``stop_strings`` its text came to contain (the call ended at that token),
    left out of the map when none did (as in every progress frame and plain ``pred_token``);
    ``sent_text`` and ``unsent_text`` only for a call with ``send_text``."""

    tokens: list[int]
    stop_string: str | None = None
    #: ``send_text``: what the worker sent, and what it held back at the end (None without it).
    sent_text: str | None = None
    unsent_text: str | None = None

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"tokens": self.tokens}  # every generated token's reply: no unused key
        if self.stop_string is not None:
            out["stop_string"] = self.stop_string
        if self.sent_text is not None:
            out["sent_text"], out["unsent_text"] = self.sent_text, self.unsent_text
        return out


class TopKReply(Reply):
    ids: list[int]
    logprobs: list[float]


class GrammarRef(Reply):
    grammar: int


class MaskRef(Reply):
    mask: int


class BiasRef(Reply):
    bias: int


class Advanced(Reply):
    accepted: bool
    finished: bool


class VocabInfoReply(Reply):
    vocab_size: int
    eos_token_ids: list[int]
    bos_token_id: int | None
    chat_template: str | None


class HttpReply(Reply):
    status: int
    headers: dict[str, str]
    body: bytes


class SessionCreated(Reply):
    session_id: str
    socket_path: str
    token: str


class SessionEnded(Reply):
    usage: dict[str, Any]
    result: Any
    error: str | None
    #: Where the session's time went (``gpu_worker.tracing.WireTrace``): bounded spans; ``None``
    #: from a worker that records none (no shared mutable default).
    trace: dict[str, Any] | None = None


class TenantDeleted(Reply):
    deleted: list[str]


class ChannelMessage(Reply):
    """One message read from a channel or a subscription: its value and the run that sent it."""

    data: Any
    sender: str


class SubscriptionRef(Reply):
    sub: int


# --- LIP ops ------------------------------------------------------------------------------
@lip_op("hello", HelloReply)
class Hello(Args):
    token: str = arg(Str(256))


@lip_op("vocab_info", VocabInfoReply)
class VocabInfo(Args):
    pass


@lip_op("finish")
class Finish(Args):
    """The run's return value (or error text), sent once by the runner."""

    result: Any = None
    error: Any = None


@lip_op("send_to_user")
class SendToUser(Args):
    """A string (a ``token`` event) or JSON data (a ``message`` event) for the run's client."""

    data: Any = arg(Required())


@lip_op("tokenize", list[int])
class Tokenize(Args):
    text: str = arg(Str(MAX_TEXT_CHARS))
    add_special_tokens: bool = arg(Bool(), default=False)


@lip_op("detokenize", str)
class Detokenize(Args):
    ids: tuple[int, ...] = arg(TokenIds(MAX_TEXT_CHARS, min_len=0))
    skip_special_tokens: bool = arg(Bool(), default=False)


@lip_op("apply_chat_template", list[int])
class ApplyChatTemplate(Args):
    messages: list[dict[str, str]] = arg(ChatMessages())
    add_generation_prompt: bool = arg(Bool(), default=True)


_NAME = Str(MAX_NAME_CHARS)


@lip_op("kv_create", KvRef)
class KvCreate(Args):
    """A new KV file: anonymous (closed with its last handle) or named (persistent).
    ``cache=False`` keeps it out of the tenant's automatic prefix cache (gpu_worker/kvfs/prefix.py);
    ``durable=False`` is not written through to the store at every close (``KVFS.write_idle``)."""

    name: str | None = arg(_NAME, default=None)
    cache: bool = arg(Bool(), default=True)
    durable: bool = arg(Bool(), default=True)


@lip_op("kv_open", KvRef)
class KvOpen(Args):
    name: str = arg(_NAME)
    mode: str = arg(OneOf("r", "w"), default="r")


@lip_op("kv_fork", KvRef)
class KvFork(Args):
    kv: int = arg(HANDLE)


@lip_op("kv_close")
class KvClose(Args):
    kv: int = arg(HANDLE)


@lip_op("kv_remove")
class KvRemove(Args):
    name: str = arg(_NAME)


@lip_op("kv_len", int)
class KvLen(Args):
    kv: int = arg(HANDLE)


@lip_op("kv_tokens", list[int])
class KvTokens(Args):
    kv: int = arg(HANDLE)


@lip_op("kv_truncate")
class KvTruncate(Args):
    kv: int = arg(HANDLE)
    n: int = arg(Int(0))


@lip_op("kv_extract", KvRef)
class KvExtract(Args):
    kv: int = arg(HANDLE)
    start: int = arg(Int(0))
    end: int = arg(Int(0))


@lip_op("kv_merge", KvRef)
class KvMerge(Args):
    a: int = arg(HANDLE)
    b: int = arg(HANDLE)


@lip_op("kv_pin")
class KvPin(Args):
    name: str = arg(_NAME)
    pinned: bool = arg(Bool(), default=True)


class Argmax(Args):
    """How a token is chosen from a logits row: the most likely one allowed by ``mask`` after
    ``bias`` (sparse) and ``bias_ref`` (a ``bias_create`` vector; both may be given, they add);
    ``advance`` moves the grammar state given as ``mask`` by the chosen token."""

    KIND: ClassVar[str] = "argmax"

    mask: int | tuple[int, ...] | None = arg(Mask(), default=None)
    bias: dict[int, float] | None = arg(Bias(), default=None)
    bias_ref: int | None = arg(Int(0, message="{name} must be an integer bias handle"), default=None)
    advance: bool = arg(Bool("{name} must be true or false"), default=False)

    def _validate(self) -> None:
        if self.advance and not _is_int(self.mask):
            raise _bad("advance needs a grammar state handle as mask")


class Sample(Argmax):
    """A sampled token (temperature 0: greedy; ``seed``: reproducible)."""

    KIND: ClassVar[str] = "sample"

    temperature: float = arg(Number(0, 100), default=1.0)
    top_p: float = arg(Number(0, 1, open_lo=True), default=1.0)
    top_k: int = arg(Int(0, message="{name} must be a non-negative integer"), default=0)
    seed: int | None = arg(Int(0, 2**63 - 1, message="{name} must be a non-negative integer"), default=None)


_CHOICES: dict[str, type[Argmax]] = {"argmax": Argmax, "sample": Sample}
_PLAIN_ARGMAX = Argmax()
_PLAIN_ARGMAX_WIRE: dict[str, dict[str, Any]] = {"argmax": {}}


@lip_op("pred", DistRefs | ChosenTokens)
class Pred(Args):
    """Append ``tokens`` to KV file ``kv`` in one forward; reply with Dist handles over the logits
    at ``positions`` (offsets into ``tokens``, negative from the end; default the last), or with
    the token ``then`` chooses at each.

    ``steps`` > 1 (with ``then``, at the last position only) decodes in the worker: each chosen
    token is appended and the next one chosen, up to ``steps`` tokens, ending early at a token of
    ``stop``. The reply lists the chosen tokens; like a one-step call's, the last one is not in
    the file yet (the caller appends it with its next call). With a ``seed``, step ``j`` samples
    with ``seed + j``; a grammar mask must be ``advance``d (the worker moves it token by token);
    ``bias`` applies to every step. A step that cannot run (the file at the model's context
    length, a KV limit) ends the call with the tokens chosen so far, and the next call meets the
    limit. ``stream``: each chosen token but the last is also sent at once in a progress frame
    (:func:`more_reply`) so the caller can show it before the call ends.

    ``stop_strings`` (with ``then``) ends the call, too, at the token whose text makes the text
    the call chose contain one of them: the worker detokenises its chosen tokens as it goes, so a
    program watching for text needs no round trip per token. That token is returned (the text is
    the program's to cut) and the reply's ``stop_string`` names the string. ``stop_context``: the
    tokens whose text comes before the call's own (the end of what the program already
    generated and looked at): a string may begin in their text, and one wholly in it is not looked
    for. The text is ``detokenize`` of the tokens (special tokens kept).

    ``send_text`` (with ``then``): the worker sends the text of the tokens it chooses to the run's
    user as they are chosen, each token's new text as ``{**send_text, "delta": text}`` (what
    ``send_to_user`` would send, metered and bounded alike), holding back what one of
    ``stop_strings`` could still grow from and an incomplete character, and nothing from the
    token whose text completes a string on, nor a ``stop`` token's text. ``send_pending``: text
    before the call's not sent yet (it goes out first, held back alike); ``send_context``: the
    last tokens of ``stop_context`` whose text was not sent either (it goes out after
    ``send_pending``). The reply's ``sent_text`` is what went out, ``unsent_text`` what was held
    back at the end (gpu_worker/text_stream.py)."""

    kv: int = arg(HANDLE)
    tokens: tuple[int, ...] = arg(TokenIds(MAX_PRED_TOKENS))
    positions: tuple[int, ...] | None = arg(Positions(), default=None)
    then: Argmax | None = arg(Then(), default=None)
    steps: int = arg(Int(1, MAX_PRED_STEPS), default=1)
    stop: tuple[int, ...] | None = arg(TokenIds(MAX_STOP_TOKENS), default=None)
    stream: bool = arg(Bool(), default=False)
    stop_strings: tuple[str, ...] | None = arg(StopStrings(), default=None)
    stop_context: tuple[int, ...] | None = arg(TokenIds(MAX_STOP_CONTEXT_TOKENS), default=None)
    send_text: dict[str, Any] | None = arg(SendMessage(), default=None)
    send_pending: str | None = arg(Str(MAX_SEND_PENDING_CHARS), default=None)
    send_context: int = arg(Int(0, MAX_STOP_CONTEXT_TOKENS), default=0)

    def _validate(self) -> None:
        """Positions become non-negative offsets into ``tokens``; then ``steps`` is checked."""
        n = len(self.tokens)
        values = self.__dict__
        if self.positions is None:
            values["positions"] = (n - 1,)
        else:
            rows = []
            for p in self.positions:
                if not (type(p) is int or _is_int(p)) or not -n <= p < n:
                    raise _bad(f"position {p!r} outside tokens (length {n})")
                rows.append(p % n)
            values["positions"] = tuple(rows)
        if self.stop_strings is not None or self.stop_context is not None:
            if self.then is None:
                raise _bad("stop_strings and stop_context need then (the worker looks at the tokens it chooses)")
            if values["positions"] != (n - 1,):
                raise _bad("stop_strings looks at tokens chosen from the last position only")
        if self.send_text is None and (self.send_pending is not None or self.send_context):
            raise _bad("send_pending and send_context go with send_text")
        if self.send_text is not None:
            if self.then is None or values["positions"] != (n - 1,):
                raise _bad("send_text sends the text of tokens chosen (then) from the last position")
            if self.send_context > len(self.stop_context or ()):
                raise _bad("send_context names more tokens than stop_context holds")
        if self.steps > 1:
            if self.then is None:
                raise _bad("steps > 1 needs then (the worker chooses each token)")
            if values["positions"] != (n - 1,):
                raise _bad("steps > 1 decodes from the last position only")
            if _is_int(self.then.mask) and not self.then.advance:
                raise _bad("steps > 1 with a grammar mask needs advance (the worker moves it each step)")


@lip_op("dist_argmax", int)
class DistArgmax(Argmax):
    dist: int = arg(Int(0, message="{name} must be an integer handle"))


@lip_op("dist_sample", int)
class DistSample(Sample):
    dist: int = arg(Int(0, message="{name} must be an integer handle"))


@lip_op("dist_topk", TopKReply)
class DistTopk(Args):
    dist: int = arg(Int(0, message="{name} must be an integer handle"))
    k: int = arg(Int(1, MAX_TOPK))


@lip_op("dist_logprob", list[float])
class DistLogprob(Args):
    dist: int = arg(Int(0, message="{name} must be an integer handle"))
    token_ids: tuple[int, ...] = arg(TokenIds(MAX_ARRAY_ITEMS))


@lip_op("dist_full", bytes)
class DistFull(Args):
    """All log-probs as a float16 little-endian vector (``vocab_size * 2`` bytes)."""

    dist: int = arg(Int(0, message="{name} must be an integer handle"))


@lip_op("dist_release")
class DistRelease(Args):
    dists: list[int] = arg(ListOf(MAX_DIST_RELEASE, "{name} must be a list of handles"))


@lip_op("grammar", GrammarRef)
class Grammar(Args):
    """Compile exactly one of a JSON schema (a map or its JSON text), a regex or an EBNF grammar."""

    json_schema: Any = None
    regex: Any = None
    ebnf: Any = None

    def _validate(self) -> None:
        if sum(v is not None for v in (self.json_schema, self.regex, self.ebnf)) != 1:
            raise _bad("give exactly one of json_schema, regex, ebnf")


@lip_op("grammar_state", MaskRef)
class GrammarState(Args):
    """A fresh matcher state of a grammar, usable as ``mask``."""

    grammar: int = arg(HANDLE)


@lip_op("mask_advance", Advanced)
class MaskAdvance(Args):
    mask: int = arg(HANDLE)
    token: int = arg(Int(0, message="{name} must be an integer in [0, vocab_size)"))


@lip_op("bias_create", BiasRef)
class BiasCreate(Args):
    """A bias vector kept worker-side for ``bias_ref``: ``value`` added to each of ``ids`` (a
    token set), or one offset per token (``values``). Exactly one of ``ids`` and ``values``."""

    ids: tuple[int, ...] | None = arg(TokenIds(MAX_ARRAY_ITEMS), default=None)
    value: float | None = arg(Number(-MAX_BIAS_OFFSET, MAX_BIAS_OFFSET), default=None)
    values: Any = arg(DenseBias(), default=None)

    def _validate(self) -> None:
        if (self.ids is None) == (self.values is None):
            raise _bad("give exactly one of ids (with value) and values")
        if self.ids is not None and self.value is None:
            raise _bad("ids needs a value to add to each of them")
        if self.values is not None and self.value is not None:
            raise _bad("value goes with ids; values already holds every offset")


@lip_op("bias_release")
class BiasRelease(Args):
    bias: int = arg(HANDLE)


@lip_op("http_fetch", HttpReply)
class HttpFetch(Args):
    """Brokered HTTP to a host on the run's allowlist (``headers``, ``body``: checked by the handler)."""

    url: str = arg(Str(8192, "{name} must be a string"))
    method: str = arg(Str(16, "{name} must be a string"), default="GET")
    headers: dict[str, str] | None = None
    body: bytes | str | None = None
    timeout: float | None = arg(
        Number(0, float("inf"), open_lo=True, message="{name} must be a positive number"), default=None
    )


@lip_op("sleep")
class Sleep(Args):
    seconds: float = arg(Number(0, MAX_SLEEP_S))


_CHANNEL = NonEmptyStr(MAX_CHANNEL_NAME_CHARS)
#: A read's own wait bound (seconds); ``None``: until a message comes or the run's deadline.
_WAIT = Number(0, MAX_SLEEP_S, message="{name} must be a number of seconds in [0, 3600]")


@lip_op("channel_send")
class ChannelSend(Args):
    """Queue JSON ``data`` on channel ``name`` of the run's tree, for one receiver."""

    name: str = arg(_CHANNEL)
    data: Any = arg(Required())


@lip_op("channel_recv", ChannelMessage)
class ChannelRecv(Args):
    """The oldest message of channel ``name``, waiting up to ``timeout`` seconds for one."""

    name: str = arg(_CHANNEL)
    timeout: float | None = arg(_WAIT, default=None)


@lip_op("channel_publish", int)
class ChannelPublish(Args):
    """Deliver JSON ``data`` to every current subscription of channel ``name``; replies with
    how many it reached."""

    name: str = arg(_CHANNEL)
    data: Any = arg(Required())


@lip_op("channel_subscribe", SubscriptionRef)
class ChannelSubscribe(Args):
    """A subscription to channel ``name``: it receives every message published from now on."""

    name: str = arg(_CHANNEL)


@lip_op("channel_next", ChannelMessage)
class ChannelNext(Args):
    """The next message of subscription ``sub``, waiting up to ``timeout`` seconds for one."""

    sub: int = arg(HANDLE)
    timeout: float | None = arg(_WAIT, default=None)


@lip_op("channel_unsubscribe")
class ChannelUnsubscribe(Args):
    sub: int = arg(HANDLE)


@lip_op("channel_close")
class ChannelClose(Args):
    """No more messages on channel ``name``: readers drain it, then get ECHANCLOSED."""

    name: str = arg(_CHANNEL)


# --- processes: a LIP's child runs (symphony.spawn) ---------------------------------------
#: Longest ``entry`` of a spawn: ``module[:function]`` of the program's own bundle.
MAX_ENTRY_CHARS = 200
#: Largest ``args`` of a spawn, as JSON bytes (what a run created over the API may carry).
MAX_SPAWN_ARGS_BYTES = 1024 * 1024
#: A child run's id as the worker hands it out (a UUID's text).
_CHILD = Str(64, "{name} must be a child run id (a string)")


class Spawned(Reply):
    #: The child run's id (also its ``GET /api/v1/runs/<id>``).
    child: str


class ChildStatus(Reply):
    """A child's state as ``child_wait`` saw it: ``running`` when the wait timed out, else its
    final status with its result (``succeeded``) or its error."""

    child: str
    status: str
    result: Any = None
    error: str = ""


@lip_op("spawn", Spawned)
class Spawn(Args):
    """Start ``entry`` of this run's program as a child run with ``args`` (JSON, checked by the
    handler) and ``limits`` (a run's limits: checked by the control plane, capped by the plan
    and by this run's remaining time)."""

    entry: str = arg(Str(MAX_ENTRY_CHARS, "{name} must be a string"), default="")
    args: Any = None
    limits: dict[str, Any] | None = None


@lip_op("child_wait", ChildStatus)
class ChildWait(Args):
    child: str = arg(_CHILD)
    #: Seconds to wait at most (``None``: until the child ends or this run's deadline).
    timeout: float | None = arg(Number(0, float("inf"), message="{name} must be a number >= 0"), default=None)


@lip_op("child_cancel", bool)
class ChildCancel(Args):
    """Cancel a child (and its own children); ``False`` when it had already ended."""

    child: str = arg(_CHILD)


# --- admin ops ----------------------------------------------------------------------------
_TENANT = NonEmptyStr(64)


@admin_op("health", dict[str, Any])
class Health(Args):
    """``{ok, name, model, device, block_size, pages_*, sessions, metrics, ...}``: routing input."""


@admin_op("stats", dict[str, Any])
class Stats(Args):
    """Scheduler, KVFS, engine, grammar and connection metrics, and every session's usage."""


class KvQuotaLimits(TypedDict, total=False):
    """A tenant's plan bounds on its named KV files, the same for each of its runs (``None``:
    unlimited; gpu_worker/kvfs/quota.py). Sent in a run's ``RunLimits`` and in the admin
    ``kv_pin``; written by the control plane (``api.services.quotas.kv_quota``), read by the
    worker (``gpu_worker.sessions.parse_tenant_quota``). Every key is sent, ``None`` included:
    a plan changed to unlimited lifts the worker's bound too."""

    max_stored_bytes: int | None
    kv_pinned_share: float | None
    kv_host_share: float | None
    max_kv_files: int | None


class RunLimits(KvQuotaLimits, total=False):
    """A run's limits as ``create_session`` carries them: written by the control plane
    (``api.services.quotas.session_limits``), checked and read by the worker
    (``gpu_worker.sessions.SessionLimits.parse``, which refuses a bad value with EINVAL naming
    its key). A key left out is unlimited or the worker's default."""

    max_tokens: int | None
    max_pages: int | None
    #: Seconds the run may take (the control plane always sets it; the worker also takes none).
    deadline_s: float
    allowed_hosts: list[str]
    max_kv_bytes: int | None
    #: The plan's scheduling weight, in (0, 1000].
    weight: float
    max_stream_bytes: int | None
    #: Whether the run's executor serves its ``spawn`` and ``child_cancel``.
    spawn: bool
    #: The account its tenant counts against (``Tenant.account_key``); none: the tenant alone.
    account: str | None


@admin_op("create_session", SessionCreated)
class CreateSession(Args):
    tenant: str = arg(_TENANT)
    run_id: str = arg(Str(200))
    #: The run's limits, checked by ``gpu_worker.sessions.SessionLimits.parse``.
    limits: RunLimits | None = None
    #: The run tree it belongs to (its root run's id; default: ``run_id``, a tree of its own):
    #: sessions of one tenant and one tree share channels (gpu_worker/channels.py).
    tree: str | None = arg(Str(200), default=None)
    #: The run's trace context (its trace and the run's span): the worker's engine spans link
    #: to it when the worker exports over OTLP (gpu_worker/engine_otel.py). None: untraced.
    trace: TraceContext | None = arg(TraceParent(), default=None)


@admin_op("end_session", SessionEnded)
class EndSession(Args):
    session_id: str = arg(Str(100))


@admin_op("kv_list", list[dict[str, Any]])
class KvList(Args):
    """Every named KV file (``KVFileInfo`` maps), of one tenant or all."""

    tenant: str | None = arg(_TENANT, default=None)


@admin_op("kv_evict")
class KvEvict(Args):
    tenant: str = arg(_TENANT)
    name: str = arg(_NAME)


@admin_op("kv_delete")
class KvDelete(Args):
    tenant: str = arg(_TENANT)
    name: str = arg(_NAME)


@admin_op("kv_pin")
class AdminKvPin(Args):
    """Pin or unpin a tenant's named file; ``quota`` is the tenant's plan, set before the pin
    is checked against it."""

    tenant: str = arg(_TENANT)
    name: str = arg(_NAME)
    pinned: bool = arg(Bool(), default=True)
    quota: KvQuotaLimits | None = None


@admin_op("kv_delete_tenant", TenantDeleted)
class KvDeleteTenant(Args):
    """Every file of a closed tenant, the shared store's copies too."""

    tenant: str = arg(_TENANT)


#: Forwards the worker's engine timeline keeps (gpu_worker/engine_timeline.py), newest last.
MAX_TIMELINE_FORWARDS = 2000


class EngineTimelineReply(Reply):
    """The last forwards of the engine, oldest first. ``forwards`` rows are lists, to keep a
    full ring a few hundred kB: ``[start (wall clock, s), duration_s, batch_size,
    prompt_tokens, decode_tokens, sessions, [account index, tokens, account index, tokens,
    ...]]``; an account index points into ``accounts``."""

    capacity: int
    #: Forwards recorded since the worker started (those before the ring's last are gone).
    recorded: int
    accounts: list[str]
    forwards: list[list[Any]]


@admin_op("engine_timeline", EngineTimelineReply)
class EngineTimeline(Args):
    """The engine's last forwards (staff's engine timeline, ``GET /staff/workers/<name>/timeline``)."""

    #: At most this many of the newest forwards (default: the whole ring).
    limit: int = arg(Int(1, MAX_TIMELINE_FORWARDS), default=MAX_TIMELINE_FORWARDS)
