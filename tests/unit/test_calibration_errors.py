"""What `calibrate` says when the server or a probe fails: a message that names
the fix, not a traceback (continuum_lab/calibration/)."""

from __future__ import annotations

import argparse
import asyncio

import httpx
import pytest

from continuum_lab.calibration.command import fit_measured
from continuum_lab.calibration.probes import Point, Prompts, prefill_point
from continuum_lab.calibration.server import read_shape
from continuum_lab.cli import positive_int
from vllm_continuum.tools.local_server import free_port


def test_no_server_says_how_to_get_one():
    with pytest.raises(SystemExit, match="--bench-server"):
        read_shape(f"http://127.0.0.1:{free_port()}", {})


def test_an_error_inside_a_stream_fails_the_probe():
    body = 'data: {"error": {"message": "the grammar failed"}}\n\ndata: [DONE]\n\n'
    transport = httpx.MockTransport(lambda request: httpx.Response(200, text=body))

    async def probe():
        async with httpx.AsyncClient(transport=transport, base_url="http://server") as client:
            await prefill_point(client, "m", Prompts(0), 16, 0, block_size=32, chunk=2048)

    with pytest.raises(RuntimeError, match="the grammar failed"):
        asyncio.run(probe())


def test_too_few_points_say_what_failed():
    point = Point("decode", {"batch": 1, "context": 128}, [[(1, 128)]], 0.02, False)
    with pytest.raises(SystemExit, match=r"1 grid points measured \(2 probes failed, e\.g\. decode"):
        fit_measured([point], ["decode (4, 128): ReadTimeout: timed out", "prefill (16, 0): HTTP 500"])


@pytest.mark.parametrize("text", ["0", "-3", "two"])
def test_counts_must_be_positive(text):
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1"):
        positive_int(text)
    assert positive_int("3") == 3


def test_compare_refuses_zero_rounds(capsys):
    from vllm_continuum.cli import main

    with pytest.raises(SystemExit):
        main(["compare", "--repeats", "0"])
    assert "at least 1" in capsys.readouterr().err
