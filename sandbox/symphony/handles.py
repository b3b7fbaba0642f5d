"""What the session and handle types of both faces share: a connection, worker-side ids, no I/O.

``api.py`` (threaded) and ``aio.py`` (asyncio) subclass these with their own methods; the
flows (``flows.py``) tell a compiled grammar from a grammar state by these bases.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from symphony import calls
from symphony.connection import Connection, SessionInfo

S = TypeVar("S")


class SessionBase:
    """A run's session connection: what ``Session`` and ``AsyncSession`` hold alike."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @property
    def info(self) -> SessionInfo:
        """What ``hello`` returned: the session, tenant, run and the served model's facts."""
        assert self.conn.info is not None
        return self.conn.info

    def close(self) -> None:
        self.conn.close()


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
