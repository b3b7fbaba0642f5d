"""What the handle types of both faces share: a worker-side id, its session, no I/O.

``api.py`` (threaded) and ``aio.py`` (asyncio) subclass these with their own methods; the
flows (``flows.py``) tell a compiled grammar from a grammar state by these bases.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from symphony import calls

S = TypeVar("S")


class Handle(Generic[S]):
    """An id the worker handed out, and the session (of either face) it belongs to."""

    __slots__ = ("id", "session")

    def __init__(self, session: S, handle_id: Any) -> None:
        self.session = session
        self.id = handle_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.id})"


class GrammarHandle(Handle[S]):
    """A compiled constraint (``grammar``); each sequence takes its own state of it."""

    __slots__ = ()


class GrammarStateHandle(Handle[S]):
    """A matcher position in a grammar; ``finished`` once it reached the grammar's end."""

    __slots__ = ("finished",)

    def __init__(self, session: S, mask_id: int) -> None:
        super().__init__(session, mask_id)
        self.finished = False

    def advancing(self) -> calls.Advancing:
        """This state as ``mask=`` of a choice the worker makes (``pred_token``, ``Dist.sample``):
        the worker advances it by the chosen token, so no :meth:`advance` call follows."""
        return calls.Advancing(self.id)
