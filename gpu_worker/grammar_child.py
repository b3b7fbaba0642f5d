"""One grammar-compiling child process of the worker.

xgrammar compiles in C++ and cannot be interrupted from Python, so the worker compiles here,
where a compile past its time budget costs only this process (the worker kills it). Frames are
a 4-byte big-endian length and msgpack: first ``{tokenizer_info, max_bytes}``, then per request
``{kind, source}`` answered by ``{ok: serialized CompiledGrammar}`` or ``{err: message}``. End of
input (the worker went away) ends the process.

The worker forks its children from a fork server that imported this module, and so xgrammar,
once (gpu_worker/grammar_pool.py, :func:`serve` on a socket): importing xgrammar pulls in torch
and transformers, ~7 s of one core, which every child and every replacement of a killed child
paid before. ``python -m gpu_worker.grammar_child`` serves the same frames on stdin/stdout.
"""

from __future__ import annotations

import os
import socket
import struct
from typing import Any, BinaryIO

import msgpack
import xgrammar as xgr

_LEN = struct.Struct(">I")


def read_frame(stream: BinaryIO) -> Any:
    """One frame, or ``None`` at end of stream."""
    header = stream.read(_LEN.size)
    if len(header) < _LEN.size:
        return None
    (length,) = _LEN.unpack(header)
    return msgpack.unpackb(stream.read(length), raw=False)


def write_frame(stream: BinaryIO, obj: Any) -> None:
    body = msgpack.packb(obj, use_bin_type=True)
    stream.write(_LEN.pack(len(body)) + body)
    stream.flush()


def encode_frame(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    return _LEN.pack(len(body)) + body


def compile_one(compiler: Any, kind: str, source: str, max_bytes: int) -> dict[str, Any]:
    try:
        if kind == "json_schema":
            # Compact JSON, no space after "," or ":" (what vLLM's disable_any_whitespace
            # compiles): with any_whitespace a model may emit whitespace forever.
            compiled = compiler.compile_json_schema(source, any_whitespace=False, separators=(",", ":"))
        elif kind == "regex":
            compiled = compiler.compile_regex(source)
        else:
            compiled = compiler.compile_grammar(source)
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
        return {"err": f"invalid {kind}: {str(exc)[:300]}"}
    size = int(compiled.memory_size_bytes)
    if size > max_bytes:
        return {
            "err": f"compiled {kind} takes {size} bytes, over the grammar budget of {max_bytes} (grammar_max_bytes)"
        }
    return {"ok": compiled.serialize_json()}


def serve(sock: socket.socket) -> None:
    """A forked child's life: frames on ``sock``, whose other end the worker holds."""
    # Compiles yield the CPU to the worker's forwards: a hostile one then slows only compiles.
    os.nice(10)
    with sock, sock.makefile("rb") as rfile, sock.makefile("wb") as wfile:
        init = read_frame(rfile)
        if init is None:
            return
        info = xgr.TokenizerInfo.deserialize_json(init["tokenizer_info"])
        compiler = xgr.GrammarCompiler(info, max_threads=1)
        max_bytes = int(init["max_bytes"])
        write_frame(wfile, {"ready": True})
        while (request := read_frame(rfile)) is not None:
            write_frame(wfile, compile_one(compiler, request["kind"], request["source"], max_bytes))
