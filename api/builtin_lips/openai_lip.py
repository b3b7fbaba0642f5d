"""Built-in LIP behind ``/v1/chat/completions`` and ``/v1/completions``.

It is a run of the tenant's ``openai-compat`` program with the same worker session, limits and
billing as any other, but executed in the web process, not a sandbox (docs/ARCHITECTURE.md §3a,
``api/services/trusted_runs.py``; with every thread busy, through Celery and the sandbox like
any program): the API turns an OpenAI request into ``args`` (api/serializers/openai.py) and this program's result
into the response (api/services/openai_requests.py). ``n`` choices share a prompt's KV through
``kv_fork`` and decode in threads, so the worker batches them.

args: ``messages`` (chat: already ``{role, content}`` strings, tools rendered) or ``prompts``
(completions: a list of strings or token id lists), ``max_tokens``, ``temperature``, ``top_p``,
``top_k``, ``min_p``, ``presence_penalty``, ``frequency_penalty``, ``repetition_penalty`` (vLLM's:
seen tokens' log-probabilities scaled, see ``Sampler.repetition_bias``), ``logit_bias`` (token id
string -> offset), ``seed``, ``n``, ``stop`` (strings), ``stop_token_ids``, ``ignore_eos`` (the
model's EOS does not end a choice), ``min_tokens`` (EOS and ``stop_token_ids`` are barred until a
choice has that many tokens, as vLLM does), ``json_schema``
(schema JSON text), ``logprobs`` (how many top alternatives; absent: none), ``echo``, ``tools``
(``{"call_schema": JSON text, "mode": "auto" | "required", "parallel": bool}``),
``conversation`` (``{"name": KV file name, "write": bool}``, /v1/responses: see below).

Conversations (/v1/responses): the chat's KV is kept in the named tenant KV file
``conversation.name`` (opened for writing, created when missing; with ``write`` false a private
copy-on-write fork). The longest prefix its tokens share with this request's prompt is kept and
only the rest is prefilled; the usage's ``cached_tokens`` says how many were reused. A file
that is missing, busy or holds another branch of the conversation only costs recomputation.

Sampling: ``logit_bias`` and the penalties are one sparse ``bias`` per step (the penalties from
the counts of the tokens this choice generated, as OpenAI defines them); ``min_p`` is a mask of
the top-1024 tokens whose probability is at least ``min_p`` times the most likely one's.

Round trips per token (each one is time the batch may wait for this program): without
``logprobs`` and ``min_p`` the decode loop uses ``pred_token`` (the forward and the choice of the
next token in one call, no Dist handle), and the prompt's prefill of a single choice chooses its
first token the same way. When every step chooses alike (no presence or frequency penalty,
which count the tokens so far, nor ``min_tokens`` or a repetition penalty) the worker decodes the
tokens itself (``pred_tokens``): one call for the whole answer, each token streamed as it is
chosen, and no round trip to this program between two forwards. Stop strings and the ``auto``
tool marker do not keep it from that: the worker watches the text for them (``stop_strings``)
and ends the call at the token that completes one; the program then cuts the text at the
earliest one as before (the string is not returned) and, for the marker, goes on to the call's
grammar as before. The answer's first token, chosen by the prefill, the program looks at
itself (one ``detokenize``) and passes as the text the worker's watch goes on from. The worker
also sends the text to the client as it chooses the tokens (``send_text``: each token's new
text as this program's own message would carry it, holding back what a stop string could still
claim), so a token costs this program no ``detokenize`` and no ``send_to_user`` round trip; the
program sends what the worker held back once the text is final. Otherwise the program looks at
each token's text itself (``detokenize`` of the answer so far, then the next ``pred_token``);
without a stop string or marker watched that runs on a second thread (``Streamer``) while the
next forward is already queued.

Tool calls: a call is ``<tool_call>`` + JSON generated under the grammar of the call schema
(the name of an offered function and arguments matching its parameters) + ``</tool_call>``.
``required`` (or a named tool) starts with the marker; ``auto`` lets the model write text and
switches to the grammar as soon as the text contains the marker. After a call, when parallel
calls are allowed, the model chooses between ending and opening another call.

Streams ``{"index": i, "delta": text, "logprobs": [...]}`` and ``{"index": i, "tool_call": {...}}``
messages; returns ``{"choices": [...], "usage": ...}``, or ``{"refused": {"code", "message",
"prompt_tokens"}}`` when a prompt does not fit what the run may process, or ``{"invalid_request":
{"message", "param"}}`` for a request the worker refuses (a schema it cannot compile, a token id
outside the vocabulary): the client's request is at fault, which the API answers with a 400.
"""

