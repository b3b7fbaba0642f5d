"""Stop strings decided in the worker: the text of the tokens a ``pred`` chooses, detokenised as
they are chosen, and the first of the call's ``stop_strings`` that text comes to contain.

Why in the worker: a program watching for text (an OpenAI ``stop``) could otherwise only learn
the text of a token by a ``detokenize`` round trip after it, so it decoded one token per call and
the batch waited for it between two forwards. The worker has the tokenizer; looking after each
step of a multi-step ``pred`` (``Scheduler._next_step``, on the engine thread) costs two decodes
of a few tokens, microseconds beside a forward.

Incremental, as vLLM's detokeniser is: the tokens are split at two offsets. ``prefix``..``read``
are tokens whose text was taken already, decoded again only as the context the next ones decode
in (a tokenizer may decode a token differently at the start of a text: SentencePiece drops its
leading space); ``read``..end are tokens whose text is not taken yet. A new token's text is
``decode(ids[prefix:])`` less ``decode(ids[prefix:read])``, taken once it does not end in U+FFFD
(an incomplete UTF-8 character that the next byte token may complete), and then both offsets
move up. So each step decodes a handful of tokens, never the whole answer, and the text taken is
that of decoding the whole list, less a trailing incomplete character; the strings are looked
for in that text followed by the text not taken yet, which is what decoding the whole list
shows at that token (so a string ends the call at the token it would end a program's loop of
``detokenize`` at, even next to an incomplete character). One bound keeps a
degenerate decode (a mask that allows only lone UTF-8 lead bytes, or tokens that decode to no
text) from growing the window: past ``MAX_UNREAD`` tokens not yet taken the text is taken as it
is, U+FFFD included, as decoding the whole list would show it then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

log = logging.getLogger(__name__)

#: Tokens whose text may wait for the rest of an incomplete character (a UTF-8 character is at
#: most four bytes, so real text never waits for more than three).
MAX_UNREAD = 16
#: Context tokens decoded before the last one taken: the text they give a token at the start.
CONTEXT_TOKENS = 4
_INCOMPLETE = "\ufffd"

Decode = Callable[[Sequence[int]], str]


class StopWatch:
    """Watches one call's chosen tokens for ``strings``. ``context``: tokens whose text comes
    before the call's (a string may begin in it; one wholly in it is not looked for); a context
    that ends in an incomplete character leaves those tokens to the call's own text.

    With no ``strings`` it only detokenises (what ``pred``'s ``send_text`` streams, see
    gpu_worker/text_stream.py); ``keep``: context tokens kept besides, whose taken text
    :meth:`context_text` gives."""

    __slots__ = ("decode", "ids", "longest", "matched", "prefix", "read", "strings", "tail")

    def __init__(self, decode: Decode, strings: Sequence[str], context: Sequence[int] = (), keep: int = 0) -> None:
        self.decode = decode
        self.strings = tuple(strings)
        self.longest = max(map(len, self.strings), default=0)
        # Enough of the context for its last ``longest - 1`` characters (a character is at most
        # four byte tokens) and the tokens the next ones decode after: the rest is not decoded.
        self.ids = list(context[-max(4 * self.longest + CONTEXT_TOKENS, keep + CONTEXT_TOKENS) :])
        self.read = len(self.ids)
        while self.read > max(0, len(self.ids) - 3) and decode(self.ids[: self.read]).endswith(_INCOMPLETE):
            self.read -= 1
        self.prefix = max(0, self.read - CONTEXT_TOKENS)
        #: The last ``longest - 1`` characters taken: where a string may begin before the new text.
        self.tail = decode(self.ids[: self.read])[-(self.longest - 1) :] if self.longest > 1 else ""
        #: The string the text came to contain (the call ends there), or None.
        self.matched: str | None = None

    def context_text(self, last: int) -> str:
        """The text the context's ``last`` tokens add that is taken already (their part of
        :meth:`feed`'s text to come is what an incomplete character at the end left untaken)."""
        start = max(0, len(self.ids) - last)
        if last <= 0 or self.read <= start:
            return ""
        return self.decode(self.ids[: self.read])[len(self.decode(self.ids[:start])) :]

    def feed(self, token: int) -> str:
        """Take ``token``; returns the text it completes ("" while a character is incomplete) and
        sets :attr:`matched` when the text now contains a stop string. The text not taken yet
        (ending in U+FFFD) is looked in too, as decoding the whole list shows it now."""
        self.ids.append(token)
        try:
            before = self.decode(self.ids[self.prefix : self.read])
            window = self.decode(self.ids[self.prefix :])
        except Exception:  # a token the tokenizer cannot decode: it adds no text
            log.exception("event=stop_string_decode_failed token=%s", token)
            return ""
        new = window[len(before) :]
        if new:
            self._look(new)
        if (not new or new.endswith(_INCOMPLETE)) and len(self.ids) - self.read <= MAX_UNREAD:
            return ""  # (tokens that decode to no text wait the same way, within the same bound)
        self.prefix, self.read = self.read, len(self.ids)
        if self.longest > 1:
            self.tail = (self.tail + new)[-(self.longest - 1) :]
        return new

    def _look(self, new: str) -> None:
        """The earliest string that ends in ``new``, given the ``tail`` before it."""
        text = self.tail + new
        start = len(self.tail)
        best: tuple[int, str] | None = None
        for s in self.strings:
            at = text.find(s, max(0, start - len(s) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, s)
        if best is not None:
            self.matched = best[1]
