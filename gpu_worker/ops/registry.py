"""The handler tables: op name -> coroutine, filled by the ``@lip_op`` / ``@admin_op`` decorators of
the handler modules (tests/unit/test_op_tables.py holds them equal to ``protocol.LIP_OPS`` and
``protocol.ADMIN_OPS``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gpu_worker import protocol

#: A LIP op's handler: (context, session, decoded args) -> reply value.
LipHandler = Callable[[Any, Any, Any], Awaitable[Any]]
#: An admin op's handler: (admin context, decoded args) -> reply value.
AdminHandler = Callable[[Any, Any], Awaitable[Any]]

LIP_HANDLERS: dict[str, LipHandler] = {}
ADMIN_HANDLERS: dict[str, AdminHandler] = {}
#: LIP ops served without a handler Task: ``hello`` by the connection itself (it must come
#: first), ``pred`` by ``ops.pred.PredRelay`` (it is the per-token call).
RELAYED = frozenset({protocol.Hello.OP, protocol.Pred.OP})


def lip_op(args: type[protocol.Args]) -> Callable[[LipHandler], LipHandler]:
    def register(fn: LipHandler) -> LipHandler:
        assert args.OP in protocol.LIP_OPS and args.OP not in RELAYED, args.OP
        LIP_HANDLERS[args.OP] = fn
        return fn

    return register


def admin_op(args: type[protocol.Args]) -> Callable[[AdminHandler], AdminHandler]:
    def register(fn: AdminHandler) -> AdminHandler:
        assert args.OP in protocol.ADMIN_OPS, args.OP
        ADMIN_HANDLERS[args.OP] = fn
        return fn

    return register
