"""Sessions and where they live.

A `Session` is plain data (pydantic, so any store can serialize it): the
OpenAI-format history, the tools the session may use, and its last traces.
`SessionStore` is the small async interface the service needs; the default
`InMemorySessionStore` is bounded (at most `max_sessions`) and forgets a
session `ttl_s` after it was last used. A Redis- or database-backed store
implements the same four methods.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from vllm_continuum.agent.trace import TurnTrace

__all__ = [
    "InMemorySessionStore",
    "Session",
    "SessionStore",
    "StoreFull",
]


def new_session_id() -> str:
    return "sess-" + uuid.uuid4().hex


class Session(BaseModel):
    id: str = Field(default_factory=new_session_id)
    created_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[str] | None = None  # None: every tool of the registry
    turns: int = 0
    # Newest last; bounded by the loop (`LoopConfig.max_traces`).
    traces: list[TurnTrace] = Field(default_factory=list)


class StoreFull(Exception):
    """The store holds its maximum number of live sessions."""


@runtime_checkable
class SessionStore(Protocol):
    async def create(self, session: Session) -> None:
        """Add a new session; StoreFull if there is no room, ValueError if the id exists."""

    async def get(self, session_id: str) -> Session | None:
        """The session, or None if unknown or expired. Counts as a use."""

    async def save(self, session: Session) -> None:
        """Persist the session's current state (an upsert: never loses a turn's work)."""

    async def delete(self, session_id: str) -> bool:
        """Forget the session; False if it was unknown."""


class InMemorySessionStore:
    """Bounded, expiring, in-process store: sessions die with the process.

    `get` returns the stored object itself, so the loop's in-place updates
    are visible at once; `save` still must be called (it refreshes expiry,
    and other stores depend on it). Expiry is lazy (on every call) and
    ordered by last use, so purging costs O(expired).
    """

    def __init__(
        self,
        max_sessions: int = 1000,
        ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_sessions < 1 or not ttl_s > 0:
            raise ValueError("max_sessions must be >= 1 and ttl_s > 0")
        self.max_sessions = max_sessions
        self.ttl_s = ttl_s
        self._clock = clock
        # id -> (last use, session), least recently used first
        self._sessions: OrderedDict[str, tuple[float, Session]] = OrderedDict()

    def __len__(self) -> int:
        self.purge_expired()
        return len(self._sessions)

    def purge_expired(self) -> int:
        now = self._clock()
        dead = 0
        while self._sessions:
            sid, (last, _) = next(iter(self._sessions.items()))
            if now - last < self.ttl_s:
                break
            del self._sessions[sid]
            dead += 1
        return dead

    def _touch(self, session: Session) -> None:
        self._sessions[session.id] = (self._clock(), session)
        self._sessions.move_to_end(session.id)

    async def create(self, session: Session) -> None:
        self.purge_expired()
        if session.id in self._sessions:
            raise ValueError(f"session {session.id!r} already exists")
        if len(self._sessions) >= self.max_sessions:
            raise StoreFull(
                f"the session store is full ({self.max_sessions} live sessions); "
                f"delete sessions or wait for idle ones to expire ({self.ttl_s:g} s)"
            )
        self._touch(session)

    async def get(self, session_id: str) -> Session | None:
        self.purge_expired()
        entry = self._sessions.get(session_id)
        if entry is None:
            return None
        self._touch(entry[1])
        return entry[1]

    async def save(self, session: Session) -> None:
        # An upsert even when full: a session that expired during its own
        # turn comes back rather than losing the turn (at most one per turn).
        self.purge_expired()
        session.updated_at = time.time()
        self._touch(session)

    async def delete(self, session_id: str) -> bool:
        return self._sessions.pop(session_id, None) is not None
