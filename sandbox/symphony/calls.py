"""Request builders shared by the threaded and asyncio SDK flavours.

Each function returns a :class:`Call`: the op name, its wire arguments (the shapes of
``gpu_worker/lip_ops.py``) and how to turn the reply into a Python value. Keeping this in one
place means the sync and async APIs cannot drift apart on the protocol.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from symphony.errors import InvalidArgument
from symphony.wire import protocol

JSON = Any


def _same(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Call:
    op: str
    args: dict[str, Any]
    parse: Callable[[Any], Any] = field(default=_same)


@dataclass(frozen=True)
class VocabInfo:
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    chat_template: str | None


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> JSON:
        import json

        return json.loads(self.body)


@dataclass(frozen=True)
class TopK:
    """``k`` most likely tokens with their log-probabilities, most likely first."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]

    def __iter__(self):
        return iter(zip(self.ids, self.logprobs, strict=True))


def handle_id(h: Any) -> int:
    """Accept a handle object (anything with ``.id``) or a raw int."""
    value = getattr(h, "id", h)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"expected a handle, got {type(h).__name__}")
    return value


def _tokens(tokens: Iterable[int]) -> list[int]:
    out = [int(t) for t in tokens]
    if not out:
        raise InvalidArgument("tokens must not be empty", op="pred")
    return out


# --------------------------------------------------------------------------- pred / dists
def pred_chunks(
    kv: Any, tokens: Iterable[int], positions: Sequence[int] | None, then: Any
) -> list[tuple[Call, list[int]]]:
    """``pred`` split into calls of at most ``MAX_PRED_TOKENS`` tokens (run in order).

    Returns ``(call, wanted)`` pairs: ``wanted`` are indexes into the call's reply list that
    the caller asked for; other rows (the last row of an intermediate chunk) are released.
    """
    toks = _tokens(tokens)
    n = len(toks)
    wanted_abs = [n - 1] if positions is None else [p % n if -n <= p < n else p for p in positions]
    for p in wanted_abs:
        if not 0 <= p < n:
            raise InvalidArgument(f"position {p} outside tokens (length {n})", op="pred")
    step = protocol.MAX_PRED_TOKENS
    out: list[tuple[Call, list[int]]] = []
    for start in range(0, n, step):
        chunk = toks[start : start + step]
        rows = [p - start for p in wanted_abs if start <= p < start + len(chunk)]
        keep = list(range(len(rows)))
        if not rows:
            rows, keep = [len(chunk) - 1], []
        args: dict[str, Any] = {"kv": handle_id(kv), "tokens": chunk, "positions": rows}
        if then is not None:
            args["then"] = then
        out.append((Call("pred", args), keep))
    return out


def choice(kind: str, temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any) -> Any:
    """The ``then`` spec of a fused ``pred`` (token chosen worker-side in the same round trip)."""
    params = _choice_params(temperature, top_p, top_k, seed, mask, bias) if kind == "sample" else _mask_bias(mask, bias)
    return {kind: params}


def then_choose(
    temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Mapping[int, float] | None
) -> Any:
    """The ``then`` of ``pred_token``: greedy at temperature 0, otherwise a sample."""
    if temperature == 0:
        return choice("argmax", 0, 1, 0, None, mask, bias)
    return choice("sample", temperature, top_p, top_k, seed, mask, bias)


@dataclass(frozen=True)
class Advancing:
    """A grammar state given as ``mask=`` that the worker advances by the token it chooses
    (``GrammarState.advancing()``): one round trip a token instead of two. The state's
    ``finished`` is then not tracked here; the grammar allows EOS only at its end."""

    id: int


def _mask_bias(mask: Any, bias: Mapping[int, float] | None) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if isinstance(mask, Advancing):
        params["advance"] = True
    if mask is not None:
        params["mask"] = mask.id if hasattr(mask, "id") else [int(t) for t in mask]
    if bias is not None:
        # String keys: the worker decodes with strict_map_key (a map with int keys is a bad frame).
        params["bias"] = {str(int(k)): float(v) for k, v in bias.items()}
    return params


def _choice_params(
    temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any
) -> dict[str, Any]:
    params: dict[str, Any] = {"temperature": float(temperature), "top_p": float(top_p), "top_k": int(top_k)}
    if seed is not None:
        params["seed"] = int(seed)
    params.update(_mask_bias(mask, bias))
    return params


def dist_sample(
    dist: Any, temperature: float, top_p: float, top_k: int, seed: int | None, mask: Any, bias: Any
) -> Call:
    args = {"dist": handle_id(dist), **_choice_params(temperature, top_p, top_k, seed, mask, bias)}
    return Call("dist_sample", args, int)


def dist_argmax(dist: Any, mask: Any, bias: Any) -> Call:
    return Call("dist_argmax", {"dist": handle_id(dist), **_mask_bias(mask, bias)}, int)


def _topk(v: dict[str, Any]) -> TopK:
    return TopK(tuple(v["ids"]), tuple(v["logprobs"]))


