"""Tool-call turns that ended, their blocks not freed yet.

A turn ends (`on_turn_end`: the tool starts) before vLLM frees its blocks
(`on_blocks_freed`): at once, or a while later when a KV connector sends
them first. In between, the turn waits here to become a pin, by request id
and per session. If its next turn is allocated meanwhile, it is
superseded: that turn holds the context already, and a pin would only
expire.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_continuum.core.hints import Hints
from vllm_continuum.core.indexes import discard
from vllm_continuum.core.programs import Program


@dataclass(slots=True)
class PendingPin:
    """A finished tool-call turn whose blocks have not been freed yet."""

    session: str
    tool: str
    hints: Hints
    program: Program
    seq: int  # the controller's arrival count when it ended: later arrivals may continue it
    superseded: bool = False  # its next turn was allocated meanwhile: it holds the context


class PendingPins:
    def __init__(self) -> None:
        self._by_request: dict[str, PendingPin] = {}
        self._of_session: dict[str, dict[str, PendingPin]] = {}

    def add(self, request_id: str, pending: PendingPin) -> None:
        self._by_request[request_id] = pending
        self._of_session.setdefault(pending.session, {})[request_id] = pending

    def pop(self, request_id: str) -> PendingPin | None:
        """The request's pending pin, if any, now its blocks are freed."""
        pending = self._by_request.pop(request_id, None)
        if pending is not None:
            discard(self._of_session, pending.session, request_id)
        return pending

    def supersede(self, session: str, program: Program) -> None:
        """`program`'s next turn was allocated: its pending pins hold nothing it needs."""
        for pending in self._of_session.get(session, {}).values():
            if pending.program is program:
                pending.superseded = True
