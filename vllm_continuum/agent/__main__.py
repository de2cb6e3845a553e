"""`python -m vllm_continuum.agent`: the agent service with the demo tools.

    python -m vllm_continuum.agent --base-url http://127.0.0.1:8000/v1 --model tiny --port 8100
"""

from __future__ import annotations

import argparse

import uvicorn
from openai import AsyncOpenAI

from vllm_continuum.agent.demo_tools import demo_registry
from vllm_continuum.agent.loop import AgentLoop, LoopConfig
from vllm_continuum.agent.service import AgentService, create_app
from vllm_continuum.agent.store import InMemorySessionStore


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m vllm_continuum.agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI-compatible API")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", required=True, help="served model name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--no-parallel-tool-calls", action="store_true",
                   help="send parallel_tool_calls=false (guided calls of a random model need it)")
    p.add_argument("--max-sessions", type=int, default=1000)
    p.add_argument("--session-ttl-s", type=float, default=3600.0)
    args = p.parse_args(argv)

    client = AsyncOpenAI(base_url=args.base_url, api_key=args.api_key, timeout=120, max_retries=1)
    loop = AgentLoop(client, demo_registry(), LoopConfig(
        model=args.model, max_steps=args.max_steps, max_tokens=args.max_tokens,
        parallel_tool_calls=False if args.no_parallel_tool_calls else None,
    ))
    store = InMemorySessionStore(max_sessions=args.max_sessions, ttl_s=args.session_ttl_s)
    uvicorn.run(create_app(AgentService(loop, store)), host=args.host, port=args.port)


if __name__ == "__main__":
    main()
