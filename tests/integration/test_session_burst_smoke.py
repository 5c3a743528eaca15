"""``bench/session_burst.py`` (docs/scaling.md's same-session burst) runs with tiny sizes against a
real stack (NATS, Postgres, a projector, the API over HTTP), both as documented (``python -m
bench.session_burst``) and as a file path (``python bench/session_burst.py``), which failed: the
script's directory came first on the import path, and a bench module named ``http`` hid the
standard library's. No timing assertions."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.api.app import build_app
from tests.conftest import KEYS, make_settings, running_stack
from tests.support import served

BENCH = Path(__file__).resolve().parents[2] / "bench"
N = 4


@pytest.fixture
async def api(nats_url: str, fresh_db: str) -> AsyncIterator[str]:
    settings = make_settings(nats_url, fresh_db)
    async with running_stack(settings) as c, served(build_app(settings, c)) as url:
        yield url


def results(url: str, *how: str) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, *how, "--url", url, "--key", KEYS["tenant-a"], "--n", str(N), "--spread"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=BENCH.parent,
    )
    assert done.returncode == 0, done.stderr
    return [ast.literal_eval(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("how", [["-m", "bench.session_burst"], [str(BENCH / "session_burst.py")]], ids=["m", "path"])
async def test_a_tiny_burst_is_one_chain_and_the_spread_all_created(api: str, how: list[str]) -> None:
    burst, spread = await asyncio.to_thread(results, api, *how)
    assert (burst["n"], burst["answers"], burst["path"], burst["linear"]) == (N, {"201": N}, N, True)
    assert (spread["sessions"], spread["answers"]) == (N, {201: N})


def test_no_bench_module_hides_a_standard_library_module() -> None:
    """A script of bench/ run as a file path imports from bench/ first."""
    assert not {p.stem for p in BENCH.glob("*.py")} & set(sys.stdlib_module_names)
