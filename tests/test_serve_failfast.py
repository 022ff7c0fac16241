"""`ovpool serve` fails fast: what no restart can fix (a taken port, a model that is no GGUF, a
bad setting, every worker failed for good) is one line and a non-zero exit, and no child starts
for it. Secrets stay off command lines.

"Fast" is checked as the event, not a time (a loaded host stretches any bound): serve exits
before it starts or readies any child.
"""

from __future__ import annotations

import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from serve_helpers import descendants, free_port, run_serve, serve, taken_port, unsupported_model

pytestmark = pytest.mark.slow

NULL = ("--backend", "null", "--workers", "1")


def assert_one_line_before_any_child(out: str, *named: str) -> None:
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out
    assert all(n in lines[0] for n in named), out
    assert "Traceback" not in out and not re.search(r"\b(started|ready)\b", out), out


@pytest.fixture(name="taken_port")
def _taken_port():
    with taken_port() as port:
        yield port


def test_a_taken_http_port_exits_at_once_naming_it_and_never_says_ready(taken_port):
    done = run_serve("--bind", f"tcp://127.0.0.1:{free_port()}", "--http",
                     f"127.0.0.1:{taken_port}", *NULL)
    assert done.returncode == 2
    assert_one_line_before_any_child(done.stdout, f"127.0.0.1:{taken_port}", "Address already in use")


def test_a_taken_broker_port_exits_at_once_naming_it(taken_port):
    done = run_serve("--bind", f"tcp://127.0.0.1:{taken_port}", "--no-http", *NULL)
    assert done.returncode == 2
    assert_one_line_before_any_child(done.stdout, f"tcp://127.0.0.1:{taken_port}", "Address already in use")


@pytest.mark.parametrize("content, named", [
    (None, "does not exist"),
    (b"<html>not a model</html>", "is not a GGUF file"),
    (b"", "is not a GGUF file"),
])
def test_a_model_that_is_missing_or_not_gguf_exits_before_any_child(tmp_path, content, named):
    model = tmp_path / "model.gguf"
    if content is not None:
        model.write_bytes(content)
    done = run_serve("--model", str(model), "--workers", "1", "--no-cache",
                     "--bind", f"tcp://127.0.0.1:{free_port()}", "--no-http")
    assert done.returncode == 2
    assert_one_line_before_any_child(done.stdout, str(model), named)


def test_a_bad_setting_exits_before_any_child():
    done = run_serve("--set", "slots=0", "--bind", f"tcp://127.0.0.1:{free_port()}", "--no-http", *NULL)
    assert done.returncode == 2
    assert_one_line_before_any_child(done.stdout, "slots", "below the minimum")


def test_serve_exits_once_every_worker_failed_for_good(tmp_path):
    model = unsupported_model(tmp_path / "mamba.gguf")
    done = run_serve("--model", str(model), "--workers", "2", "--no-cache", "--no-http",
                     "--bind", f"tcp://127.0.0.1:{free_port()}", timeout=180)
    assert done.returncode == 2, done.stdout
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("error: every worker failed") and "--keep-up-on-worker-failure" in last
    assert "CPU#0: " in last and "CPU#1: " in last and "'mamba'" in last
    assert "Traceback" not in done.stdout


def test_api_key_on_the_command_line_is_refused_with_the_alternatives():
    done = run_serve("--api-key", "sekrit", "--no-http", *NULL)
    assert done.returncode == 2 and "--api-key-file" in done.stdout and "OVPOOL_API_KEY" in done.stdout
    assert "Traceback" not in done.stdout


def _get(url: str, key: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _cmdlines(pids: set[int]) -> str:
    return " ".join(Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace") for p in pids)


def test_api_keys_from_a_file_and_the_environment_guard_the_http_api_and_stay_off_command_lines(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("s3cr3t-a\ns3cr3t-b\n")
    key_file.chmod(0o600)
    with serve(tmp_path, "--api-key-file", str(key_file), *NULL, http=True,
               env={"OVPOOL_API_KEY": "s3cr3t-env"}) as served:
        served.wait_states("ready")
        served.wait_service("http")
        url = f"http://127.0.0.1:{served.http_port}/v1/models"
        assert _get(url) == 401
        statuses = [_get(url, k) for k in ("s3cr3t-a", "s3cr3t-b", "s3cr3t-env", "wrong")]
        assert statuses == [200, 200, 200, 401]
        everything = _cmdlines(descendants(served.proc.pid) | {served.proc.pid})
    assert "s3cr3t" not in everything and str(key_file) in everything


def test_an_unreadable_api_key_file_is_one_line(tmp_path):
    done = run_serve("--api-key-file", str(tmp_path / "nope"), "--no-http", *NULL)
    assert done.returncode == 2 and "--api-key-file" in done.stdout and "No such file" in done.stdout
    assert "Traceback" not in done.stdout


@pytest.mark.parametrize("content", ["", "\n  \n,\n"])
def test_an_api_key_file_without_a_key_is_refused_not_served_open(tmp_path, content):
    """An empty key file (a secret not mounted yet) used to serve the HTTP API with no key at all."""
    key_file = tmp_path / "keys"
    key_file.write_text(content)
    done = run_serve("--api-key-file", str(key_file), *NULL)
    assert done.returncode == 2 and "Traceback" not in done.stdout
    assert f"--api-key-file: {key_file} holds no key (one a line): put the keys in it" in done.stdout


def test_an_empty_api_key_for_ovpool_api_is_refused_not_served_open():
    done = subprocess.run([sys.executable, "-m", "ovpool", "api", "--api-key", " ", "--bind", "127.0.0.1:0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "Invalid value for --api-key: it holds no key (empty): pass the key" in done.stderr


@pytest.mark.parametrize("option, value", [("--bind", "tcp://127.0.0.1:0"), ("--bind", "tcp://*:*"),
                                           ("--http", "127.0.0.1:0")])
def test_serve_refuses_any_free_port_its_workers_and_clients_could_not_find(option, value):
    """Port 0 used to start a pool whose workers reconnected to tcp://127.0.0.1:0 for ever (--bind),
    or whose HTTP API was announced at http://127.0.0.1:0/v1 (--http)."""
    done = run_serve(option, value, *NULL)
    assert done.returncode == 2 and "Traceback" not in done.stdout
    assert f"Invalid value for {option}: {value!r} asks for any free port" in done.stdout


def test_ready_is_claimed_for_our_own_http_child_only(tmp_path):
    """Readiness is the child's own listener (errors aside: the pool serves, and says it once)."""
    with serve(tmp_path, *NULL, http=True) as served:
        served.wait_states("ready")
        http = served.wait_service("http")
        assert http["pid"] in descendants(served.proc.pid)
        assert served.output().count("HTTP API on") == 1, served.output()
