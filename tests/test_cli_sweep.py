"""No traceback reaches a user: every ``ovpool`` subcommand, run as a process with a bad path, a
bad setting or a bad endpoint, exits with one message that names what is wrong (and what to do)."""

from __future__ import annotations

import pytest
from cli_run import clean_error, ovpool


@pytest.fixture(scope="module")
def paths(tmp_path_factory, tiny_model):
    root = tmp_path_factory.mktemp("sweep")
    (root / "file").write_text("not a directory")
    (root / "empty").mkdir()
    return {"FILE": str(root / "file"), "EMPTY": str(root / "empty"), "MISSING": str(root / "missing.gguf"),
            "TINY": str(tiny_model())}


# (command line, environment, words the message must hold); FILE, EMPTY, MISSING and TINY are paths.
BAD_PATHS = [
    (["generate", "hi", "--model", "MISSING"], {}, ["missing.gguf"]),
    (["worker", "--model", "MISSING", "--broker", "tcp://127.0.0.1:9"], {}, ["missing.gguf"]),
    (["cache", "explain", "--model", "MISSING", "--cache-dir", "EMPTY"], {}, ["missing.gguf"]),
    (["generate", "hi", "--model", "TINY", "--cache-dir", "FILE"], {}, ["FILE", "is a file", "--no-cache"]),
    (["worker", "--model", "TINY", "--cache-dir", "FILE"], {}, ["FILE", "is a file", "--no-cache"]),
    (["serve", "--model", "TINY", "--cache-dir", "FILE"], {}, ["FILE", "is a file", "--no-cache"]),
    (["generate", "hi", "--model", "TINY", "--cache-dir", "FILE/sub"], {}, ["FILE", "is a file"]),
    (["cache", "ls"], {"OVPOOL_CACHE_DIR": "FILE"}, ["FILE", "OVPOOL_CACHE_DIR", "is a file"]),
    (["cache", "ls", "--cache-dir", "FILE"], {}, ["FILE", "is a file", "--cache-dir"]),
    (["cache", "verify", "--cache-dir", "FILE"], {}, ["FILE", "is a file"]),
    (["cache", "gc", "--cache-dir", "FILE"], {}, ["FILE", "is a file"]),
    (["cache", "show", "abc", "--cache-dir", "FILE"], {}, ["FILE", "is a file"]),
    (["cache", "rm", "abc", "--cache-dir", "FILE"], {}, ["FILE", "is a file"]),
    (["cache", "explain", "--model", "TINY", "--cache-dir", "FILE"], {}, ["FILE", "is a file"]),
    (["cache", "show", "abc", "--cache-dir", "EMPTY"], {}, ["'abc' matches no entry", "cache ls"]),
    (["generate", "hi", "--model", "TINY", "--cache-only", "--cache-dir", "EMPTY"], {},
     ["cache-only", "EMPTY"]),
    (["keys", "generate", "FILE/keys"], {}, ["cannot write CURVE keys", "FILE"]),
    (["complete", "hi", "--json-schema", "MISSING"], {}, ["--json-schema", "missing.gguf"]),
    (["generate", "hi", "--grammar", "MISSING"], {}, ["--grammar", "missing.gguf"]),
    (["complete", "@MISSING"], {}, ["cannot read the prompt file", "missing.gguf"]),
    (["worker", "--model", "m", "--backend", "null", "--curve-secret-key", "MISSING",
      "--curve-server-key", "MISSING", "--broker", "tcp://127.0.0.1:9"], {},
     ["cannot read CURVE key file", "missing.gguf"]),
    (["status", "--curve-secret-key", "MISSING", "--curve-server-key", "MISSING",
      "--broker", "tcp://127.0.0.1:9"], {}, ["cannot read CURVE key file", "missing.gguf"]),
    (["worker", "--model", "m", "--backend", "null", "--curve-server-key", "MISSING",
      "--broker", "tcp://127.0.0.1:9"], {}, ["CURVE needs both", "curve_secret_key"]),
]