import json
import math
import os
import queue
import threading

from symphony import (
    Busy,
    InvalidArgument,
    KVExists,
    KVNotFound,
    KVPoolFull,
    NoSpace,
    PermissionDenied,
    QuotaExceeded,
    apply_chat_template,
    detokenize,
    grammar,
    kv_create,
    kv_fork,
    kv_open,
    kv_tokens,
    kv_truncate,
    pred,
    pred_token,
    pred_tokens,
    send_to_user,
    session,
    tokenize,
)

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "\n</tool_call>\n"
MAX_CALLS = 16
MIN_P_CANDIDATES = 1024
MAX_BIAS_ENTRIES = 4096
#: Most token ids one ``pred_tokens`` may stop at (the worker's bound).
MAX_STOP_TOKENS = 256
#: Most stop strings one ``pred_tokens`` may watch, and their longest (the worker's bounds):
#: past them the program watches the text itself, token by token.
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 128
#: Answer tokens passed as the text the worker's watch goes on from (its bound).
MAX_STOP_CONTEXT_TOKENS = 4 * MAX_STOP_STRING_CHARS
#: Prompt positions one ``pred`` may return distributions for (echo with logprobs).
MAX_ECHO_LOGPROB_TOKENS = 1024
#: The bias that bars a token (``min_tokens``): far below any logit, within the worker's bound.
BARRED = -1e9


class Invalid(Exception):
    def __init__(self, message, param):
        super().__init__(message)
        self.message, self.param = message, param


class GrammarBusy(Exception):
    """The worker refused the account's first-time grammar compiles for now (a back-off after
    one of its compiles ran past the time budget): load the account caused, not this request's
    schema, so the API answers 429 ``grammar_busy``."""

    def __init__(self, message):
        super().__init__(message)
        self.message = message


class Vocab:
    """Token id -> text, each asked of the worker once per run (for logprobs)."""

    def __init__(self):
        self.texts = {}
        self.lock = threading.Lock()

    def text(self, tid):
        with self.lock:
            if tid not in self.texts:
                self.texts[tid] = detokenize([tid])
            return self.texts[tid]


def _fused(args):
    """Whether the worker chooses each text token inside its ``pred`` (``pred_token``): not when
    logprobs are asked (they are read from the Dist) nor with min-p or a repetition penalty
    (they need the Dist's top tokens or the seen tokens' log-probabilities first)."""
    return (
        args.get("logprobs") is None
        and float(args.get("min_p") or 0.0) <= 0
        and float(args.get("repetition_penalty") or 1.0) == 1.0
    )


