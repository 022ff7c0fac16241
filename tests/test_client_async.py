"""AsyncClient against real broker and worker processes: the Client API as coroutines."""

from __future__ import annotations

import asyncio

import pytest
from serve_helpers import wait_for

from ovpool import AsyncClient, Client, errors
from ovpool.testing.pool import broker, fast_heartbeats, free_endpoint, null_worker, wait_for_workers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    endpoint = free_endpoint()
    with fast_heartbeats(0.2), broker(endpoint), null_worker(endpoint, slots=4, token_delay=0.005), \
            Client(endpoint) as client:
        wait_for_workers(client, 1)
        yield endpoint, client


def test_async_results_equal_the_sync_client(pool):
    endpoint, sync = pool

    async def main():
        async with AsyncClient(endpoint) as client:
            done = await asyncio.gather(*(client.complete(f"a{i}", max_tokens=5, seed=i) for i in range(10)))
            stream = client.stream("a3", max_tokens=5, seed=3)
            assert stream.completion is None  # not before its end
            streamed = [d async for d in stream]
            chat = await client.chat([{"role": "user", "content": "a1"}], max_tokens=5, seed=1)
            status = await client.status()
            return done, streamed, stream.completion, chat, status

    done, streamed, final, chat, status = asyncio.run(main())
    alone = [sync.complete(f"a{i}", max_tokens=5, seed=i) for i in range(10)]
    assert [c.token_ids for c in done] == [c.token_ids for c in alone]
    assert [d.token_id for d in streamed] == alone[3].token_ids
    assert [d.index for d in streamed] == list(range(5))
    assert final.token_ids == alone[3].token_ids and final.usage == alone[3].usage  # the stream's FINAL
    assert chat.token_ids == alone[1].token_ids  # the null backend reads a chat as its contents
    assert status["workers"][0]["slots"] == 4


def test_async_errors_cancel_and_early_exit(pool):
    endpoint, sync = pool

    async def main():
        async with AsyncClient(endpoint) as client:
            with pytest.raises(errors.ModelNotFoundError):
                await client.complete("x", model="absent")
            future = client.submit("long", max_tokens=3000)
            await client.cancel(future)
            with pytest.raises(errors.CancelledError):
                await future
            async for _ in client.stream("long", max_tokens=3000):
                break  # leaving early cancels the request

    asyncio.run(main())

    def cancelled() -> bool:  # the CANCEL is on its way when the stream is left: waited for, not timed
        status = sync.status()
        return status["counters"]["cancelled"] >= 2 and status["in_flight"] == 0

    wait_for(cancelled, 60, "both requests cancelled at the broker")


def test_logprobs_and_new_sampling_fields_travel_through_broker_and_worker(pool):
    endpoint, sync = pool
    fields = {"max_tokens": 4, "seed": 2, "logprobs": 2, "logit_bias": {7: 1.5}, "min_p": 0.1,
              "presence_penalty": 0.5, "frequency_penalty": 0.5, "repetition_penalty": 1.1}
    done = sync.complete("lp", **fields)
    streamed = list(sync.stream("lp", **fields))

    async def main():
        async with AsyncClient(endpoint) as client:
            return await client.complete("lp", **fields), [d async for d in client.stream("lp", **fields)]

    async_done, async_streamed = asyncio.run(main())
    assert (done.token_ids, done.logprobs) == (async_done.token_ids, async_done.logprobs)
    assert streamed == async_streamed
    assert [t.chosen.token_id for t in done.logprobs] == done.token_ids
    assert [t.chosen.token_id for d in streamed for t in d.logprobs] == done.token_ids
    assert [len(t.top) for t in done.logprobs] == [2] * 4
    assert sync.complete("lp", max_tokens=2).logprobs is None
