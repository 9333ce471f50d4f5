"""Idle chat sessions, held compressed and bounded: the least recently used give their caches up first.

    IDLE.busy(session)                       # a turn starts: the session is never touched while it runs
    IDLE.rest(session, limits.max_idle_mib)  # the turn ended: compact its caches, then keep the total bounded
    IDLE.forget(session)                     # Clear, or the browser tab closed

Between turns a session holds its native cache and its codec cache at rest (ChatSession.rest: the codec
cache keeps its archive and raw tokens only; a decoded view is rebuilt when the next turn starts). The
bytes every idle session holds are summed; past the operator's bound (CODECKV_MAX_IDLE_MIB, README
"Deploying") the least recently used idle sessions release their caches (ChatSession.evict), and their
next turn prefills the conversation again and says so. A session that is running a turn is not in the
registry, so it is never evicted. Sessions are held by weak reference: a session Gradio dropped is gone.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

MIB = 1 << 20


class IdleSessions:
    """The registry of idle sessions, oldest first, with the bytes each holds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: OrderedDict[int, tuple[weakref.ref, int]] = OrderedDict()  # id -> (session, held bytes)

    def busy(self, session) -> None:
        """`session` starts a turn: take it out of the idle registry (it cannot be evicted while it runs)."""
        with self._lock:
            self._idle.pop(id(session), None)

    def forget(self, session) -> None:
        """`session` is cleared or closed: stop counting it."""
        self.busy(session)

    def rest(self, session, max_idle_mib: int) -> list:
        """Compact `session` (ChatSession.rest), count it as the most recent idle one, evict past the bound.

        Returns the sessions evicted now (their caches released), oldest first; `session` itself is among
        them only when it alone holds more than the bound.
        """
        held = session.rest()
        evicted = []
        with self._lock:
            self._idle.pop(id(session), None)
            self._idle[id(session)] = (weakref.ref(session), held)
            budget = max_idle_mib * MIB
            for key in list(self._idle):
                if self._total() <= budget:
                    break
                ref, _ = self._idle.pop(key)
                other = ref()
                if other is not None:
                    other.evict(f"its caches were released while it was idle: idle sessions may hold "
                                f"{max_idle_mib:,} MiB in all here (CODECKV_MAX_IDLE_MIB)")
                    evicted.append(other)
        return evicted

    def _total(self) -> int:
        return sum(held for ref, held in self._idle.values() if ref() is not None)

    @property
    def held_bytes(self) -> int:
        """What the idle sessions hold together, as counted when each went idle."""
        with self._lock:
            return self._total()

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for ref, _ in self._idle.values() if ref() is not None)


IDLE = IdleSessions()  # the process's registry (app.py's chat handlers)
