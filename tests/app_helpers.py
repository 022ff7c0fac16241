"""The HTTP API's Starlette app run in the test's own process (starlette's TestClient) in front of a
real broker and one null worker serving model "m": each request costs milliseconds, and an
exception the app does not handle fails the test instead of hiding in a 500."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

from starlette.testclient import TestClient

from ovpool.api.app import Config, create_app
from ovpool.api.keys import ApiKeys
from ovpool.client import Client
from ovpool.settings import Settings
from ovpool.testing.pool import broker, free_endpoint, null_worker, wait_for_workers

MAX_NEW_TOKENS = 64  # the broker's: a fuzzed max_tokens over it is a 400, not a long generation
VALID = {"model": "m", "prompt": "one two", "max_tokens": 2, "seed": 1}


@contextlib.contextmanager
def served_app(keys: tuple[str, ...] = ()) -> Iterator[TestClient]:
    """The app (open, or needing one of ``keys``) in front of a broker and a null worker of "m"."""
    endpoint = free_endpoint()
    # The broker's start-up grace, waited out below, is 15 heartbeat intervals: 3 s at 0.2 s, not
    # 15 s. The broker and its worker beat together; this process keeps the default (its Client
    # pings more often than the broker's silence limit, 30 intervals of 0.2 s).
    beat = {"OVPOOL_HEARTBEAT_INTERVAL_S": "0.2"}
    env = {"OVPOOL_MAX_NEW_TOKENS": str(MAX_NEW_TOKENS), **beat}
    with broker(endpoint, env=env), null_worker(endpoint, model="m", env=beat):
        with Client(endpoint) as client:
            wait_for_workers(client, 1, timeout=60)
        settings = Settings.resolve({"broker": endpoint})
        with TestClient(create_app(Config(endpoint, settings, ApiKeys(keys), MAX_NEW_TOKENS))) as http:
            if keys:
                http.headers["authorization"] = f"Bearer {keys[0]}"
            _wait_for_grace_end(http)
            http.headers.pop("authorization", None)
            yield http


def _wait_for_grace_end(http: TestClient, timeout: float = 60.0) -> None:
    """A new broker holds requests for unknown models through its start-up grace (workers may be
    registering again); fuzzed model names must get their 404 at once."""
    deadline = time.monotonic() + timeout
    while post(http, {**VALID, "model": "absent"}).status_code != 404:
        assert time.monotonic() < deadline, "the broker's start-up grace did not end"
        time.sleep(0.2)


def post(http: TestClient, body: dict | str | bytes, path: str = "/v1/completions"):
    """POST ``body`` (a dict as JSON; str or bytes sent exactly as given: raw JSON text)."""
    raw = json.dumps(body) if isinstance(body, dict) else body
    return http.post(path, content=raw, headers={"content-type": "application/json"})


def assert_still_serving(http: TestClient) -> None:
    """The next valid request of each endpoint succeeds: nothing before it broke the app."""
    completion = post(http, VALID)
    assert completion.status_code == 200, completion.text
    assert completion.json()["usage"]["completion_tokens"] == 2
    chat = post(http, {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
                "/v1/chat/completions")
    assert chat.status_code == 200, chat.text
