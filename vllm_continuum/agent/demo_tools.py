"""Demo tools with realistic latency: what an agent's pauses look like.

- `calculator`: local and instant.
- `get_weather`: a remote call; its latency is log-normal (a long right
  tail: most calls are quick, some take many times the median), like real
  web APIs and searches.
- `book_hotel`: a remote call that fails some of the time.

Arguments are enums and bounded integers: a random-weight test model under
guided decoding closes those reliably, while free strings (and unbounded
floats) may run to `max_tokens`.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field

from vllm_continuum.agent.tools import ToolRegistry

__all__ = ["CITIES", "DemoToolConfig", "demo_registry"]

CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo")
City = Literal["Paris", "Tokyo", "Lima", "Oslo", "Cairo"]
SmallInt = Annotated[int, Field(ge=-1000, le=1000)]


@dataclass(frozen=True)
class DemoToolConfig:
    weather_median_s: float = 0.4  # median latency of get_weather
    weather_sigma: float = 0.8  # log-normal shape: 0.8 puts p99 at ~6.4x the median
    weather_timeout_s: float = 3.0
    hotel_latency_s: float = 0.2
    hotel_failure_rate: float = 0.3
    seed: int | None = None  # fixes latencies and failures, for reproducible runs


def demo_registry(config: DemoToolConfig | None = None) -> ToolRegistry:
    cfg = config or DemoToolConfig()
    rng = random.Random(cfg.seed)
    registry = ToolRegistry(default_timeout_s=5.0)

    # Sync, so it runs in a worker thread: on a loaded machine starting one can
    # take a second, hence a timeout far above the tool's own microseconds.
    @registry.tool(timeout_s=5.0)
    def calculator(op: Literal["add", "sub", "mul", "div"], a: SmallInt, b: SmallInt) -> dict:
        """Exact arithmetic on two integers."""
        if op == "div":
            if b == 0:
                raise ZeroDivisionError("division by zero")
            value: float = a / b
        else:
            value = {"add": a + b, "sub": a - b, "mul": a * b}[op]
        return {"op": op, "a": a, "b": b, "result": value}

    @registry.tool(timeout_s=cfg.weather_timeout_s)
    async def get_weather(city: City, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict:
        """Current weather of a city (a remote API: usually fast, sometimes very slow)."""
        await asyncio.sleep(rng.lognormvariate(math.log(cfg.weather_median_s), cfg.weather_sigma))
        celsius = {"Paris": 14, "Tokyo": 19, "Lima": 22, "Oslo": 3, "Cairo": 30}[city]
        temp = celsius if unit == "celsius" else round(celsius * 9 / 5 + 32)
        return {"city": city, "sky": rng.choice(["clear", "cloudy", "rain"]), "temp": temp,
                "unit": unit}

    @registry.tool(timeout_s=2.0)
    async def book_hotel(city: City, nights: Annotated[int, Field(ge=1, le=14)]) -> dict:
        """Book a hotel room (a remote service that sometimes fails)."""
        await asyncio.sleep(cfg.hotel_latency_s)
        if rng.random() < cfg.hotel_failure_rate:
            raise ConnectionError(f"booking service for {city} is unavailable, try again later")
        return {"city": city, "nights": nights, "confirmation": f"H{rng.randrange(10**6):06d}"}

    return registry
