"""docs/operations.md's two-host CURVE recipe, run as written (on one host, with a null worker):
its key commands make the broker's allowed/ and workers/ directories, and its client command gets
an answer."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

DOC = (Path(__file__).parents[1] / "docs" / "operations.md").read_text()
SCALING = DOC[DOC.index("## Scaling out"):]
OVPOOL = f"{shlex.quote(sys.executable)} -m ovpool"

pytestmark = pytest.mark.slow


def _blocks(text: str) -> list[str]:
    """The ```sh blocks of ``text``, continuation lines joined."""
    return [b.replace("\\\n", " ") for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def _commands(block: str) -> list[str]:
    return [re.sub(r"\s+", " ", line.split("#")[0]).strip() for line in block.strip().splitlines()
            if line.split("#")[0].strip()]


def test_the_scaling_out_recipe_works_as_written(tmp_path):
    keys_block, client_block = _blocks(SCALING)[:2]
    for command in _commands(keys_block):
        subprocess.run(command.replace("ovpool ", f"{OVPOOL} ", 1) if command.startswith("ovpool")
                       else command, shell=True, cwd=tmp_path, check=True, capture_output=True)
    keys = tmp_path / "keys"
    assert [p.name for p in (keys / "allowed").iterdir()] == ["client.key"]
    assert [p.name for p in (keys / "workers").iterdir()] == ["worker.key"]
    step2 = re.search(r"`ovpool broker (--bind \S+ .*?)`", SCALING, re.S)[1].split()
    endpoint = free_endpoint()
    bind = [endpoint if a.startswith("tcp://") else re.sub(r"^(\w+=)?keys/", rf"\g<1>{tmp_path}/keys/", a)
            for a in step2]
    worker = ("--curve-secret-key", str(keys / "worker.key_secret"),
              "--curve-server-key", str(keys / "broker.key"))
    [complete, status] = _commands(client_block)
    with fast_heartbeats(0.2), broker(bind[1], *bind[2:]), null_worker(endpoint, model="m", extra=worker), \
            Client(endpoint, settings={"curve_secret_key": str(keys / "client.key_secret"),
                                       "curve_server_key": str(keys / "broker.key")}) as client:
        wait_for_workers(client, 1)
        for documented in (complete, status):
            argv = [endpoint if a.startswith("tcp://") else a for a in shlex.split(documented)[1:]]
            out = subprocess.run([sys.executable, "-m", "ovpool", *argv], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0 and out.stdout.strip(), out.stderr


def test_fleet_warming_says_how_copies_share_entries():
    warming = DOC[DOC.index("## Warming the cache"):DOC.index("## What invalidates")]
    assert "source_identity=content" in warming and "another venv's copy" in warming
    assert "in the warm-up run **and** in every run" in warming
