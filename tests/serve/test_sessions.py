"""The idle-session registry: compacted on rest, bounded in total, least recently used evicted first."""

import gc

from codeckv.serve.sessions import MIB, IdleSessions


class FakeSession:
    """Holds `mib` MiB at rest until evicted."""

    def __init__(self, mib: int) -> None:
        self.mib, self.evicted, self.rested = mib, None, 0

    def rest(self) -> int:
        self.rested += 1
        return 0 if self.evicted else self.mib * MIB

    def evict(self, why: str) -> None:
        self.evicted = why


def test_past_the_bound_the_least_recently_used_idle_sessions_are_evicted():
    idle = IdleSessions()
    a, b, c = FakeSession(40), FakeSession(40), FakeSession(40)
    assert idle.rest(a, 100) == [] and idle.rest(b, 100) == []
    assert idle.held_bytes == 80 * MIB and a.rested == b.rested == 1
    idle.rest(a, 100)  # a turn of a: now b is the least recently used
    assert idle.rest(c, 100) == [b]
    assert "CODECKV_MAX_IDLE_MIB" in b.evicted and a.evicted is None and c.evicted is None
    assert idle.held_bytes == 80 * MIB and len(idle) == 2


def test_a_busy_session_is_never_evicted():
    idle = IdleSessions()
    a, b = FakeSession(60), FakeSession(60)
    idle.rest(a, 100)
    idle.busy(a)  # a starts a turn
    assert idle.rest(b, 100) == [] and a.evicted is None and len(idle) == 1


def test_a_session_larger_than_the_bound_alone_gives_its_caches_up():
    idle = IdleSessions()
    big = FakeSession(300)
    assert idle.rest(big, 100) == [big] and big.evicted and idle.held_bytes == 0


def test_forgotten_and_dropped_sessions_stop_counting():
    idle = IdleSessions()
    a, b = FakeSession(10), FakeSession(20)
    idle.rest(a, 100)
    idle.rest(b, 100)
    idle.forget(a)
    assert idle.held_bytes == 20 * MIB
    del b
    gc.collect()
    assert idle.held_bytes == 0 and len(idle) == 0
