"""The handlers of every op, grouped by concern, and the tables the server dispatches with.

* ``pred``: the call every generated token makes, from decoded arguments to reply, relayed
  without a Task (``pred.PredRelay``);
* ``kv``: KV files; ``dist``: Dist handles, grammars and their states; ``text``: tokenizer;
  ``io``: the run's output, result, brokered HTTP and sleep; ``channels``: messages between the
  runs of a tree; ``procs``: child runs; ``admin``: the control plane's ops.

Each handler is registered for its op's class in ``gpu_worker/protocol.py`` and receives the
arguments that class decoded, and a context: a LIP's ops get the narrow ``context.OpContext``,
never the ``Worker``; the control plane's ops get the ``Worker`` itself (``server.py`` passes
it), typed as ``admin.AdminContext``, the protocol naming the part of it they may use. Errors of
KVFS, the scheduler and the handlers become wire codes in one place (``errors.wire_error``).
"""

from gpu_worker.ops import admin, channels, dist, io, kv, pred, procs, text
from gpu_worker.ops.registry import ADMIN_HANDLERS, LIP_HANDLERS, RELAYED

__all__ = [
    "ADMIN_HANDLERS",
    "LIP_HANDLERS",
    "RELAYED",
    "admin",
    "channels",
    "dist",
    "io",
    "kv",
    "pred",
    "procs",
    "text",
]
