"""Text a decode sends to the run's user from inside the worker (``pred``'s ``send_text``).

Why: a program streaming a multi-step decode's text (the built-in OpenAI program, any chat LIP)
otherwise learnt each token's text with a ``detokenize`` round trip and sent it with a
``send_to_user`` round trip: two requests to the worker per token and sequence, each taking the
worker's event loop (and the GIL, from the engine thread running the forward) and the program's
CPU (bench/NOTES.md, "The answer's text sent by the worker"). The worker
detokenises the chosen tokens anyway when it watches stop strings (gpu_worker/stop_strings.py),
so it sends the text itself, as the program would have: one message per token whose text grows
what can be sent, ``{**message, "delta": text}``.

What may not go out yet is held back, as a program's own loop holds it: the trailing characters
a stop string could still grow from (the call may end there and the program cuts the text), and
an incomplete character (the watch never takes one). Nothing goes out from the token whose text
completes a stop string on (the program cuts at the string and sends the rest itself), nor the
text of a stop token. What was sent and what is held at the end come back in the reply
(``sent_text``, ``unsent_text``): the program's next call passes the held text as its
``send_pending``, and the final text is the program's to finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def held_back(text: str, strings: Sequence[str]) -> int:
    """How many trailing characters of ``text`` a string of ``strings`` could still grow from."""
    hold = 0
    for stop in strings:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold


class TextStream:
    """One call's text for its user: the deltas to send as tokens' texts come (:meth:`take`, on
    the engine thread) and which of them went out (:meth:`sent_one`, :meth:`refused`, on the
    event loop, in the order they were taken).

    ``message``: the JSON object each delta is sent in (``delta`` added); ``pending``: text before
    this call's that was not sent yet (held back by the program or an earlier call)."""

    __slots__ = ("closed", "deltas", "message", "sent", "stopped", "strings", "unsent")

    def __init__(self, message: dict[str, Any], pending: str, strings: Sequence[str]) -> None:
        self.message = message
        self.strings = tuple(strings)
        #: Text taken and not handed out as a delta (held back).
        self.unsent = pending
        #: Deltas handed out, in order, and how many of them went out.
        self.deltas: list[str] = []
        self.sent = 0
        #: The text came to contain a stop string, or a send was refused: no delta is taken now.
        self.stopped = False
        #: A send was refused: deltas taken before it knew are not sent either.
        self.closed = False

    def take(self, text: str, stop: bool) -> str:
        """The next token's ``text`` (what the watch took; "" while a character is incomplete);
        ``stop``: its text completed a stop string. Returns what to send now ("" for nothing)."""
        self.unsent += text
        if stop:
            self.stopped = True
        if self.stopped:
            return ""
        delta = self.unsent[: len(self.unsent) - held_back(self.unsent, self.strings)]
        if delta:
            self.unsent = self.unsent[len(delta) :]
            self.deltas.append(delta)
        return delta

    def payload(self, delta: str) -> dict[str, Any]:
        """The message that carries ``delta``."""
        return {**self.message, "delta": delta}

    def sent_one(self) -> None:
        """The oldest delta not accounted for yet went out."""
        self.sent += 1

    def refused(self) -> None:
        """The oldest delta not accounted for yet was refused (a quota): neither it nor any
        after it goes out."""
        self.stopped = self.closed = True

    def sent_text(self) -> str:
        """What went out (once every delta taken is accounted for)."""
        return "".join(self.deltas[: self.sent])

    def unsent_text(self) -> str:
        """What was taken and did not go out: refused deltas, then the text held back."""
        return "".join(self.deltas[self.sent :]) + self.unsent
