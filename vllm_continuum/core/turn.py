"""A request as the pin rules see it, and what they keep about it until it
finishes: read by the controller (controller.py) and the queue rules
(queue_rules.py) alike."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from vllm_continuum.core.hints import Hints
from vllm_continuum.core.pin_table import Pin
from vllm_continuum.core.programs import Program


class TurnRequest(Protocol):
    """The attributes of a vLLM `Request` the controller reads."""

    request_id: str
    session_id: str | None
    block_hashes: Sequence[Hashable]
    num_prompt_tokens: int
    num_tokens: int
    num_output_tokens: int
    priority: int
    status: object  # compared with the statuses the controller is given
    cache_salt: str | None  # its tenant (tool_stats.py)


@dataclass(slots=True)
class Turn:
    """What the controller keeps about a request until it finishes."""

    hints: Hints
    # Times are the controller's clock, never vLLM's wall-clock arrival stamp.
    arrival: float  # when it reached the scheduler: orders requests, starts bounds
    program_arrival: float  # its program's first arrival if it continues it, else `arrival`
    seq: int = 0  # arrival order, for requests that arrive at the same time
    session: str | None = None
    program: Program | None = None  # the program it belongs to (it continues it, or opened it)
    pin: Pin | None = None  # the pin whose context it continues (pinned lane), while held
    continues: bool = False  # its prompt continues its program's context (it did not open it)
    resuming: tuple[bool, float] | None = None  # (found a pin, arrival) until admitted
    aging_from: float | None = None  # its aging restarted then (queue_rules.py); None: `arrival`
    rank: float = 0  # its program's rank among programs when it arrived (program_order.py)
    cached: int = 0  # prompt tokens it found cached when admitted
    handed_over: bool = False  # its allocation handed its context's pin over (if any)
