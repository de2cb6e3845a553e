"""The figures the engine core hands to the API server, as a file.

The scheduler runs in the engine-core process; `/metrics` is served by the
API-server process(es). The engine core writes one JSON snapshot per
process into a directory both know (`CONTINUUM_METRICS_DIR`), replaced
atomically, and the front end reads every snapshot at scrape time. A file
rather than vLLM's stats channel because the engine does not step while
idle: a snapshot carries each pin's expiry, so the reader can tell at scrape
time that a pin has expired even though the engine has not looked.

Plain Python, no vLLM or prometheus_client import: the engine core imports
it on every step path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ENV_DIR = "CONTINUUM_METRICS_DIR"
FORMAT = 1
_PREFIX, _SUFFIX = "engine-", ".json"

# Upper bounds (seconds) for TTLs, tool durations and hold times: agent tools
# take tens of milliseconds (a lookup) to minutes (a build, a browser task);
# 0 has its own bucket because a TTL of 0 ("do not pin") is a decision too.
BUCKETS: tuple[float, ...] = (
    0.0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0,
    600.0,
)

# An idle engine looks at expired pins only when new work arrives. The front
# end reports such a pin as expired once this long has passed after its TTL,
# so that a turn which arrived just before the TTL, and which the engine has
# not yet published, is not first counted as an expiry and then as a resume.
# The engine applies the same rule when it releases the pin later for another
# reason (see `ContinuumStats.on_release`), so counters never go back.
EXPIRY_GRACE_S = 1.0

# The engine writes at most this often while it works (idle: at once), and
# no more than this share of its time: a snapshot is O(pins) (~10 ms at 4,000
# pins), so with many pins the interval grows to write cost / share.
PUBLISH_INTERVAL_S = 0.25
PUBLISH_TIME_SHARE = 0.01

# The format label of a session turn that called no tool (continuum_session_turns).
NO_CALL = "none"

# Tool names come from model output and client hints: bound the label set.
MAX_TOOL_LABELS = 64
OTHER_TOOL = "__other__"


@dataclass
class Histogram:
    """Per-label bucket counts (not cumulative; the last is +Inf) and sums."""

    series: dict[str, list] = field(default_factory=dict)  # label -> [counts..., sum]

    def observe(self, label: str, value: float) -> None:
        if not math.isfinite(value):
            return
        row = self.series.get(label)
        if row is None:
            row = self.series[label] = [0] * (len(BUCKETS) + 1) + [0.0]
        row[bisect_left(BUCKETS, value)] += 1
        row[-1] += value

    def to_json(self) -> dict[str, list]:
        return {label: list(row) for label, row in self.series.items()}


class ToolLabels:
    """Maps tool names to metric labels: the first `limit` names seen keep
    theirs, later ones share `OTHER_TOOL`, so that a client sending random
    `continuum_tool` hints cannot blow up Prometheus's series count."""

    def __init__(self, limit: int = MAX_TOOL_LABELS) -> None:
        self._known: set[str] = set()
        self._limit = limit

    def __call__(self, tool: str) -> str:
        if tool in self._known:
            return tool
        if len(self._known) < self._limit:
            self._known.add(tool)
            return tool
        return OTHER_TOOL


def snapshot_path(directory: str | os.PathLike, pid: int | None = None) -> Path:
    return Path(directory) / f"{_PREFIX}{os.getpid() if pid is None else pid}{_SUFFIX}"


class SnapshotWriter:
    """Writes one process's snapshot: temp file + os.replace, so a reader
    sees the old or the new one, never half of one. Never raises: metrics
    must not take the engine down (e.g. when the directory's owner exited)."""

    def __init__(self, directory: str | os.PathLike, pid: int | None = None) -> None:
        self.path = snapshot_path(directory, pid)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        self.failed = False

    def write(self, snapshot: Mapping) -> bool:
        try:
            self._tmp.write_text(json.dumps(snapshot, separators=(",", ":")))
            os.replace(self._tmp, self.path)
        except OSError:
            self.failed = True
            return False
        return True


def writer_from_env() -> SnapshotWriter | None:
    directory = os.environ.get(ENV_DIR)
    if not directory or not os.path.isdir(directory):
        return None
    return SnapshotWriter(directory)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_snapshots(directory: str | os.PathLike) -> Iterator[dict]:
    """Every readable snapshot of a live process in `directory`. A dead
    engine's file is skipped: its pins died with it."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
            continue
        try:
            pid = int(name[len(_PREFIX) : -len(_SUFFIX)])
        except ValueError:
            continue
        if not _alive(pid):
            continue
        try:
            data = json.loads((Path(directory) / name).read_text())
        except (OSError, ValueError):
            continue  # vanished or foreign: os.replace never exposes a partial file
        if isinstance(data, dict) and data.get("format") == FORMAT:
            yield data


@functools.lru_cache(maxsize=65536)
def session_digest(session_key: str) -> str:
    """A public name for a session: the first 32 hex digits of the SHA-256 of
    its id. Session ids never leave the engine; a router that knows the id
    computes the same digest (`vllm_continuum.cluster.pins_endpoint`). Ids over 128
    characters are keyed in the engine by their SHA-256 already
    (`sha256:<hex>`), whose digits are reused."""
    if session_key.startswith("sha256:") and len(session_key) == 71:
        return session_key[7:39]
    return hashlib.sha256(session_key.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def pin_rows(pins: Iterable, now: float, kept_past_ttl, tool_label=lambda tool: tool) -> list[list]:
    """[blocks, seconds left, ttl, held (kept past its TTL), session digest, tool label, own
    blocks] per pin: no session ids leave the engine (the digest names a
    session for a router that knows its id, `vllm_continuum.cluster.pins_endpoint`).
    blocks is the pin's share of the pinned blocks (a block k pins hold counts
    1/k for each, `PinTable.share`), so that the rows add up to distinct
    blocks; own blocks are all it holds (what an expiry's waste counts)."""
    share = getattr(pins, "share", lambda p: p.num_blocks)
    return [
        [share(p), p.expires_at - now, p.expires_at - p.created_at, bool(kept_past_ttl(p)),
         session_digest(p.session_id), tool_label(p.tool), p.num_blocks]
        for p in pins
    ]


def monotonic() -> float:
    """The clock both sides agree on: CLOCK_MONOTONIC is system-wide on Linux."""
    return time.monotonic()