BAD_SETTINGS = [
    (["settings"], {"OVPOOL_SLOTS": "abc"}, ["OVPOOL_SLOTS='abc'", "whole number", "fix or unset"]),
    (["generate", "hi", "--model", "TINY"], {"OVPOOL_SLOTS": "abc"}, ["OVPOOL_SLOTS", "whole number"]),
    (["worker", "--model", "m", "--backend", "null"], {"OVPOOL_KV_CACHE_PRECISION": "int3"},
     ["OVPOOL_KV_CACHE_PRECISION='int3'", "allowed values: auto, f32"]),
    (["serve", "--set", "nope=1"], {}, ["unknown setting 'nope'", "valid names"]),
    (["generate", "hi", "--set", "attention=flash"], {}, ["setting attention", "allowed values"]),
    (["generate", "hi", "--set", "slots"], {}, ["expected NAME=VALUE"]),
    (["bench", "--set", "nope=1"], {}, ["unknown setting 'nope'"]),
    (["bench", "--levels", "x"], {}, ["--levels", "positive integers"]),
    (["settings"], {"OVPOOL_LOG_LEVEL": "LOUD"}, ["--log-level", "OVPOOL_LOG_LEVEL", "LOUD"]),
    (["serve", "--workers", "0"], {}, ["--workers 0", "at least 1"]),
    (["serve", "--devices", "CPU,,GPU"], {}, ["empty device name"]),
    (["serve", "--http", "nope", "--backend", "null"], {}, ["nope"]),
    (["cache", "gc", "--max-bytes", "lots", "--cache-dir", "EMPTY"], {}, ["'lots'", "500M"]),
    (["complete", "hi", "--top-k", "-1"], {}, ["--top-k", "-1"]),
    (["generate", "hi", "--no-cache", "--cache-dir", "EMPTY"], {}, ["--cache-dir or --no-cache"]),
]


def _subst(text: str, paths: dict[str, str]) -> str:
    for name, path in paths.items():
        text = text.replace(name, path)
    return text


VALID_FORMS = "tcp://HOST:PORT"
BAD_ENDPOINTS = [
    (["complete", "hi", "--broker", "foo"], {}, ["'foo'", VALID_FORMS]),
    (["complete", "hi"], {"OVPOOL_BROKER": "foo"}, ["'foo'", VALID_FORMS]),
    (["status", "--broker", "foo"], {}, ["'foo'", VALID_FORMS]),
    (["worker", "--broker", "foo", "--model", "MISSING"], {}, ["'foo'", VALID_FORMS]),  # before the model
    (["broker", "--bind", "foo"], {}, ["'foo'", VALID_FORMS]),
    (["serve", "--bind", "foo", "--backend", "null"], {}, ["--bind", "'foo'", VALID_FORMS]),
    (["serve", "--broker", "foo", "--backend", "null"], {}, ["'foo'", VALID_FORMS]),
    (["api", "--broker", "foo"], {}, ["'foo'", VALID_FORMS]),
    (["complete", "hi", "--broker", "tcp://127.0.0.1:9"], {},
     ["cannot reach the broker at tcp://127.0.0.1:9", "running"]),
    (["status", "--broker", "tcp://127.0.0.1:9"], {}, ["cannot reach the broker at tcp://127.0.0.1:9"]),
]

CASES = BAD_PATHS + BAD_SETTINGS + BAD_ENDPOINTS


@pytest.mark.parametrize("argv,env,needles", CASES,
                         ids=[" ".join(argv) + "".join(f" {k}={v}" for k, v in env.items())
                              for argv, env, _ in CASES])
def test_bad_input_is_one_clear_message(paths, argv, env, needles):
    result = ovpool(*[_subst(a, paths) for a in argv], env={k: _subst(v, paths) for k, v in env.items()},
                    timeout=60)
    clean_error(result, *[_subst(n, paths) for n in needles])
