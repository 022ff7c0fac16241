"""`ovpool complete` and `ovpool status` as a user runs them against a broker."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ovpool.client import Client
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

pytestmark = pytest.mark.slow


def ovpool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ovpool", *args], capture_output=True, text=True, timeout=60)


def test_complete_and_status_commands():
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, model="tiny", slots=2), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        expected = client.complete("hello", max_tokens=4, seed=9)
        request = ("complete", "hello", "--broker", endpoint, "--max-tokens", "4", "--seed", "9")
        as_json, streamed = ovpool(*request, "--json"), ovpool(*request, "--stream")
        missing = ovpool("complete", "hello", "--broker", endpoint, "--model", "nope")
        status = ovpool("status", "--broker", endpoint, "--json")
        table = ovpool("status", "--broker", endpoint)
    assert json.loads(as_json.stdout)["token_ids"] == expected.token_ids
    assert streamed.stdout.strip() == expected.text.strip()
    assert missing.returncode == 2 and "no worker serves model 'nope'" in missing.stderr
    workers = json.loads(status.stdout)["workers"]
    assert [w["models"] for w in workers] == [["tiny"]]
    assert "tiny" in table.stdout and "0/2 slots" in table.stdout