class Sampler:
    """One choice's token choice: temperature, top-p/top-k/min-p, logit bias and penalties."""

    def __init__(self, args, index, ends=frozenset(), prompt=()):
        self.temperature = float(args.get("temperature", 1.0))
        self.top_p = float(args.get("top_p", 1.0))
        self.top_k = int(args.get("top_k") or 0)
        self.min_p = float(args.get("min_p") or 0.0)
        self.presence = float(args.get("presence_penalty") or 0.0)
        self.frequency = float(args.get("frequency_penalty") or 0.0)
        self.logit_bias = {int(k): float(v) for k, v in (args.get("logit_bias") or {}).items()}
        self.seed = args.get("seed")
        self.index = index
        self.counts = {}
        #: Tokens barred before ``min_tokens``: those that would end the choice.
        self.ends, self.min_tokens = ends, int(args.get("min_tokens") or 0)
        #: vLLM's ``repetition_penalty`` over the prompt's tokens and the choice's own.
        self.repetition = float(args.get("repetition_penalty") or 1.0)
        self.prompt_tokens = frozenset(int(t) for t in prompt)

    def repetition_bias(self, dist, bias):
        """``bias`` with the repetition penalty added: each token the prompt or this choice holds
        has its log-probability multiplied by the penalty (above 1: less likely, below 1: more).
        vLLM scales the raw logit instead, which the program never sees (the worker keeps it):
        the same direction and fixed point (1 changes nothing), not the same numbers."""
        if self.repetition == 1.0:
            return bias
        # This choice's own tokens first, then the prompt's, within the worker's bias bound.
        seen = (sorted(self.counts) + sorted(self.prompt_tokens - self.counts.keys()))[:MAX_BIAS_ENTRIES]
        out = dict(bias or {})
        for tok, lp in zip(seen, dist.logprob(seen), strict=True):
            if math.isfinite(lp):
                out[tok] = out.get(tok, 0.0) + (self.repetition - 1.0) * lp
        if len(out) > MAX_BIAS_ENTRIES:
            out = dict(sorted(out.items(), key=lambda kv: -abs(kv[1]))[:MAX_BIAS_ENTRIES])
        return out or None

    def bias(self, step):
        bias = dict(self.logit_bias)
        if self.presence or self.frequency:
            for tok, count in self.counts.items():
                bias[tok] = bias.get(tok, 0.0) - (count * self.frequency + self.presence)
        if step < self.min_tokens:
            bias.update(dict.fromkeys(self.ends, BARRED))
        if len(bias) > MAX_BIAS_ENTRIES:  # the worker's map bound: keep the strongest offsets
            bias = dict(sorted(bias.items(), key=lambda kv: -abs(kv[1]))[:MAX_BIAS_ENTRIES])
        return bias or None

    def _seed(self, step):
        return None if self.seed is None else int(self.seed) * 1_000_003 + self.index * 10_007 + step

    def params(self, step, mask=None):
        """``pred_token``'s choice arguments for the token at ``step`` (as :meth:`choose` makes it)."""
        temperature = max(self.temperature, 0.0)
        return {
            "temperature": temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self._seed(step) if temperature > 0 else None,
            "mask": mask,
            "bias": self.bias(step),
        }

    def counted(self, tok):
        """Note a token the worker chose (penalties count it)."""
        self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok

    def choose(self, dist, step, mask=None, count=True):
        bias = self.repetition_bias(dist, self.bias(step))
        if self.min_p > 0 and mask is None:
            top = dist.topk(MIN_P_CANDIDATES)
            floor = top.logprobs[0] + math.log(self.min_p)
            mask = [i for i, lp in zip(top.ids, top.logprobs, strict=False) if lp >= floor]
        if self.temperature <= 0:
            tok = dist.argmax(mask=mask, bias=bias)
        else:
            seed = self._seed(step)
            tok = dist.sample(self.temperature, self.top_p, top_k=self.top_k, seed=seed, mask=mask, bias=bias)
        if count:
            self.counts[tok] = self.counts.get(tok, 0) + 1
        return tok


def _held_back(text, stops):
    """How many trailing characters could still grow into a stop string (not streamed yet).
    An incomplete character at the end (U+FFFD until its next byte token comes, never streamed)
    may complete one: what comes before it is held with it."""
    body = text[:-1] if text.endswith("\ufffd") else text
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(body)), 0, -1):
            if body.endswith(stop[:k]):
                hold = max(hold, k)
                break
    return hold + len(text) - len(body) if hold else 0


def _first(text, needles):
    """(position, needle) of the earliest needle in ``text``, or (-1, None)."""
    found = [(text.find(s), s) for s in needles if s in text]
    return min(found) if found else (-1, None)


def _token_logprob(dist, tok, k, vocab):
    """``[token text, logprob, [[alternative text, logprob], ...]]`` of a chosen token."""
    lp = dist.logprob([tok])[0]
    top = []
    if k:
        alternatives = dist.topk(k)
        top = [[vocab.text(i), float(p)] for i, p in zip(alternatives.ids, alternatives.logprobs, strict=False)]
    return [vocab.text(tok), float(lp), top]


