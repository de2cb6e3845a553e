"""How long to keep a finished tool-call turn's KV cache pinned.

A TTL policy is the replaceable part of the design: the scheduler asks
`decide(turn)` when a turn ends in a tool call and pins for the answer (0
means do not pin). Every policy shares the same envelope: a client's
`continuum_ttl_s` hint wins over the policy's own choice, and `max_ttl_s`
caps everything, so no client and no model can hold memory longer than the
operator allows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from vllm_continuum.config import ContinuumConfig


@dataclass(frozen=True)
class TurnEnd:
    """What a policy may know about a turn that just ended in a tool call."""

    session_id: str
    tool: str
    num_prompt_tokens: int
    num_blocks: int
    hinted_ttl_s: float | None = None


@dataclass(frozen=True)
class TTLDecision:
    ttl_s: float
    source: str  # "hint", "tool", "default", "never", ... (logged and tested)


class TTLPolicy(ABC):
    name: str
    honours_hints = True

    def __init__(self, max_ttl_s: float) -> None:
        self.max_ttl_s = max_ttl_s

    def decide(self, turn: TurnEnd) -> TTLDecision:
        if self.honours_hints and turn.hinted_ttl_s is not None:
            decision = TTLDecision(turn.hinted_ttl_s, "hint")
        else:
            decision = self.choose(turn)
        if decision.ttl_s > self.max_ttl_s:
            return TTLDecision(self.max_ttl_s, decision.source + "+cap")
        return decision

    @abstractmethod
    def choose(self, turn: TurnEnd) -> TTLDecision:
        """The policy's own TTL, before hints and the cap."""

    def observe_tool_duration(self, tool: str, seconds: float) -> None:
        """Learn from a measured tool duration (policies that learn override this)."""


class FixedTTLPolicy(TTLPolicy):
    """A configured TTL per tool name, else a default."""

    name = "fixed"

    def __init__(
        self, default_ttl_s: float, tool_ttl_s: Mapping[str, float], max_ttl_s: float
    ) -> None:
        super().__init__(max_ttl_s)
        self.default_ttl_s = default_ttl_s
        self.tool_ttl_s = dict(tool_ttl_s)

    def choose(self, turn: TurnEnd) -> TTLDecision:
        if turn.tool in self.tool_ttl_s:
            return TTLDecision(self.tool_ttl_s[turn.tool], "tool")
        return TTLDecision(self.default_ttl_s, "default")


class NeverTTLPolicy(TTLPolicy):
    """Stock vLLM behaviour (never pin, hints ignored): the A/B baseline."""

    name = "never"
    honours_hints = False

    def choose(self, turn: TurnEnd) -> TTLDecision:
        return TTLDecision(0.0, "never")


def make_ttl_policy(config: ContinuumConfig) -> TTLPolicy:
    if config.ttl_policy == "never":
        return NeverTTLPolicy(config.max_ttl_s)
    return FixedTTLPolicy(config.default_ttl_s, config.tool_ttl_s, config.max_ttl_s)
