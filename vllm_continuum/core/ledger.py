"""What the pin controller needs from a KV block pool, and nothing more.

Blocks are opaque here: a pin holds the references a finished request held,
taken and given back through this protocol. vLLM's implementation is
`vllm_continuum.adapter.block_ledger.VllmBlockLedger`; the core's unit tests
use a dictionary of reference counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol


def hashes_per_block(block_size: int, hash_block_size: int | None) -> int:
    """Block hashes per KV block: vLLM hashes at `hash_block_size` tokens
    (the block size unless a hybrid model's groups differ)."""
    return max(1, block_size // (hash_block_size or block_size))


class BlockLedger(Protocol):
    @property
    def pool_size(self) -> int:
        """Usable blocks in the pool: caps and quotas are fractions of it."""

    def take(self, request: Any) -> tuple[list[Any], int]:
        """Take over a finished request's block references: (blocks, fence)."""

    def give_back(self, blocks: Sequence[Any], fence: int) -> None:
        """Drop references (after the fence, if an in-flight step may write them)."""

    def take_back(self, blocks: Iterable[Any]) -> None:
        """Undo `give_back` of blocks nobody has allocated since."""

    def can_give_back_now(self, fence: int) -> bool:
        """Whether giving back now frees the blocks at once (no fence pending)."""

    def ids(self, blocks: Iterable[Any], keep_null: bool = False) -> tuple:
        """Physical block ids in order (null blocks skipped, or None with keep_null)."""

    def ref_count(self, block_id: int) -> int:
        """References to a block: pins, running requests and the requester's hit."""