class Streamer:
    """Detokenises and streams a choice's text on its own thread while the decode goes on.

    Used when the program decodes token by token (a penalty counts the tokens so far) but need
    not look at the text before the next forward: nothing is watched. Then the two round trips a
    token costs (``detokenize`` of the answer so far, ``send_to_user``) need not sit between one
    forward and the next. Each token's text goes out as its own message, in order, even when
    several arrived during one send: the bytes a run streams (which its bill counts) then depend
    on the tokens alone, not on how fast sends were against the decode. The choice sends the
    final text itself after :meth:`close`.
    """

    def __init__(self, choice, ids):
        self.choice, self.ids = choice, ids
        self.queue = queue.SimpleQueue()
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def push(self):
        """The decode appended a token to ``ids``."""
        self.queue.put(len(self.ids))

    def close(self):
        """Stop after what is being sent; re-raise a failure of the streaming thread."""
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def _run(self):
        try:
            while True:
                count = self.queue.get()
                if count is None:
                    return
                self.choice.stream(detokenize(self.ids[:count]), final=False)
        except Exception as exc:  # handed to the decode thread by ``close``
            self.error = exc


class Choice:
    """One choice's decode: text (stops, streaming), then tool calls when asked or chosen.

    ``first`` is the prompt's distribution (a Dist), or the first token already chosen by the
    worker in the prefill's ``pred_token`` (an int, with the ``text_mask`` it was chosen under)."""

    def __init__(self, index, kv, first, args, ctx, text_mask=None, prompt=()):
        self.index, self.kv, self.args, self.ctx = index, kv, args, ctx
        #: The response grammar's state the prefill already chose the first token under.
        self.text_mask = text_mask
        self.dist, self.token = (None, first) if isinstance(first, int) else (first, None)
        self.sampler = Sampler(args, index, frozenset(ctx.eos), prompt)
        self.max_tokens = int(args["max_tokens"])
        self.stops = args.get("stop") or []
        self.logprobs = args.get("logprobs")
        #: The worker chooses each text token inside its ``pred`` (see the module docstring).
        self.fused = _fused(args)
        #: Every step chooses alike: the worker may decode many tokens in one call.
        self.same_choice = self.fused and not (
            self.sampler.presence or self.sampler.frequency or self.sampler.min_tokens or self.sampler.repetition != 1.0
        )
        self.steps = 0
        self.sent = ""
        self.pending = []  # logprob entries not streamed yet
        self.entries = []
        self.calls = []
        self.send_lock = threading.Lock()  # the Streamer and the decode both send

    def _on_kv(self, call):
        """``call(kv)`` on this choice's KV; a conversation's file that meets its tenant's
        stored-KV budget is left as it is and the turn goes on in a private copy-on-write fork."""
        try:
            return call(self.kv)
        except NoSpace:
            if not self.ctx.conversation:
                raise
            self.ctx.conversation = False
            self.kv = kv_fork(self.kv)
            return call(self.kv)

    def _pred(self, ids):
        return self._on_kv(lambda kv: pred(kv, ids))

    def next_token(self, mask):
        """The token at ``self.steps``: chosen by the worker already (fused) or from the Dist."""
        if self.token is not None:
            tok, self.token = self.token, None
            return self.sampler.counted(tok)
        return self.sampler.choose(self.dist, self.steps, mask)

    def advance(self, tok, mask):
        """Append ``tok`` to the KV and get ready for :meth:`next_token` (one round trip)."""
        if self.fused:
            params = self.sampler.params(self.steps, mask)
            self.token = self._on_kv(lambda kv: pred_token(kv, [tok], **params))
        else:
            self.dist = self._pred([tok])[-1]

    def decode_in_worker(self, mask, ids, watch):
        """The text phase when every step chooses alike: the worker chooses and appends the
        tokens (``pred_tokens``, in as few calls as it can), ends at a string of ``watch`` too,
        and sends each token's text to the client as it is chosen (``send_text``: no round trip
        to this program per token). Returns the finish reason (the caller cuts the text at a
        string and sends what the worker held back)."""
        eos = self.ctx.eos

        def take(tokens):
            for tok in tokens:
                if tok not in eos:  # (tokens are not counted: only the penalties use the counts)
                    ids.append(tok)
                    self.steps += 1

        tok = self.next_token(mask)
        if tok in eos:
            return "stop"
        take([tok])
        if watch and _first(detokenize(ids), watch)[0] >= 0:  # the prefill's token alone
            return "stop"
        # The prefill's token's text goes out with the first call's (its ``send_context``).
        pending, unsent_tokens = "", 1
        while self.steps < self.max_tokens:
            left, params = self.max_tokens - self.steps, self.sampler.params(self.steps, mask)
            # The text so far (its tail): a string may begin in it and end in the new tokens', and
            # the text sent goes on from it.
            text = {"stop_strings": watch} if watch else {}
            send = {"send_text": {"index": self.index}, "send_pending": pending, "send_context": unsent_tokens}
            chosen = self._on_kv(
                lambda kv, tok=tok, left=left, params=params, text=text, send=send: pred_tokens(
                    kv,
                    [tok],
                    left,
                    stop=sorted(eos),
                    stop_context=ids[-MAX_STOP_CONTEXT_TOKENS:],
                    **text,
                    **send,
                    **params,
                )
            )
            take(chosen)
            with self.send_lock:
                self.sent += chosen.sent_text
            pending, unsent_tokens = chosen.unsent_text, 0
            # The last token is not in the file yet: the next call appends it (fewer than asked
            # came back when a step could not run; that call then says why).
            tok = chosen[-1]
            if tok in eos or chosen.stop_string is not None:
                return "stop"
        return "length"

    def send(self, delta):
        message = {"index": self.index, "delta": delta}
        if self.pending:
            message["logprobs"], self.pending = self.pending, []
        send_to_user(message)

    def stream(self, text, final, hold=0):
        """Send what ``text`` adds to what was sent, less ``hold`` trailing characters that a
        stop string could still claim and (before the end) an incomplete UTF-8 character."""
        stable = text if final else text[: len(text) - hold]
        if stable.endswith("\ufffd") and not final:
            stable = stable[:-1]  # an incomplete multi-byte character: wait for the next token
        with self.send_lock:
            grows = len(stable) > len(self.sent) and stable.startswith(self.sent)
            if grows or (final and self.pending):
                self.send(stable[len(self.sent) :] if grows else "")
                if grows:
                    self.sent = stable

    def text_phase(self):
        """Free text up to EOS, a stop, the token limit or (``auto`` tools) a call's marker.
        Returns (text, finish, whether a call was opened)."""
        ctx = self.ctx
        watch = self.stops + ([CALL_OPEN] if ctx.tool_mode == "auto" else [])
        mask = self.text_mask if self.text_mask is not None else ctx.text_mask()
        ids, finish, opened = [], "length", False
        text, after, tok = "", "", None
        plain = not watch and self.logprobs is None and self.max_tokens > 1
        in_worker = (
            self.same_choice
            and self.max_tokens > 1
            and len(ctx.eos) <= MAX_STOP_TOKENS
            and len(watch) <= MAX_STOP_STRINGS
            and all(len(s) <= MAX_STOP_STRING_CHARS for s in watch)
        )
        streamer = Streamer(self, ids) if plain and not in_worker else None
        try:
            if in_worker:
                finish = self.decode_in_worker(mask, ids, watch)
            else:
                while self.steps < self.max_tokens:
                    tok = self.next_token(mask)
                    if tok in ctx.eos:
                        finish = "stop"
                        break
                    self.steps += 1
                    if self.logprobs is not None:
                        entry = _token_logprob(self.dist, tok, self.logprobs, ctx.vocab)
                        self.entries.append(entry)
                        self.pending.append(entry)
                    ids.append(tok)
                    if streamer is None:  # the text may end the decode: look before the next forward
                        text = detokenize(ids)
                        cut, which = _first(text, watch)
                        if cut >= 0:
                            after = text[cut + len(which) :]
                            text, finish, opened = text[:cut], "stop", which == CALL_OPEN
                            break
                    if self.steps >= self.max_tokens:
                        break  # no forward for a token nobody will read (the limit's last one)
                    if streamer is not None:
                        streamer.push()
                    else:
                        self.stream(text, final=False, hold=_held_back(text, watch))
                    self.advance(tok, mask)
        except QuotaExceeded:
            # The run's token budget (the plan's tokens per run or this month's) ran out: the
            # choice ends as at max_tokens, with what it has, never as a server error.
            finish = "length"
        finally:
            if streamer is not None:
                streamer.close()
        if streamer is not None or in_worker:  # the text is all the tokens', up to a string the worker saw
            text = detokenize(ids)
            cut, which = _first(text, watch)
            if cut >= 0:
                after = text[cut + len(which) :]
                text, finish, opened = text[:cut], "stop", which == CALL_OPEN
                tok = ids[-1]  # the marker's last token (not in the file yet)
        self.stream(text, final=True)
        if opened:  # the marker's last token (and its line break, as calls are written), then the call
            newline = [] if "\n" in after else ctx.newline_ids
            try:
                self.dist = self._pred([tok, *newline])[-1]
            except QuotaExceeded:  # the run's token budget ran out before the call could start
                return text, "length", False
            self.steps += len(newline)
        return text, finish, opened

    def forward(self, ids):
        self.dist = self._pred(ids)[-1]
        self.steps += len(ids)

    def one_call(self):
        """A call's JSON under the call grammar (the model's next tokens): the call, or None
        when the token limit cut it short."""
        ctx = self.ctx
        mask = ctx.call_grammar.state().advancing()
        ids = []
        while self.steps < self.max_tokens:
            try:
                tok = self.sampler.choose(self.dist, self.steps, mask, count=False)
            except QuotaExceeded:  # the run's token budget ran out: as at max_tokens
                return None
            if tok in ctx.grammar_end:
                text = detokenize(ids)
                value = json.loads(text)
                name = value["name"]
                prefix = '{"name":' + json.dumps(name) + ',"arguments":'
                if text.startswith(prefix) and text.endswith("}"):
                    arguments = text[len(prefix) : -1]
                else:
                    arguments = json.dumps(value["arguments"], separators=(",", ":"), ensure_ascii=False)
                call = {"index": len(self.calls), "id": "call_" + os.urandom(12).hex(), "name": name}
                call["arguments"] = arguments
                return call
            ids.append(tok)
            self.steps += 1
            try:
                self.dist = self._pred([tok])[-1]
            except QuotaExceeded:
                return None
        return None

    def call_phase(self):
        """Calls until the model ends (or one call, without parallel calls). Returns the finish."""
        ctx = self.ctx
        while True:
            call = self.one_call()
            if call is None:  # cut short by max_tokens: never returned (not valid JSON yet)
                return "tool_calls" if self.calls else "length"
            self.calls.append(call)
            send_to_user({"index": self.index, "tool_call": call})
            room = self.steps + len(ctx.close_ids) + len(ctx.open_ids) + 2 < self.max_tokens
            if not ctx.parallel or len(self.calls) >= MAX_CALLS or not room:
                return "tool_calls"
            try:
                self.forward(ctx.close_ids)
                ends = ctx.eos | ctx.grammar_end | {ctx.open_ids[0]}
                again = self.sampler.choose(self.dist, self.steps, sorted(ends), count=False)
                if again != ctx.open_ids[0]:
                    return "tool_calls"
                self.forward(ctx.open_ids)
            except QuotaExceeded:  # the run's token budget ran out: the calls so far stand
                return "tool_calls"

    def run(self):
        ctx = self.ctx
        if ctx.tool_mode == "required":
            try:
                self.forward(ctx.open_ids)
                text, opened = "", True
            except QuotaExceeded:  # the run's token budget ran out before the call could start
                text, finish, opened = "", "length", False
        else:
            text, finish, opened = self.text_phase()
        if opened:
            finish = self.call_phase()
            text = text.rstrip()
            self.sent = text
        choice = {"index": self.index, "text": text, "finish_reason": finish, "completion_tokens": self.steps}
        if self.calls:
            choice["tool_calls"] = self.calls
        if self.logprobs is not None:
            choice["logprobs"] = self.entries
        return choice


