"""Where the cores went over a replay (continuum_lab/machine.py CpuMeter): a
server's processes counted by session, this process as the client."""

from __future__ import annotations

import subprocess
import sys
import time

from continuum_lab.machine import CpuMeter
from continuum_lab.prediction.tables import cores_used

# The burn starts on a line from stdin, once the meter has read its baseline: on a
# loaded machine the child could otherwise burn before the meter starts (seen: 0.43 s).
BUSY = ("import sys, time\nsys.stdin.readline()\nt = time.process_time()\n"
        "while time.process_time() - t < {s}: pass\ntime.sleep(30)")


def test_a_session_s_cpu_is_counted_and_the_client_s_apart():
    # A "server" that burns 0.5 s of CPU and then idles, in its own session as compare starts one.
    server = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.5)], start_new_session=True,
                              stdin=subprocess.PIPE, text=True)
    try:
        from_start = CpuMeter(server.pid)
        server.stdin.write("burn\n")
        server.stdin.flush()
        # Until its burn is over (on a loaded machine that takes longer than 0.5 s of
        # wall time); the meter only reads /proc: it takes no CPU meanwhile.
        deadline, last = time.monotonic() + 60, -1.0
        while time.monotonic() < deadline:
            time.sleep(0.3)
            used = sum(from_start.read()["server_s"].values())
            if used >= 0.45 and used == last:  # burnt, and idle since the last look
                break
            last = used
        after_burn = CpuMeter(server.pid)
        t = time.process_time()
        while time.process_time() - t < 0.3:  # the "client" burns 0.3 s
            pass
        since = after_burn.read()  # first: `whole`, read after it, then counts all it counts
        whole = from_start.read()
    finally:
        server.kill()
        server.wait()
    assert sum(whole["server_s"].values()) >= 0.45  # the burn, counted by session
    assert sum(since["server_s"].values()) < 0.1  # what ran before a meter started is not counted
    # os.times() counts in clock ticks (10 ms) and the meter rounds to 10 ms: the
    # 0.3 s burn may read 0.29 (seen in CI), never 0.25 or less.
    assert 0.25 < since["client_s"] < 1.0 and whole["client_s"] >= since["client_s"]
    assert whole["wall_s"] >= 0.5 and whole["cores"] >= 1


def test_cores_used_splits_vllm_s_processes_by_role():
    cpu = {"wall_s": 10, "cores": 2, "client_s": 1,
           "server_s": {"VLLM::Worker": 11, "VLLM::EngineCor": 2, "python3": 3}}
    assert cores_used(cpu) == ("model worker 1.10 + engine core 0.20 + API server 0.30 + client 0.10"
                               " of 2")
    assert cores_used(None) == "" and cores_used({"wall_s": 0}) == ""
