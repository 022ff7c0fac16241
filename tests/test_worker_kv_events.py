"""KV events: the prefix cache's block events, encoded as vLLM's KVEventBatch (the shape llm-d's
precise prefix scorer decodes) and received by a ZeroMQ SUB from a real paged batcher."""

from __future__ import annotations

import threading

import msgpack
import pytest
import zmq
from test_generate_batcher import drain
from test_worker_process import WAIT_MS, HandBroker, request

from ovpool import Engine
from ovpool.config import WorkerConfig
from ovpool.errors import InvalidSettingError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.generate.batch import PagedRunner
from ovpool.worker.generate.blocks import BlockPool, Removed, Stored, chain_hashes
from ovpool.worker.kv_events import KvEventPublisher, block_hash, encode_batch, topic
from ovpool.worker.null_backend import NullBackend
from ovpool.worker.process import Worker

A, B = bytes(range(16)), bytes(range(16, 32))


def test_batch_has_vllm_field_order():
    """[ts, events, data_parallel_rank]; BlockStored: block_hashes, parent_block_hash, token_ids,
    block_size, lora_id, medium; BlockRemoved: block_hashes, medium; tags first (msgspec's
    array_like tagged union)."""
    payload = encode_batch([Stored(B, A, (5, 6)), Removed(A)], 2, 12.5, cleared=True)
    assert msgpack.unpackb(payload) == [12.5, [
        ["AllBlocksCleared"],
        ["BlockStored", [block_hash(B)], block_hash(A), [5, 6], 2, None, "CPU"],
        ["BlockRemoved", [block_hash(A)], "CPU"],
    ], 0]
    assert block_hash(A) == 0x0001020304050607
    assert msgpack.unpackb(encode_batch([Stored(A, None, (1,))], 1, 0.0))[1][0][2] is None


def test_pool_reports_new_blocks_once_and_evictions():
    pool = BlockPool(1, events=True)
    block = pool.allocate()
    pool.register(block, A, None, [1, 2])
    pool.register(block, A, None, [1, 2])  # already held: nothing new
    pool.release([block])
    pool.register(pool.allocate(), B, A, [3, 4])  # evicts A
    assert pool.drain() == [Stored(A, None, (1, 2)), Removed(A), Stored(B, A, (3, 4))]
    assert pool.drain() == []


def test_topic_names_pod_and_model():
    assert topic("smollm2", pod="pod-1") == "kv@pod-1@smollm2"


@pytest.fixture(scope="module")
def engine(tiny_model):
    with Engine(tiny_model(arch="llama", weight_type="Q4_1"),
                settings={"inference_precision": "f32", "kv_cache_precision": "f32"}) as eng:
        yield eng


def _received(sub: zmq.Socket, seq: int) -> list:
    frames = sub.recv_multipart()
    assert frames[:2] == [b"kv@pod@tiny", seq.to_bytes(8, "big")] and len(frames) == 3
    return msgpack.unpackb(frames[2])


def test_subscriber_sees_a_prompts_full_blocks_then_their_eviction(engine, tmp_path):
    runner = PagedRunner(engine.compiled, num_blocks=4)
    batcher = engine.batcher(runner, max_running=1, prefill_chunk=16, prefix_cache="on")
    batcher.record_kv_events()
    size = runner.block_size
    first = [10 + i % 80 for i in range(2 * size + 3)]  # two full blocks and a partial one
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    drain(batcher, {0: [("a", first, params)]})
    endpoint = f"ipc://{tmp_path}/kv"
    with zmq.Context() as ctx, KvEventPublisher(endpoint, topic("tiny", pod="pod")) as pub, \
            ctx.socket(zmq.SUB) as sub:
        sub.rcvtimeo = 5000
        sub.connect(endpoint)
        sub.subscribe(b"kv@")
        assert pub.wait_subscriber(5.0)
        pub.publish(size, batcher.kv_events(), 1.0)
        seq_batch = _received(sub, 0)
        hashes = [block_hash(a) for a in chain_hashes(batcher.scheduler.seed, first, size, blocks=2,
                                                      prompt=len(first))]
        assert seq_batch[1] == [
            ["AllBlocksCleared"],
            ["BlockStored", [hashes[0]], None, first[:size], size, None, "CPU"],
            ["BlockStored", [hashes[1]], hashes[0], first[size:2 * size], size, None, "CPU"],
        ]
        # Another prompt needs every block: both cached ones go, tail first.
        drain(batcher, {0: [("b", [99 - i % 80 for i in range(3 * size + 2)], params)]})
        pub.publish(size, batcher.kv_events(), 2.0)
        removed = [e[1][0] for e in _received(sub, 1)[1] if e[0] == "BlockRemoved"]
        assert removed == [hashes[1], hashes[0]]


class _CachingNull(NullBackend):
    """The null backend, as if each step cached one block."""

    def kv_events(self) -> tuple[int, list]:
        return 2, [Stored(A, None, (1, 2))]


def test_a_worker_publishes_its_steps_events_on_its_endpoint(tmp_path):
    hand = HandBroker(f"ipc://{tmp_path}/broker")
    config = WorkerConfig(kv_events_endpoint=f"ipc://{tmp_path}/kv")
    stop = threading.Event()
    worker = Worker(f"ipc://{tmp_path}/broker", _CachingNull(["m"], token_delay_s=0.005),
                    config=config, name="w")
    thread = threading.Thread(target=lambda: worker.__enter__().run(stop))
    with zmq.Context() as ctx, ctx.socket(zmq.SUB) as sub:
        sub.rcvtimeo = WAIT_MS
        thread.start()
        hand.next()  # READY: the PUB socket is bound
        sub.connect(f"ipc://{tmp_path}/kv")
        sub.subscribe(b"kv@")
        hand.send(request("a", max_tokens=2000))  # steps (each with an event) until stopped
        # A SUB hears what is sent once its subscription has arrived: some first batches may be gone.
        topic_frame, _, payload = sub.recv_multipart()
        stop.set()
        thread.join()
    worker.__exit__()
    hand.close()
    assert topic_frame.startswith(b"kv@") and topic_frame.endswith(b"@m")
    assert ["BlockStored", [block_hash(A)], None, [1, 2], 2, None, "CPU"] in msgpack.unpackb(payload)[1]


def test_an_endpoint_in_use_is_an_error_naming_the_setting():
    with zmq.Context() as ctx, ctx.socket(zmq.PUB) as taken:
        port = taken.bind_to_random_port("tcp://*")
        with pytest.raises(InvalidSettingError, match="kv_events_endpoint 'tcp://\\*:"):
            KvEventPublisher(f"tcp://*:{port}", "kv@p@m").__enter__()