class Context:
    """What every choice of the request shares."""

    def __init__(self, args):
        info = session().info  # what the worker said at connect: no round trip
        self.vocab_size = info.vocab_size
        stop_ids = {int(t) for t in args.get("stop_token_ids") or []}
        #: Tokens that end a choice: the model's EOS (unless ``ignore_eos``) and ``stop_token_ids``.
        self.eos = (set() if args.get("ignore_eos") else set(info.eos_token_ids)) | stop_ids
        self.grammar_end = set(info.eos_token_ids)
        self.vocab = Vocab()
        tools = args.get("tools")
        self.tool_mode = tools["mode"] if tools else None
        self.parallel = bool(tools and tools.get("parallel"))
        self.response_grammar = self.call_grammar = None
        #: Whether the root KV is a conversation's named file (see ``Choice._pred``).
        self.conversation = bool(args.get("conversation"))
        for tok in list(stop_ids) + [int(k) for k in args.get("logit_bias") or {}]:
            if not 0 <= tok < self.vocab_size:
                param = "logit_bias" if str(tok) in (args.get("logit_bias") or {}) else "stop_token_ids"
                raise Invalid(f"token id {tok} is outside the vocabulary (size {self.vocab_size})", param)
        if args.get("json_schema") is not None:
            try:
                self.response_grammar = grammar(args["json_schema"])
            except InvalidArgument as exc:
                raise Invalid(f"response_format: {exc.message}", "response_format") from None
            except Busy as exc:
                raise GrammarBusy(exc.message) from None
        if tools:
            try:
                self.call_grammar = grammar(tools["call_schema"])
            except InvalidArgument as exc:
                raise Invalid(f"tools: the call grammar does not compile: {exc.message}", "tools") from None
            except Busy as exc:
                raise GrammarBusy(exc.message) from None
            self.open_ids = tokenize(CALL_OPEN + "\n")
            self.close_ids = tokenize(CALL_CLOSE)
            self.newline_ids = tokenize("\n")

    def text_mask(self):
        """A fresh state of the response grammar that the worker advances (or None)."""
        return self.response_grammar.state().advancing() if self.response_grammar is not None else None

    def fused_prefill(self, args, n):
        """Whether the prompt's ``pred`` may choose the first token too (``pred_token``): one
        choice, no logprobs or min-p, and text comes first (not a forced tool call)."""
        return n == 1 and _fused(args) and self.tool_mode != "required"


