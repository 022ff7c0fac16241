"""Broker memory under a client that grants itself 10**9 tokens of credit and never reads.

    .venv/bin/python benchmarks/hostile_credit.py [--seconds 20] [--max-tokens 512] [--rate 200]

A real broker and null worker (no token delay: they generate as fast as the broker lets them);
a raw DEALER that reads nothing (receive high-water mark 1, so the broker's replies back up into
the broker) sends ``--rate`` streaming SUBMITs a second with ``window`` 10**9, each followed by a
CREDIT of 10**9, and a PING every second so the broker keeps it alive. Prints the broker's RSS
each second and the growth from the first sample: flat means what the broker holds for it is
bounded; rising means it buffers without bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import time
from pathlib import Path

import zmq

from ovpool.protocol import Credit, Ping, encode
from ovpool.submit import make_submit
from ovpool.testing.pool import broker, free_endpoint, null_worker

_HUGE = 10**9


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def attack(endpoint: str, seconds: float, rate: int, max_tokens: int, pid: int) -> list[float]:
    """Broker RSS (MiB) once a second while the dishonest client runs."""
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.rcvhwm, sock.linger = 1, 0
    sock.connect(endpoint)
    template = make_submit("x", "", None, {"max_tokens": max_tokens, "seed": 1})
    ids, samples = itertools.count(), []
    start = next_sample = time.monotonic()
    try:
        while time.monotonic() - start < seconds:
            for _ in range(rate // 10):
                rid = f"h{next(ids)}"
                sock.send_multipart(encode(_submit(template, rid)))
                sock.send_multipart(encode(Credit(rid, _HUGE)))
            if time.monotonic() >= next_sample:
                sock.send_multipart(encode(Ping([])))
                samples.append(rss_mib(pid))
                next_sample += 1.0
            time.sleep(0.1)
    finally:
        sock.close()
        context.term()
    return samples


def _submit(template, rid: str):

    return dataclasses.replace(template, request_id=rid, window=_HUGE)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=int, default=200, help="streaming SUBMITs per second")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    endpoint = free_endpoint()
    with broker(endpoint) as b, null_worker(endpoint, slots=args.slots):
        time.sleep(2.0)  # both started and the worker registered (a loaded host takes a second)
        samples = attack(endpoint, args.seconds, args.rate, args.max_tokens, b.proc.pid)
    result = {"rss_mib": [round(s, 1) for s in samples], "growth_mib": round(samples[-1] - samples[0], 1),
              "seconds": args.seconds, "rate": args.rate, "max_tokens": args.max_tokens}
    if args.json:
        print(json.dumps(result))
        return
    print(f"broker RSS (MiB) each second: {result['rss_mib']}")
    print(f"growth over {args.seconds:g} s of a client granting itself {_HUGE:,} credit and reading"
          f" nothing: {result['growth_mib']} MiB")


if __name__ == "__main__":
    main()
