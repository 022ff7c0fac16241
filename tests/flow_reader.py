"""A Client in a process of its own, so that a test can pause it whole (SIGSTOP) mid-stream.

``python tests/flow_reader.py ENDPOINT STREAMS TOKENS`` streams ``p<i>`` with seed i for each of
STREAMS streams, one reader thread each; prints ``STARTED`` once every stream has its first token,
then one JSON line: per stream, its [index, token_id] pairs or the error it ended with.
"""

from __future__ import annotations

import json
import sys
import threading

from ovpool.client import Client
from ovpool.errors import OvpoolError


def main(endpoint: str, streams: int, tokens: int) -> None:
    results: list = [None] * streams
    first = threading.Barrier(streams + 1)

    def read(i: int) -> None:
        got: list = []
        try:
            for d in client.stream(f"p{i}", max_tokens=tokens, seed=i):
                got.append([d.index, d.token_id])
                if len(got) == 1:
                    first.wait()
            results[i] = got
        except OvpoolError as exc:
            results[i] = f"{type(exc).__name__}: {exc}"

    with Client(endpoint) as client:
        threads = [threading.Thread(target=read, args=(i,)) for i in range(streams)]
        for t in threads:
            t.start()
        first.wait()
        print("STARTED", flush=True)
        for t in threads:
            t.join()
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