def _prompt_logprobs(kv, prompt, k, vocab):
    """Prefill ``prompt`` into ``kv``; the distribution after it and the prompt's own logprob
    entries (the first token has none)."""
    if len(prompt) > MAX_ECHO_LOGPROB_TOKENS:
        raise Invalid(f"echo with logprobs takes prompts of at most {MAX_ECHO_LOGPROB_TOKENS} tokens", "echo")
    dists = pred(kv, prompt, positions=list(range(len(prompt))))
    entries = [[vocab.text(prompt[0]), None, []]]
    for i in range(1, len(prompt)):
        entries.append(_token_logprob(dists[i - 1], prompt[i], k, vocab))
    for d in dists[:-1]:
        d.release()
    return dists[-1], entries


#: Why a conversation's KV file cannot be used as it is: then a fresh KV is computed.
UNUSABLE_FILE = (KVNotFound, KVExists, Busy, QuotaExceeded, NoSpace, PermissionDenied, InvalidArgument)


def _conversation_file(conversation):
    """The conversation's KV file (see the module docstring), or a fresh anonymous KV."""
    name, write = conversation["name"], bool(conversation.get("write", True))
    try:
        return kv_open(name, "w" if write else "r")
    except KVNotFound:
        if write:
            try:  # recomputable from the stored items: written to the store once idle
                return kv_create(name, durable=False)
            except UNUSABLE_FILE:
                pass
    except Busy:  # another turn of this conversation writes it now: start from a private copy
        try:
            return kv_open(name, "r")
        except UNUSABLE_FILE:
            pass
    except UNUSABLE_FILE:
        pass
    return kv_create()


