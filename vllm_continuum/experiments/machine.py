"""The machine a measurement ran on, and how busy it was.

This project's live figures come from shared machines whose speed drifts with
other people's jobs, so every measurement records where it ran and the load
around it (`calibrate` in its cost model, `compare` per replay), and reports
show it beside the figures it explains.
"""

from __future__ import annotations

import os
import platform
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
