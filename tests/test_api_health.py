"""The HTTP API's health endpoints: /health says whether the pool can serve (ready), /health/live
whether this process is of use (its broker client reads replies); a process whose broker client
stopped exits, so its supervisor starts a fresh one instead of keeping a 503-only API."""

from __future__ import annotations

import threading

import pytest
from app_helpers import assert_still_serving, served_app

from ovpool import errors
from ovpool.api import server
from ovpool.api.app import Config
from ovpool.api.keys import ApiKeys
from ovpool.pending import PendingRequests
from ovpool.settings import Settings
from ovpool.testing.pool import free_endpoint


def _stop_the_client_loop(monkeypatch) -> None:
    def broken(self, now: float) -> list:
        raise RuntimeError("a bug")

    monkeypatch.setattr(PendingRequests, "tick", broken)  # the I/O loop's periodic duty


def test_ready_and_live_report_the_link_to_the_broker():
    with served_app() as http:
        assert_still_serving(http)
        ready, live = http.get("/health").json(), http.get("/health/live").json()
        assert ready["status"] == "ok" and ready["workers"] == 1
        assert live["status"] == "ok"
        for link in (ready["link"], live["link"]):
            assert link["reading"] and link["connected"] and link["malformed"] == 0 and not link["stopped"]


def test_a_stopped_broker_client_fails_both_probes_and_says_why(monkeypatch):
    with served_app() as http:
        _stop_the_client_loop(monkeypatch)
        live = http.get("/health/live")  # the first await in the route gives the loop a turn
        deadline = threading.Event()
        while live.status_code == 200 and not deadline.wait(0.05):
            live = http.get("/health/live")
        assert live.status_code == 503 and "RuntimeError: a bug" in live.json()["reason"]
        assert not live.json()["link"]["reading"]
        assert http.get("/health").status_code == 503


def test_the_api_process_exits_once_its_broker_client_stopped(monkeypatch):
    _stop_the_client_loop(monkeypatch)
    config = Config(free_endpoint(), Settings.resolve({}), ApiKeys(), 16)
    with pytest.raises(errors.BrokerUnavailableError, match=r"broker client stopped .*RuntimeError: a bug"):
        server.run(config, "127.0.0.1:0", threading.Event())  # returns only by the error
