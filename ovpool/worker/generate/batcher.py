"""Continuous batching: every ``step()`` is ONE forward pass over all running requests.

The Scheduler (pure logic) says which tokens of which requests go into the pass; the PagedRunner
(OpenVINO) runs it; each request's Generation (sampling, stop strings, streaming text, EOS, limits:
the same code as a single-stream generation) takes the logits row of its last token. Requests
join between steps and long prompts are prefilled in ``prefill_chunk`` pieces next to running
decodes. A request whose sequence outgrows the whole KV cache fails with a clear error. With the
prefix cache (``prefix_cache``) a request reuses the KV blocks of any earlier sequence its
tokens begin with (docs/prefix-caching.md); ``held_route_keys`` and the prompt-token counters are
what the worker reports of it to the broker.
A request with a long prompt or a response_format waits, unscheduled, while it is admitted on
another thread (ovpool.worker.generate.admission): a costly prompt, regex or grammar never holds up
the other requests' steps.
The Batcher is handed what it runs: an Intake (ovpool.worker.generate.intake: tokenizer, limits,
constraints) and a PagedGraph (``from_graph``), whose owner (ovpool.worker.graphs) loads and
closes it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ovpool.errors import InferenceError, InvalidRequestError, OvpoolError
from ovpool.sampling_params import SamplingParams
from ovpool.worker.events import Event, Failed, Finished, Token
from ovpool.worker.generate.admission import Preparer
from ovpool.worker.generate.batch import PagedGraph, PagedRunner, PagedSession
from ovpool.worker.generate.constraint import Constraint, masks_for
from ovpool.worker.generate.generation import Generation
from ovpool.worker.generate.intake import Admitted, Intake, format_param
from ovpool.worker.generate.kv_tier import BlockTier, TierLink
from ovpool.worker.generate.lookup import Drafts
from ovpool.worker.generate.scheduler import Scheduler
from ovpool.worker.generate.session import warm_up

log = logging.getLogger("ovpool.worker")
# Prompts up to this many characters are tokenized in the step loop; longer ones on the Preparer's
# thread: BPE of one long word is quadratic (docs/performance.md), which would hold every other
# request's steps up.
INLINE_CHARS = 2048
# How long a step waits for the requests handed to the Preparer since the last one: a chat's next
# turn (long, but its words' tokens cached) takes ~1 ms there; without the wait it joined a step later.
FRESH_WAIT_S = 0.01


class Batcher:
    """Continuous batching of requests admitted by ``intake`` on ``runner``. ``prefix_cache``: on
    (exact), all or off (see Engine.prefix_cache); ``identity``: the graph's (PagedGraph.identity);
    ``warm_up``: the graph's one-time set-up where another user of it does it (else on a session
    of the Batcher's own); ``tier``: a lower KV tier under the pool (ovpool.worker.generate.kv_tier:
    the host's disk tier, which the engine opens), used with prefix_cache=on only;
    ``prompt_lookup``: off, on or auto, with up to ``lookup_tokens`` proposed tokens verified per
    decode (ovpool.worker.generate.lookup; not for a constrained request nor one that asks for
    log-probabilities); ``answer_copies``: with prefix_cache=on, batched decode passes also
    compute answers' blocks as prompt passes would (the Scheduler's ``copy_answers``), and with
    ``answer_tails`` the partial block an answer ends in (``copy_tails``)."""

    def __init__(self, intake: Intake, runner: PagedRunner, *, max_running: int, prefill_chunk: int,
                 prefix_cache: str = "off", identity: bytes = b"",
                 warm_up: Callable[[], None] | None = None, tier: BlockTier | None = None,
                 prompt_lookup: str = "off", lookup_tokens: int = 4, answer_copies: bool = True,
                 answer_tails: bool = True):
        self.intake, self.runner = intake, runner
        self.drafts = Drafts(prompt_lookup, lookup_tokens)
        # The lower tier holds exact blocks only (ovpool.worker.generate.kv_tier): with prefix_cache=on.
        self.tier = TierLink(tier, runner) if tier is not None and prefix_cache == "on" else None
        self.scheduler = Scheduler(num_blocks=runner.num_blocks, block_size=runner.block_size,
                                   prefill_chunk=prefill_chunk, max_running=max_running,
                                   caching=prefix_cache != "off", exact=prefix_cache == "on",
                                   seed=_graph_seed(identity, runner), tier=self.tier,
                                   copy_answers=answer_copies, copy_tails=answer_tails)
        self._generations: dict[str, Generation] = {}
        self._preparer = Preparer()
        self._unprepared: dict[str, tuple[SamplingParams, tuple[bytes, ...]]] = {}
        self._uncounted: set[str] = set()  # scheduled, not yet admitted: their Generation's cached unknown
        self._warm_up = warm_up
        self.warmed = False

    def warm_up(self) -> None:
        """The device's one-time set-up for this graph (see session.warm_up), on a session of its
        own where nobody else does it, so that no KV block of the scheduler's is touched."""
        if self.warmed:
            return
        if self._warm_up is not None:
            self._warm_up()
        else:
            warm_up(PagedSession(self.runner.compiled, self.runner.decode))
        self.warmed = True

    @classmethod
    def from_graph(cls, intake: Intake, graph: PagedGraph, *, kv_cache_mb: int, max_running: int,
                   prefill_chunk: int, prefix_cache: str = "off",
                   warm_up: Callable[[], None] | None = None, tier: BlockTier | None = None,
                   prompt_lookup: str = "off", lookup_tokens: int = 4,
                   answer_copies: bool = True, answer_tails: bool = True) -> Batcher:
        """A Batcher on ``graph`` with ``kv_cache_mb`` of KV blocks."""
        runner = PagedRunner(graph.compiled, kv_cache_mb, decode=graph.decode)
        log.info("continuous batching: %d KV blocks of %d positions (%.0f MiB), graph %s in %.1f s",
                 runner.num_blocks, runner.block_size, runner.kv_bytes / 2**20, graph.outcome,
                 graph.seconds)
        return cls(intake, runner, max_running=max_running, prefill_chunk=prefill_chunk,
                   prefix_cache=prefix_cache, identity=graph.identity, warm_up=warm_up, tier=tier,
                   prompt_lookup=prompt_lookup, lookup_tokens=lookup_tokens, answer_copies=answer_copies,
                   answer_tails=answer_tails)

    @property
    def active(self) -> int:
        return len(self._generations) + len(self._unprepared)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the requests admitted so far."""
        return self.scheduler.prompt_tokens

    @property
    def cached_prompt_tokens(self) -> int:
        """Of those, the ones whose KV came from the prefix cache (not computed)."""
        return self.scheduler.cached_prompt_tokens

    def held_route_keys(self, limit: int) -> list[bytes]:
        """Route keys of requests whose KV chain is still cached, most recently used first."""
        return self.scheduler.held_keys(limit)

    def record_kv_events(self) -> None:
        """From now on, record the prefix cache's block events for ``kv_events`` (a publisher
        exists: none are recorded otherwise)."""
        self.scheduler.pool.recording = True

    def kv_events(self) -> list:
        """The prefix cache's block events since the last call (blocks.Stored / Removed), as
        recorded since ``record_kv_events``."""
        return self.scheduler.pool.drain()

    def add(self, request_id: str, prompt: Any, params: SamplingParams,
            route_keys: Sequence[bytes] = ()) -> None:
        """Admit a request: at once when it is cheap, else on the Preparer's thread (a long
        prompt's tokenization, a constraint's build), its refusal then a Failed event of a step."""
        keys, fmt = tuple(route_keys), self.intake.output_format(params)  # tools' grammar too
        if fmt is None and _text_length(prompt) <= INLINE_CHARS:
            self._schedule(request_id, self._admit(prompt, params), None, params=params, route_keys=keys)
            return
        self._unprepared[request_id] = (params, keys)
        self._preparer.submit(request_id, lambda: self._admit(prompt, params), self.intake.vocabulary,
                              fmt, params.ignore_eos, format_param(params))

    def _admit(self, prompt: Any, params: SamplingParams) -> list[int]:
        ids = self.intake.ids(prompt, params)
        self._check_fits(ids)
        return ids

    def _check_fits(self, ids: list[int]) -> None:
        if not self.scheduler.fits(len(ids) + 1):
            raise InvalidRequestError(
                f"the prompt has {len(ids)} tokens but the KV cache holds "
                f"{self.scheduler.num_blocks * self.scheduler.block_size} positions; raise kv_cache_mb")

    def add_admitted(self, request_id: str, admitted: Admitted) -> Generation:
        """Schedule a request its caller admitted (``intake.admit``); the Generation that runs it."""
        self._check_fits(admitted.ids)
        return self._schedule(request_id, admitted.ids, admitted.constraint, params=admitted.params,
                              route_keys=())

    def _schedule(self, request_id: str, ids: list[int], constraint: Constraint | None, *,
                  params: SamplingParams, route_keys: tuple[bytes, ...]) -> Generation:
        gen = Generation(None, None, ids, params, self.intake.tokenizer,
                         context_length=self.intake.context_length, constraint=constraint,
                         tools=self.intake.tool_reader(params))
        self.scheduler.add(request_id, ids, route_keys)
        self._generations[request_id] = gen
        # Not with a constraint (its mask is one row's) nor log-probabilities (a verified row's
        # differ from a one-position pass's in the last bits: they would depend on the drafts).
        self.drafts.open(request_id, ids, speculate=constraint is None and params.logprobs is None)
        self._uncounted.add(request_id)
        return gen

    def _prepared(self) -> list[Event]:
        """Schedule the requests the Preparer admitted; fail those it refused."""
        events: list[Event] = []
        for rid, outcome in self._preparer.take(FRESH_WAIT_S):
            params, keys = self._unprepared.pop(rid)
            if isinstance(outcome, OvpoolError):
                events.append(Failed(rid, outcome))
            else:
                self._schedule(rid, *outcome, params=params, route_keys=keys)
        return events

    def cancel(self, request_id: str) -> None:
        if self._unprepared.pop(request_id, None) is not None:
            self._preparer.cancel(request_id)
        self.scheduler.finish(request_id)
        self._uncounted.discard(request_id)
        self.drafts.close(request_id)
        gen = self._generations.pop(request_id, None)
        if gen is not None:
            gen.close()

    def step(self) -> list[Event]:
        """One forward pass for every scheduled request; the events it produced."""
        events = self._prepared()
        self._propose()
        plan = self.scheduler.plan()
        if self._uncounted:
            self._count_cached(plan)
        events += [self._exhausted(rid) for rid in plan.exhausted]
        if not plan.chunks:
            self._preparer.wait(0.05)  # nothing to run but builds: the worker loop would spin
            return events
        sampled = [c for c in plan.chunks if c.sample]
        masks = masks_for([self._generations[c.seq_id].constraint for c in sampled
                           for _ in range(1 + c.draft)])
        try:
            # The constrained rows' masks are computed while the pass runs (both drop the GIL).
            logits = self._forward(plan.chunks, during=masks and masks.compute)
            if masks is not None:
                logits = masks.apply(logits)
        except InferenceError as exc:  # the pass is shared: every request in it fails
            return events + [self._fail(rid, exc) for rid in dict.fromkeys(c.seq_id for c in plan.chunks)]
        self.scheduler.commit()  # before _accept ends any sequence: its last blocks are written
        row = 0
        for chunk in sampled:
            events += self._accept(chunk, logits[row:row + 1 + chunk.draft], masked=masks is not None)
            row += 1 + chunk.draft
        return events

    def _forward(self, chunks, during):
        """The pass's logits rows; a pass of one sequence that may speculate is timed (PassCost)."""
        start = time.perf_counter()
        logits = self.runner.forward(chunks, rows=_rows(chunks), during=during)
        self.drafts.timed([c.seq_id for c in chunks], sum(len(c.tokens) for c in chunks),
                          time.perf_counter() - start)
        return logits

    def _propose(self) -> None:
        """Give the scheduler each decoding request's draft (prompt lookup)."""
        for rid, draft in self.drafts.drafts(len(self.scheduler.running), self._room):
            self.scheduler.propose(rid, draft)

    def _room(self, request_id: str) -> int | None:
        """How many tokens a decoding request may still generate (max_tokens, the context); None
        if its next chunk is no decode."""
        if not self.scheduler.decoding(request_id):
            return None
        gen = self._generations[request_id]
        done = len(gen.prompt_ids) + len(gen.token_ids)
        return min(gen.params.max_tokens - len(gen.token_ids), self.intake.context_length - done)

    @property
    def lookup(self) -> dict[str, int]:
        """Prompt lookup's counts (passes, proposed and accepted tokens) of finished requests."""
        return self.drafts.counts

    def _count_cached(self, plan) -> None:
        """Tell each Generation the plan admitted how much of its prompt was cached."""
        for chunk in plan.chunks:
            if chunk.seq_id in self._uncounted:
                self._uncounted.discard(chunk.seq_id)
                self._generations[chunk.seq_id].cached = self.scheduler.cached(chunk.seq_id)

    def _accept(self, chunk, rows, masked: bool) -> list[Event]:
        """The tokens of ``chunk``'s request from its ``rows`` of logits: one, or with a draft
        (``chunk.draft`` tokens proposed) as many as it verifies."""
        request_id, gen = chunk.seq_id, self._generations[chunk.seq_id]
        draft, done = chunk.tokens[len(chunk.tokens) - chunk.draft:], len(gen.token_ids)
        try:
            deltas = gen.verify(rows, draft) if draft else [gen.feed(rows[0], masked=masked)]
        except OvpoolError as exc:
            return [self._fail(request_id, exc)]
        except Exception as exc:  # a bug one request's row reaches fails that request, not the loop
            return [self._fail(request_id, InferenceError(f"choosing the next token failed: {exc!r}"))]
        events: list[Event] = [Token(request_id, delta) for delta in deltas if delta is not None]
        if gen.finished:
            events.append(Finished(request_id, gen.completion()))
            self.cancel(request_id)
            return events
        tokens = gen.token_ids[done:]
        self.drafts.accept(request_id, draft, tokens)
        if draft:
            self.scheduler.verified(request_id, tokens)
        else:
            self.scheduler.append(request_id, tokens[0], left=gen.params.max_tokens - len(gen.token_ids))
        return events

    def _exhausted(self, request_id: str) -> Event:
        size = self.scheduler.num_blocks * self.scheduler.block_size
        return self._fail(request_id, InvalidRequestError(
            f"the sequence outgrew the KV cache ({size} positions); raise kv_cache_mb or lower max_tokens"))

    def _fail(self, request_id: str, error: OvpoolError) -> Event:
        self.cancel(request_id)
        return Failed(request_id, error)


def _rows(chunks) -> list[int] | None:
    """The logits rows of a pass: each sampled chunk's last token and its draft's (None: no
        draft, the last token of each, feeds' default)."""
    if not any(c.draft for c in chunks):
        return None
    rows, end = [], 0
    for c in chunks:
        end += len(c.tokens)
        if c.sample:
            rows.extend(range(end - 1 - c.draft, end))
    return rows


def _text_length(prompt: Any) -> int:
    """The characters of a prompt to tokenize (token ids: none); chat messages' contents summed."""
    if isinstance(prompt, str):
        return len(prompt)
    items = list(prompt)
    if all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in items):
        return sum(len(m["content"]) for m in items)
    return 0 if all(isinstance(t, int) for t in items) else INLINE_CHARS + 1  # unknown: not here


def _graph_seed(identity: bytes, runner: PagedRunner) -> bytes:
    """The first KV block's parent address: the graph's identity and its KV layout, so blocks of
    two models or two precisions never match."""
    layout = repr((runner.block_size, runner.block_bytes)).encode()
    return hashlib.blake2b(identity + layout, digest_size=16).digest()
