"""The machine a measurement ran on, and how busy it was.

This project's live figures come from shared machines whose speed drifts with
other people's jobs, so every measurement records where it ran and the load
around it (`calibrate` in its cost model, `compare` per replay), and reports
show it beside the figures it explains.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path


def load_average() -> float:
    """The 1-minute load average, rounded as the records keep it."""
    return round(os.getloadavg()[0], 2)


def machine() -> dict:
    """Host, system, CPU model and core count."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:  # not Linux: platform.processor() below
        pass
    return {"node": platform.node(), "system": platform.platform(), "cpu": cpu or platform.processor(),
            "cpu_count": os.cpu_count()}


def session_cpu_s(session: int) -> dict[str, float]:
    """CPU seconds (user + system) used so far by each live process of a
    session, summed by process name: a server started in its own session
    (the API server, vLLM's engine core, their helpers). Linux only: empty
    elsewhere."""
    used: dict[str, float] = {}
    ticks_per_s = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:  # exited meanwhile
            continue
        name = text[text.find("(") + 1: text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        # after the name: state ppid pgrp session ... utime (11th) stime (12th)
        if int(fields[3]) == session:
            used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks_per_s
    return used


class CpuMeter:
    """Where the cores went over a measurement: CPU seconds of a server's
    processes (by name) and of this process (the client), and the wall time,
    so a report can say whether the engine had the machine to itself: on a
    2-core machine the replay client and the API server share its cores,
    and a prediction calibrated on idle probes would not know."""

    def __init__(self, server_session: int):
        self.session = server_session
        self.server0 = session_cpu_s(server_session)
        self.client0 = sum(os.times()[:2])
        self.wall0 = time.monotonic()

    def read(self) -> dict:
        server = session_cpu_s(self.session)
        return {
            "wall_s": round(time.monotonic() - self.wall0, 2),
            "cores": os.cpu_count(),
            "client_s": round(sum(os.times()[:2]) - self.client0, 2),
            "server_s": {k: round(v - self.server0.get(k, 0.0), 2) for k, v in server.items()
                         if v - self.server0.get(k, 0.0) > 0.005},
        }