def _continue(conversation, prompt, prefill):
    """(kv, what ``prefill`` returned for the new tokens, prompt tokens reused from the
    conversation's file, tokens the file held when opened)."""
    kv = _conversation_file(conversation)
    held = kv_tokens(kv)
    common, limit = 0, min(len(held), len(prompt) - 1)  # at least one token is predicted
    while common < limit and held[common] == prompt[common]:
        common += 1
    if common < len(held):
        kv_truncate(kv, common)
    try:
        first = prefill(kv, prompt[common:])
    except NoSpace:  # the file meets the tenant's stored-KV budget: go on in a private copy
        kv = kv_fork(kv)
        first = prefill(kv, prompt[common:])
    return kv, first, common, len(held)


def _refused(prompt, exc):
    """Why the prompt was not processed: the worker's shared KV pool had no pages for this
    account now (``kv_pool_busy``: load, not the request; the API answers 429), else the
    prompt is more than this request may process (the model's context, the run's page cap or
    token budget: ``context_length_exceeded``, 400)."""
    if isinstance(exc, KVPoolFull):
        message = f"the worker's KV cache has no room for this request now; retry later ({exc})"
        return {"refused": {"code": "kv_pool_busy", "message": message, "prompt_tokens": len(prompt)}}
    message = f"the prompt is {len(prompt)} tokens, more than this request may process ({exc})"
    return {"refused": {"code": "context_length_exceeded", "message": message, "prompt_tokens": len(prompt)}}