def dist_topk(dist: Any, k: int) -> Call:
    return Call("dist_topk", {"dist": handle_id(dist), "k": int(k)}, _topk)


def dist_logprob(dist: Any, token_ids: Iterable[int]) -> Call:
    return Call("dist_logprob", {"dist": handle_id(dist), "token_ids": [int(t) for t in token_ids]}, list)


def _fp16(data: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(data) // 2}e", data))


def dist_full(dist: Any) -> Call:
    return Call("dist_full", {"dist": handle_id(dist)}, _fp16)


def dist_release(dists: Iterable[Any]) -> Call:
    return Call("dist_release", {"dists": [handle_id(d) for d in dists]})


# ------------------------------------------------------------------------------------ KVFS
def _kv(value: Any) -> int:
    return int(value["kv"])


def kv_create(name: str | None) -> Call:
    return Call("kv_create", {} if name is None else {"name": name}, _kv)


def kv_open(name: str, mode: str) -> Call:
    if mode not in ("r", "w"):
        raise InvalidArgument('mode must be "r" or "w"', op="kv_open")
    return Call("kv_open", {"name": name, "mode": mode}, _kv)


def kv_fork(kv: Any) -> Call:
    return Call("kv_fork", {"kv": handle_id(kv)}, _kv)


def kv_close(kv: Any) -> Call:
    return Call("kv_close", {"kv": handle_id(kv)})


def kv_remove(name: str) -> Call:
    return Call("kv_remove", {"name": name})


def kv_len(kv: Any) -> Call:
    return Call("kv_len", {"kv": handle_id(kv)}, int)


def kv_tokens(kv: Any) -> Call:
    return Call("kv_tokens", {"kv": handle_id(kv)}, list)


def kv_truncate(kv: Any, n: int) -> Call:
    return Call("kv_truncate", {"kv": handle_id(kv), "n": int(n)})


def kv_extract(kv: Any, start: int, end: int) -> Call:
    return Call("kv_extract", {"kv": handle_id(kv), "start": int(start), "end": int(end)}, _kv)


def kv_merge(a: Any, b: Any) -> Call:
    return Call("kv_merge", {"a": handle_id(a), "b": handle_id(b)}, _kv)


def kv_pin(name: str, pinned: bool) -> Call:
    return Call("kv_pin", {"name": name, "pinned": bool(pinned)})


# ------------------------------------------------------------------------------- tokenizer
def tokenize(text: str, add_special_tokens: bool) -> Call:
    return Call("tokenize", {"text": text, "add_special_tokens": bool(add_special_tokens)}, list)


def detokenize(ids: Iterable[int], skip_special_tokens: bool) -> Call:
    return Call("detokenize", {"ids": [int(t) for t in ids], "skip_special_tokens": bool(skip_special_tokens)}, str)


def _vocab(v: dict[str, Any]) -> VocabInfo:
    return VocabInfo(int(v["vocab_size"]), tuple(v["eos_token_ids"]), v.get("bos_token_id"), v.get("chat_template"))


def vocab_info() -> Call:
    return Call("vocab_info", {}, _vocab)


def apply_chat_template(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool) -> Call:
    msgs = [{"role": str(m["role"]), "content": str(m["content"])} for m in messages]
    return Call("apply_chat_template", {"messages": msgs, "add_generation_prompt": bool(add_generation_prompt)}, list)


# ------------------------------------------------------------------------------------- I/O
def send_to_user(data: JSON) -> Call:
    return Call("send_to_user", {"data": data})


def _http(v: dict[str, Any]) -> HttpResponse:
    return HttpResponse(int(v["status"]), dict(v.get("headers") or {}), bytes(v.get("body") or b""))


def http_fetch(
    url: str, method: str, headers: Mapping[str, str] | None, body: bytes | str | None, timeout: float | None
) -> Call:
    args: dict[str, Any] = {"url": url, "method": method}
    if headers:
        args["headers"] = dict(headers)
    if body is not None:
        args["body"] = body
    if timeout is not None:
        args["timeout"] = float(timeout)
    return Call("http_fetch", args, _http)


def sleep(seconds: float) -> Call:
    return Call("sleep", {"seconds": float(seconds)})


# --------------------------------------------------------------------------------- grammar
def grammar(json_schema: Any, regex: str | None, ebnf: str | None) -> Call:
    given = {k: v for k, v in (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf)) if v is not None}
    if len(given) != 1:
        raise InvalidArgument("give exactly one of json_schema, regex, ebnf", op="grammar")
    return Call("grammar", given, lambda v: int(v["grammar"]))


def grammar_state(g: Any) -> Call:
    return Call("grammar_state", {"grammar": handle_id(g)}, lambda v: int(v["mask"]))


def mask_advance(mask: Any, token: int) -> Call:
    return Call("mask_advance", {"mask": handle_id(mask), "token": int(token)}, dict)


def finish(result: JSON, error: str | None) -> Call:
    args: dict[str, Any] = {"result": result}
    if error is not None:
        args["error"] = error
    return Call("finish", args)
