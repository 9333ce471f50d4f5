"""The models a deployment serves: only allowed names load, a few stay loaded, a load never blocks the others.

    with POOL.lease("smollm2-135m") as loaded:        # loads once; kept while leased
        ...
    POOL.allowed()                                    # embedded models loadable here + $CODECKV_MODELS

- A name is checked against the allowed list before anything else: an unlisted name (a path, an
  unlisted hub id) is refused without touching the filesystem or the network, and the message lists
  what is allowed, never whether some path exists.
- At most $CODECKV_MAX_MODELS (default 2) models stay loaded; when another one loads, the least
  recently used idle ones are dropped (a model in use by a request is never dropped under it).
- Loading happens outside the pool's lock, so requests for models already loaded go on meanwhile;
  two requests for the same unloaded model wait for one load.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from codeckv.loaded import LoadedModel
from codeckv.models import ModelUnavailableError, available_models, load_model
from codeckv.serve.limits import release_memory

DEFAULT_MAX_MODELS = 2


def max_models() -> int:
    """$CODECKV_MAX_MODELS, default 2 (at least 1)."""
    raw = os.environ.get("CODECKV_MAX_MODELS", str(DEFAULT_MAX_MODELS))
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"CODECKV_MAX_MODELS={raw!r} must be a whole number >= 1")
    return int(raw)


@dataclass
class _Entry:
    ready: threading.Event = field(default_factory=threading.Event)
    loaded: LoadedModel | None = None
    error: Exception | None = None
    users: int = 0
    last_used: float = 0.0


class ModelPool:
    """Loaded models by name, under the rules of the module docstring."""

    def __init__(self, loader: Callable[[str], LoadedModel] = load_model,
                 allowed: Callable[[], list[str]] = available_models, limit: Callable[[], int] = max_models):
        self._loader, self._allowed, self._limit = loader, allowed, limit
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def allowed(self) -> list[str]:
        """The names this pool loads."""
        return self._allowed()

    def check(self, name) -> str:
        """`name` if it is allowed, else a ModelUnavailableError listing what is (nothing else is looked at)."""
        allowed = self.allowed()
        if not isinstance(name, str) or name not in allowed:
            shown = repr(name) if len(repr(name)) <= 80 else repr(name)[:77] + "..."
            raise ModelUnavailableError(f"model {shown} is not served here (allowed: {', '.join(allowed)})")
        return name

    @contextmanager
    def lease(self, name) -> Iterator[LoadedModel]:
        """The loaded model, kept loaded until the block ends; loads it first if needed."""
        name = self.check(name)
        with self._lock:
            entry = self._entries.get(name)
            loads = entry is None
            if loads:
                entry = self._entries[name] = _Entry()
            entry.users += 1
            entry.last_used = time.monotonic()
        try:
            if loads:
                self._load(name, entry)
            entry.ready.wait()
            if entry.error is not None:
                raise entry.error
            yield entry.loaded
        finally:
            with self._lock:
                entry.users -= 1
                entry.last_used = time.monotonic()
                self._evict()

    def get(self, name) -> LoadedModel:
        """The loaded model without keeping a lease (e.g. to describe it)."""
        with self.lease(name) as loaded:
            return loaded

    def loaded_names(self) -> list[str]:
        """Names whose model is loaded now."""
        with self._lock:
            return [n for n, e in self._entries.items() if e.loaded is not None]

    def _load(self, name: str, entry: _Entry) -> None:
        try:
            entry.loaded = self._loader(name)
        except Exception as err:  # noqa: BLE001 - handed to every waiter, then raised in each request
            entry.error = err
            with self._lock:
                self._entries.pop(name, None)
        finally:
            entry.ready.set()

    def _evict(self) -> None:
        """Drop the least recently used idle models beyond the limit (the caller holds the lock)."""
        loaded = [(e.last_used, n) for n, e in self._entries.items() if e.loaded is not None]
        excess = len(loaded) - self._limit()
        for _, name in sorted(loaded):
            if excess <= 0:
                break
            if self._entries[name].users == 0:
                del self._entries[name]
                excess -= 1


POOL = ModelPool()


@contextmanager
def leased(name: str) -> Iterator[LoadedModel]:
    """POOL.lease(name) for one request; after it, the memory the request freed goes back to the system."""
    try:
        with POOL.lease(name) as loaded:
            yield loaded
    finally:
        release_memory()
