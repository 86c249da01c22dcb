"""Shared fixtures: the default world and small task splits (cached per session), and a local
chat-completions server (tests/http_endpoint.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from http_endpoint import Endpoint

from sera_core.envs.textcraft.tasks import TaskConfig, generate_split, world_for

OFFICIAL_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "official"


@pytest.fixture(scope="session")
def book():
    return world_for(TaskConfig().world)


@pytest.fixture(scope="session")
def val_tasks():
    return generate_split("val")


@pytest.fixture(scope="session")
def official_dir() -> Path:
    """The official samples folder (``../shared/benchmarks/official``); skip if absent."""
    if not OFFICIAL_DIR.is_dir():
        pytest.skip("official benchmark samples are not present")
    return OFFICIAL_DIR


@pytest.fixture
def endpoint():
    """A scripted OpenAI-compatible server on 127.0.0.1 (tests/http_endpoint.py), closed after the test."""
    ep = Endpoint()
    yield ep
    ep.close()
