"""Wire protocol between a LIP (through the `symphony` SDK) and the gpu_worker.

This module is the single source of truth for the syscall protocol of DESIGN.md §3. It is
imported by the worker's socket server *and* copied verbatim into the sandbox image as part of
the SDK, so it must depend on nothing but the standard library and ``msgpack``.

Transport: a Unix stream socket carrying length-prefixed msgpack frames.

* A frame is a 4-byte big-endian unsigned length followed by that many bytes of msgpack.
* Request:  ``{"id": int, "op": str, "args": {str: value}}``
* Reply:    ``{"id": int, "ok": value}`` or ``{"id": int, "err": {"code": str, "message": str}}``

Several requests may be in flight on one connection (a LIP with threads); replies carry the
request ``id`` and may arrive in any order. The first request on a connection must be
``hello`` with the session token; anything else before it closes the connection.

The admin protocol (control plane → worker) uses the same framing on a separate socket that is
never mounted into a sandbox; its ops are listed in :data:`ADMIN_OPS`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack

PROTOCOL_VERSION = 1

# --- bounds -------------------------------------------------------------------------------
#: Largest frame either side accepts. A bigger length prefix closes the connection.
MAX_FRAME_BYTES = 8 * 1024 * 1024
#: Most requests one connection may have outstanding; more get ``EBUSY`` replies.
MAX_IN_FLIGHT = 64
#: Most tokens one ``pred`` call may append (longer prompts are split by the SDK).
MAX_PRED_TOKENS = 8192
#: Longest string accepted by ``tokenize`` / ``send_to_user`` (characters).
MAX_TEXT_CHARS = 1_000_000
#: Longest KV file name (after the tenant prefix is added by the worker).
MAX_NAME_CHARS = 200

_LEN = struct.Struct(">I")
HEADER_BYTES = _LEN.size

# --- operations ---------------------------------------------------------------------------
#: LIP-facing operations (session socket).
LIP_OPS = frozenset(
    {
        "hello",  # {token} -> {session_id, tenant, vocab_size, eos_token_ids, block_size}
        "pred",  # {kv, tokens, positions?, returns?, then?} -> {dists: [int]} or {tokens: [int]}
        "dist_sample",  # {dist, temperature, top_p, top_k, seed?, mask?, bias?} -> int
        "dist_argmax",  # {dist, mask?} -> int
        "dist_topk",  # {dist, k} -> {ids: [int], logprobs: [float]}
        "dist_logprob",  # {dist, token_ids} -> [float]
        "dist_full",  # {dist} -> bytes (float16 little-endian vector of log-probs)
        "dist_release",  # {dists: [int]} -> None
        "kv_create",  # {name?} -> {kv}
        "kv_open",  # {name, mode: "r"|"w"} -> {kv}
        "kv_fork",  # {kv} -> {kv}
        "kv_close",  # {kv} -> None
        "kv_remove",  # {name} -> None
        "kv_len",  # {kv} -> int
        "kv_tokens",  # {kv} -> [int]
        "kv_truncate",  # {kv, n} -> None
        "kv_extract",  # {kv, start, end} -> {kv}
        "kv_merge",  # {a, b} -> {kv}
        "kv_pin",  # {name, pinned: bool} -> None
        "tokenize",  # {text, add_special_tokens?} -> [int]
        "detokenize",  # {ids, skip_special_tokens?} -> str
        "vocab_info",  # {} -> {vocab_size, eos_token_ids, bos_token_id, chat_template?}
        "apply_chat_template",  # {messages, add_generation_prompt?} -> [int]
        "send_to_user",  # {data: str | json} -> None
        "http_fetch",  # {url, method?, headers?, body?, timeout?} -> {status, headers, body}
        "sleep",  # {seconds} -> None
        "grammar",  # {json_schema? | regex? | ebnf?} -> {grammar}
        "grammar_state",  # {grammar} -> {mask}  (a fresh matcher state usable as `mask`)
        "mask_advance",  # {mask, token} -> {accepted: bool, finished: bool}
        "finish",  # {result} -> None ; the run's return value, sent once by the runner
    }
)

#: Control-plane operations (admin socket, never mounted into a sandbox).
ADMIN_OPS = frozenset(
    {
        "health",  # {} -> {ok, model, block_size, pages_total, pages_free, sessions, metrics}
        "create_session",  # {tenant, run_id, limits} -> {session_id, socket_path, token}
        "end_session",  # {session_id} -> {usage, result, error}
        "kv_list",  # {tenant?} -> [KVFileInfo]
        "kv_evict",  # {tenant, name} -> None
        "kv_delete",  # {tenant, name} -> None
        "kv_pin",  # {tenant, name, pinned} -> None
        "stats",  # {} -> scheduler/KVFS metrics
    }
)


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


@dataclass(frozen=True)
class ProtocolError(Exception):
    """An error reply, raised on the worker side and re-raised by clients."""

    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_wire(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


# --- framing ------------------------------------------------------------------------------
def pack(obj: Any) -> bytes:
    """Encode one message as a length-prefixed frame."""
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    return _LEN.pack(len(body)) + body


def unpack_body(body: bytes) -> Any:
    """Decode a frame body with limits that keep a hostile peer from exhausting memory."""
    try:
        return msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=True,
            max_str_len=MAX_FRAME_BYTES,
            max_bin_len=MAX_FRAME_BYTES,
            max_array_len=MAX_PRED_TOKENS * 8,
            max_map_len=4096,
            max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(ErrorCode.BAD_FRAME, f"undecodable frame: {type(exc).__name__}") from None


def frame_length(header: bytes) -> int:
    """Length announced by a 4-byte header; raises on a frame larger than allowed."""
    (length,) = _LEN.unpack(header)
    if length > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"announced frame of {length} bytes exceeds {MAX_FRAME_BYTES}")
    return length


def request(req_id: int, op: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": req_id, "op": op, "args": args or {}}


def ok_reply(req_id: int, value: Any) -> dict[str, Any]:
    return {"id": req_id, "ok": value}


def err_reply(req_id: int | None, error: ProtocolError) -> dict[str, Any]:
    return {"id": req_id, "err": error.to_wire()}


def parse_request(msg: Any) -> tuple[int, str, dict[str, Any]]:
    """Validate the envelope of a request; argument shapes are checked per op by the server."""
    if not isinstance(msg, dict):
        raise ProtocolError(ErrorCode.BAD_FRAME, "request must be a map")
    req_id = msg.get("id")
    op = msg.get("op")
    args = msg.get("args", {})
    if not isinstance(req_id, int) or isinstance(req_id, bool) or not (0 <= req_id < 2**63):
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
        return msg["id"], None, ProtocolError(str(err.get("code", ErrorCode.INTERNAL)), str(err.get("message", "")))
    return msg["id"], msg.get("ok"), None
