"""Engram in-process: an on-device LLM runtime whose KV caches are kept, shared and persisted
per agent without the caller's help.

    import engram
    eng = engram.Engine()   # the default chat model, as `engram serve` finds it
    r = eng.chat([{"role": "user", "content": "What is the capital of France?"}], temperature=0)
    print(r["choices"][0]["message"]["content"])

`Engine` runs the same engine and policy stack as `engram serve` (sessions, shared prefixes,
persistence to its data directory); `engram.compat.Llama` is llama-cpp-python's API over it.
"""

import atexit as _atexit
import weakref as _weakref

from ._engram import Agent, ChatStream, EngramError, Rag, Session, __version__, synth_corpus
from ._engram import Engine as _Engine

__all__ = ["Engine", "Agent", "Session", "ChatStream", "Rag", "EngramError", "synth_corpus", "__version__"]

# Engines still open when the interpreter exits are closed first, so their sessions reach the
# disk before the process ends (module globals are not reliably finalized).
_open = _weakref.WeakSet()


class Engine(_Engine):
    __doc__ = _Engine.__doc__

    def __init__(self, *args, **kwargs):
        _open.add(self)


@_atexit.register
def _close_all():
    for e in list(_open):
        try:
            e.close()
        except Exception:
            pass
