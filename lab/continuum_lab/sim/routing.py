"""Routers in front of N simulated engines: which instance serves a request.

A pin lives in one engine's memory, so across instances it pays only if the
session's next turn reaches that engine. The routers modelled here are the
ones deployments run (vllm-router's policies, llm-d's scorers, Dynamo's KV
router, in their simplest form), so that the simulator can say what each
costs or saves. A router decides when the request arrives and sees what a
real one can: the request (its session id, its prompt's block hashes) and,
per instance, its load and (for `cache_aware`) its prefix-cache hit.

- `round_robin`: requests in turn. No affinity: with N instances a
  session's next turn lands where its last one ran about 1 time in N.
- `consistent_hash`: the session id on a hash ring with virtual nodes
  (requests without a session: round robin). Every turn of a session
  reaches one instance, whatever its load: a few heavy sessions can pile
  up on one instance while others idle.
- `consistent_hash_bounded`: consistent hashing with bounded loads
  (Mirrokni, Thorup, Zadimoghaddam, SODA 2018; HAProxy's
  `hash-balance-factor`): no instance takes a request while its load is at
  ceil((1 + eps) x the mean load, this request counted); the request passes
  clockwise along the ring to the next instance under the bound. Stateless:
  a turn that was passed on does not stay passed on, the next one hashes
  home again.
- `least_loaded`: the instance with the fewest requests in flight (running,
  waiting, or routed and not yet added: what a router counts, without any
  KV usage figure); ties to the lowest index.
- `cache_aware`: the instance whose KV cache holds the longest prefix of the
  request's prompt, asked of its real KV cache manager without allocating
  (the hit a router learns from KV events: llm-d's precise prefix-cache
  scorer, vllm-router's `kv_aware`); ties, a cold prompt's included, to the
  least loaded. Pinned blocks are cached blocks, so a pin draws its
  session's next turn. Real routers weigh the hit against load (Dynamo's
  cost, llm-d's scorer weights); this one never trades a hit for load.

"Load" is a request count in every router: agents in a tool call hold no
request, so a session counts only while one of its turns is in flight.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import math
from collections.abc import Iterator, Sequence
from typing import Protocol

ROUTINGS = ("round_robin", "consistent_hash", "consistent_hash_bounded", "least_loaded", "cache_aware")
VIRTUAL_NODES = 100  # ring points per instance (assumption; enough to even out the arcs)
BOUNDED_EPS = 0.25  # HAProxy's hash-balance-factor 125, the paper's example


class InstanceView(Protocol):
    """What a router sees of one instance."""

    @property
    def load(self) -> int: ...

    def cached_tokens(self, request) -> int: ...


def ring_hash(key: str) -> int:
    """A stable 64-bit hash (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


class HashRing:
    """Instance i owns the points ring_hash(f"instance-{i}#{v}") for v < vnodes; a
    key belongs to the owner of the first point at or after ring_hash(key), wrapping."""

    def __init__(self, num_instances: int, vnodes: int = VIRTUAL_NODES) -> None:
        points = sorted((ring_hash(f"instance-{i}#{v}"), i)
                        for i in range(num_instances) for v in range(vnodes))
        self._points = [p for p, _ in points]
        self._owners = [i for _, i in points]
        self._num_instances = num_instances

    def walk(self, key: str) -> Iterator[int]:
        """The distinct instances clockwise from the key: its owner first."""
        start = bisect.bisect_left(self._points, ring_hash(key))
        seen: set[int] = set()
        for j in range(len(self._points)):
            owner = self._owners[(start + j) % len(self._points)]
            if owner not in seen:
                seen.add(owner)
                yield owner
                if len(seen) == self._num_instances:
                    return


class Router:
    name = ""

    def __init__(self, num_instances: int) -> None:
        self.num_instances = num_instances
        self._turn = itertools.cycle(range(num_instances))

    def route(self, request, instances: Sequence[InstanceView]) -> int:
        raise NotImplementedError

    def _round_robin(self) -> int:
        return next(self._turn)


class RoundRobin(Router):
    name = "round_robin"

    def route(self, request, instances: Sequence[InstanceView]) -> int:
        return self._round_robin()


class ConsistentHash(Router):
    """eps None: plain consistent hashing; a number: with loads bounded by (1 + eps) x mean."""

    def __init__(self, num_instances: int, vnodes: int = VIRTUAL_NODES, eps: float | None = None) -> None:
        super().__init__(num_instances)
        self.ring = HashRing(num_instances, vnodes)
        self.eps = eps
        self.name = "consistent_hash" if eps is None else "consistent_hash_bounded"

    def route(self, request, instances: Sequence[InstanceView]) -> int:
        if not request.session_id:
            return self._round_robin()
        walk = self.ring.walk(request.session_id)
        if self.eps is None:
            return next(walk)
        loads = [inst.load for inst in instances]
        cap = math.ceil((1 + self.eps) * (sum(loads) + 1) / len(loads))
        return next(i for i in walk if loads[i] < cap)  # the mean is below cap: one is


class LeastLoaded(Router):
    name = "least_loaded"

    def route(self, request, instances: Sequence[InstanceView]) -> int:
        return min(range(len(instances)), key=lambda i: (instances[i].load, i))


class CacheAware(Router):
    name = "cache_aware"

    def route(self, request, instances: Sequence[InstanceView]) -> int:
        return min(range(len(instances)),
                   key=lambda i: (-instances[i].cached_tokens(request), instances[i].load, i))


def make_router(name: str, num_instances: int, *, eps: float = BOUNDED_EPS,
                vnodes: int = VIRTUAL_NODES) -> Router:
    if name == "round_robin":
        return RoundRobin(num_instances)
    if name == "consistent_hash":
        return ConsistentHash(num_instances, vnodes)
    if name == "consistent_hash_bounded":
        return ConsistentHash(num_instances, vnodes, eps=eps)
    if name == "least_loaded":
        return LeastLoaded(num_instances)
    if name == "cache_aware":
        return CacheAware(num_instances)
    raise ValueError(f"unknown routing {name!r}; known: {', '.join(ROUTINGS)}")
