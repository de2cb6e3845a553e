"""The README's first command: the tool-call pause on stock vLLM and on
continuum, side by side, on the tiny model and a small KV pool."""

from __future__ import annotations

from pathlib import Path

from tqdm import tqdm

from vllm_continuum.demos.pause_scenario import PauseResult, run_pause_scenario
from vllm_continuum.tools.local_server import flavour_server
from vllm_continuum.tools.tiny_model import build_tiny_model

# The demo shows the pin mechanism: a fixed TTL long enough for the pause,
# which includes the other sessions' traffic (the continuum model would not pin
# here: a tiny model on a CPU reloads 600 tokens in well under a second).
DEMO_SETTINGS = {
    "ttl_policy": "fixed",
    "default_ttl_s": 30,
}


def run_pause_demo(model_dir: Path, out_dir: Path, flavours: list[str]) -> int:
    model = str(build_tiny_model(model_dir))
    servers = [flavour_server(f, model, out_dir, settings=DEMO_SETTINGS) for f in flavours]
    results: list[PauseResult] = []
    with tqdm(total=2 * len(servers), desc="demo", unit="step") as bar:
        try:
            for server in servers:  # both start at once: start-up is the slow part
                server.start()
            for server in servers:
                bar.set_postfix_str(f"starting {server.name} server (logs in {out_dir})")
                server.wait_ready()
                bar.update()
            for server in servers:
                bar.set_postfix_str(f"pause scenario on {server.name}")
                results.append(run_pause_scenario(server.base_url, server.name))
                bar.update()
        finally:
            for server in servers:
                server.stop()
    print(format_results(results))
    return 0


def format_results(results: list[PauseResult]) -> str:
    rows = [
        ("server", "tool called", "turn-1 prompt", "turn-2 prompt", "turn-2 cached",
         "turn-1 prompt in full blocks", "kept"),
    ]
    for r in results:
        rows.append((
            r.flavour, r.tool_called, str(r.turn1_prompt_tokens), str(r.turn2_prompt_tokens),
            str(r.turn2_cached_tokens), str(r.turn1_full_block_tokens), f"{min(r.reuse, 1):.0%}",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(
        "\nTurn 1 ended in a tool call; other sessions' traffic filled the KV pool during the"
        "\npause; turn 2 sent the history plus the tool result. 'turn-2 cached' is vLLM's own"
        "\nusage.prompt_tokens_details.cached_tokens for that request."
    )
    return "\n".join(lines)