def main(args):
    try:
        ctx = Context(args)
    except Invalid as exc:
        return {"invalid_request": {"message": exc.message, "param": exc.param}}
    except GrammarBusy as exc:
        return {"refused": {"code": "grammar_busy", "message": exc.message, "prompt_tokens": 0}}
    if "messages" in args:
        prompts = [apply_chat_template(args["messages"], add_generation_prompt=True)]
    else:
        prompts = [tokenize(p) if isinstance(p, str) else [int(t) for t in p] for p in args["prompts"]]
    n = int(args.get("n", 1))
    echo = bool(args.get("echo"))
    jobs, prompt_tokens, cached_tokens, opened_tokens = [], 0, 0, 0
    for p_index, prompt in enumerate(prompts):
        if not prompt:
            return {"invalid_request": {"message": "a prompt tokenizes to no tokens", "param": "prompt"}}
        if any(not 0 <= t < ctx.vocab_size for t in prompt):
            return {"invalid_request": {"message": "a prompt token id is outside the vocabulary", "param": "prompt"}}
        root = None if args.get("conversation") else kv_create()
        prompt_entries = text_mask = None
        if ctx.fused_prefill(args, n):  # the worker chooses the first token in the prefill
            text_mask = ctx.text_mask()
            params = Sampler(args, p_index, frozenset(ctx.eos)).params(0, text_mask)

            def prefill(kv, ids, params=params):
                return pred_token(kv, ids, **params)
        else:

            def prefill(kv, ids):
                return pred(kv, ids)[-1]

        try:
            if root is None:
                root, first, reused, opened = _continue(args["conversation"], prompt, prefill)
                cached_tokens += reused
                opened_tokens += opened
            elif echo and args.get("logprobs") is not None:
                first, prompt_entries = _prompt_logprobs(root, prompt, int(args["logprobs"]), ctx.vocab)
            else:
                first = prefill(root, prompt)
        except Invalid as exc:
            return {"invalid_request": {"message": exc.message, "param": exc.param}}
        except (QuotaExceeded, NoSpace) as exc:
            return _refused(prompt, exc)
        prompt_tokens += len(prompt)
        echoed = detokenize(prompt) if echo else ""
        kvs = [root] + [kv_fork(root) for _ in range(n - 1)]
        for j in range(n):
            jobs.append((p_index * n + j, kvs[j], first, echoed, prompt_entries, text_mask, prompt))

    choices = [None] * len(jobs)
    errors = []

    def decode(job):
        index, kv, first, echoed, prompt_entries, text_mask, prompt = job
        try:
            if echoed:
                message = {"index": index, "delta": echoed}
                if prompt_entries is not None:
                    message["logprobs"] = prompt_entries
                send_to_user(message)
            choice = Choice(index, kv, first, args, ctx, text_mask, prompt).run()
            if echoed:
                choice["text"] = echoed + choice["text"]
                if prompt_entries is not None:
                    choice["logprobs"] = prompt_entries + choice["logprobs"]
            choices[index] = choice
        except Exception as exc:  # re-raised below so the run fails with the real cause
            errors.append(exc)

    if len(jobs) == 1:  # one choice (n=1, the usual request): no thread to start and join
        decode(jobs[0])
    else:
        threads = [threading.Thread(target=decode, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        if isinstance(errors[0], KVPoolFull):  # the pool filled up during the decode: load, not the request
            return _refused(prompts[0], errors[0])
        raise errors[0]
    completion = sum(c.pop("completion_tokens") for c in choices)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion}
    if args.get("conversation"):
        # What the file held when opened: the worker meters all of it as cached at the open,
        # however little of it this prompt shares (api/services/responses.py: usage).
        usage["cached_tokens"], usage["opened_tokens"] = cached_tokens, opened_tokens
    return {"choices": choices, "usage": usage}
