"""The engine tier: real vLLM servers. Every test here is marked `engine`
(so `-m 'not engine'` runs the fast tiers alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == _HERE:
            item.add_marker(pytest.mark.engine)
