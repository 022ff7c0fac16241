"""The Binary Star state machine of a broker pair (ovpool/broker/binary_star.py): its rules one by
one, and a simulated pair under dropped messages, freezes, restarts and client votes."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from ovpool.broker.binary_star import Action, BinaryStar, State

INTERVAL, EXPIRY, DT = 1.0, 3.0, 0.1


def pair(now: float = 0.0) -> tuple[BinaryStar, BinaryStar]:
    return (BinaryStar(primary=True, now=now, expiry_s=EXPIRY, interval_s=INTERVAL),
            BinaryStar(primary=False, now=now, expiry_s=EXPIRY, interval_s=INTERVAL))


def test_a_primary_alone_serves_after_one_expiry():
    primary, _ = pair()
    assert primary.client(1.0) == [Action.REFUSE]
    primary.tick(2.0)  # a broker ticks every loop turn: a longer silence is a freeze
    assert primary.client(EXPIRY) == [Action.ACTIVATED, Action.SERVE]
    assert primary.state is State.ACTIVE


def test_a_backup_alone_never_serves():
    _, backup = pair()
    for t in range(1, 30):
        backup.tick(float(t))
        assert backup.client(float(t)) == [Action.REFUSE]


def test_a_backup_that_saw_only_a_starting_primary_takes_over_once_it_is_silent():
    _, backup = pair()
    backup.peer(State.PRIMARY, 0.1)  # the primary died before its ACTIVE reached us
    for t in (1.0, 2.0, 3.0):
        backup.tick(t)
        assert backup.client(t) == [Action.REFUSE]
    assert backup.client(3.2) == [Action.ACTIVATED, Action.SERVE]


def test_primary_and_backup_meet_primary_active():
    primary, backup = pair()
    assert primary.peer(State.BACKUP, 0.1) == [Action.ACTIVATED]
    assert backup.peer(State.ACTIVE, 0.2) == []
    assert backup.state is State.PASSIVE
    assert primary.client(0.3) == [Action.SERVE]
    assert backup.client(0.3) == [Action.REFUSE]


def test_the_backup_takes_over_on_a_client_vote_once_the_primary_is_silent():
    primary, backup = pair()
    primary.peer(State.BACKUP, 0.1)
    backup.peer(State.ACTIVE, 0.2)
    for t in (1.0, 2.0, 3.1):
        backup.tick(t)
        assert backup.client(t) == [Action.REFUSE]  # heard within the expiry: no vote counts
    backup.tick(3.3)
    assert backup.client(3.3) == [Action.ACTIVATED, Action.SERVE]


def test_a_restarted_primary_goes_passive_beside_an_active_backup():
    _, backup = pair()
    backup.peer(State.ACTIVE, 0.1)
    backup.tick(2.0)
    backup.client(3.5)
    assert backup.active
    primary, _ = pair(now=4.0)
    assert primary.peer(State.ACTIVE, 4.1) == []
    assert primary.state is State.PASSIVE
    assert backup.peer(State.PRIMARY, 4.2) == []
    assert backup.active


def test_a_restarted_primary_beside_a_passive_backup_leaves_the_backup_active():
    """Both rules must not fire at once: the passive backup takes over on hearing the restarted
    primary, and the primary waits for that instead of taking the backup's PASSIVE as its cue."""
    _, backup = pair()
    backup.peer(State.ACTIVE, 0.1)
    primary, _ = pair(now=0.5)
    assert primary.peer(State.PASSIVE, 0.6) == []
    assert backup.peer(State.PRIMARY, 0.6) == [Action.ACTIVATED]
    assert primary.peer(State.ACTIVE, 0.7) == []
    assert primary.state is State.PASSIVE and backup.active


def test_two_actives_meeting_leave_the_backup_active():
    primary, backup = pair()
    primary.peer(State.BACKUP, 0.1)
    backup.peer(State.ACTIVE, 0.2)
    for t in (1.0, 2.0, 3.0):
        primary.tick(t)
        backup.tick(t)
    backup.client(3.5)  # the primary was cut off: the clients voted for the backup
    assert primary.active and backup.active
    assert primary.peer(State.ACTIVE, 3.6) == [Action.DEACTIVATED]
    assert backup.peer(State.ACTIVE, 3.6) == []
    assert backup.active and not primary.active


def test_a_frozen_active_wakes_passive_and_stale_peer_messages_do_not_activate_it():
    primary, backup = pair()
    primary.peer(State.BACKUP, 0.1)
    backup.peer(State.ACTIVE, 0.2)
    # SIGSTOP at 0.5; the backup's PASSIVE messages wait in the socket; SIGCONT at 10.
    assert primary.tick(10.0)[0] == [Action.DEACTIVATED]
    assert (primary.stalls, primary.last_stall_s, backup.stalls) == (1, 9.9, 0)
    assert primary.peer(State.PASSIVE, 10.0) == []
    assert primary.client(10.0) == [Action.REFUSE]
    assert primary.peer(State.ACTIVE, 10.5) == []  # the backup took over meanwhile
    assert primary.state is State.PASSIVE


def test_a_woken_primary_beside_a_passive_backup_serves_again():
    primary, backup = pair()
    primary.peer(State.BACKUP, 0.1)
    backup.peer(State.ACTIVE, 0.2)
    primary.tick(10.0)
    assert primary.peer(State.PASSIVE, 10.0 + INTERVAL) == [Action.ACTIVATED]


def test_tick_says_when_the_state_is_due():
    primary, _ = pair()
    assert primary.tick(0.0) == ([], True)
    assert primary.tick(0.5) == ([], False)
    assert primary.tick(1.0) == ([], True)


# -- a simulated pair -------------------------------------------------------------------------------


@dataclass
class Node:
    fsm: BinaryStar
    inbox: list = field(default_factory=list)  # (deliver_at, state, sender's stint or None)
    stint: int = 0  # counts this broker's active periods
    heard_stint: int | None = None  # the peer's active stint heard during our current one
    heard_at: float | None = None  # when a peer message last arrived
    ever_heard: bool = False


@dataclass(frozen=True)
class Segment:
    steps: int
    drop_ab: bool  # primary -> backup lost
    drop_ba: bool
    freeze: int  # 0 none, 1 the primary, 2 the backup
    client: int  # 0 no client, 1 to the primary, 2 to the backup, 3 to both, 4 a failover client
    restart: int  # 0 none, 1 the primary, 2 the backup: a fresh process at the segment's start


# Short segments, and ones past the expiry (where votes count).
steps = st.one_of(st.integers(1, 10), st.integers(30, 80))
segments = st.lists(st.builds(Segment, steps, st.booleans(), st.booleans(),
                              st.integers(0, 2), st.integers(0, 4), st.integers(0, 2)),
                    min_size=1, max_size=14)


class Pair:
    def __init__(self) -> None:
        a, b = pair()
        self.nodes = [Node(a), Node(b)]
        self.now = 0.0
        self.quiet_since = 0.0  # no drop nor freeze since
        self.target = 0  # the failover client's endpoint

    def run(self, seg: Segment) -> None:
        if seg.restart:
            i = seg.restart - 1
            self.nodes[i] = Node(BinaryStar(primary=i == 0, now=self.now, expiry_s=EXPIRY,
                                            interval_s=INTERVAL))
        if seg.drop_ab or seg.drop_ba or seg.freeze:
            self.quiet_since = float("inf")
        for _ in range(seg.steps):
            self.now = round(self.now + DT, 6)
            if self.quiet_since == float("inf") and not (seg.drop_ab or seg.drop_ba or seg.freeze):
                self.quiet_since = self.now
            for i, node in enumerate(self.nodes):
                if seg.freeze != i + 1:
                    self.turn(i, node, seg)
            self.check()

    def turn(self, i: int, node: Node, seg: Segment) -> None:
        peer = self.nodes[1 - i]
        actions, due = node.fsm.tick(self.now)
        self.note(node, actions)
        arrived = [m for m in node.inbox if m[0] <= self.now]
        node.inbox = [m for m in node.inbox if m[0] > self.now]
        for _, state, stint in arrived:
            self.note(node, node.fsm.peer(state, self.now))
            node.heard_at, node.ever_heard = self.now, True
            if node.fsm.active and stint is not None:
                node.heard_stint = stint
        if due and not (seg.drop_ab if i == 0 else seg.drop_ba):
            peer.inbox.append((self.now + DT, node.fsm.state, node.stint if node.fsm.active else None))
        if seg.client in (i + 1, 3) or (seg.client == 4 and self.target == i):
            self.vote(i, node)

    def vote(self, i: int, node: Node) -> None:
        quiet = node.heard_at is None or self.now - node.heard_at >= EXPIRY - 1e-9
        actions = node.fsm.client(self.now)
        if Action.ACTIVATED in actions:
            assert quiet, "a client vote counted while the peer was heard within the expiry"
            assert i == 0 or node.ever_heard, "a backup served before it ever saw the primary"
        self.note(node, actions)
        if Action.REFUSE in actions:
            self.target = 1 - i  # the failover client tries the other endpoint

    @staticmethod
    def note(node: Node, actions: list[Action]) -> None:
        if Action.ACTIVATED in actions:
            node.stint += 1
            node.heard_stint = None
        assert (Action.SERVE in actions) <= node.fsm.active

    def check(self) -> None:
        a, b = self.nodes
        if not (a.fsm.active and b.fsm.active):
            return
        # Two actives are possible only while they cannot hear each other, and never last.
        assert not (a.heard_stint == b.stint and b.heard_stint == a.stint), \
            "both active though each heard the other active"
        assert self.now - self.quiet_since < 2 * INTERVAL + 2 * DT, \
            f"both active {self.now - self.quiet_since:.1f} s after the link healed"


CUT_THEN_HEAL = [Segment(20, False, False, 0, 0, 0), Segment(60, True, False, 0, 3, 0),
                 Segment(40, False, False, 0, 3, 0)]


@settings(max_examples=300, deadline=None)
@given(segments)
@example(CUT_THEN_HEAL)
@example([Segment(30, False, False, 0, 0, 0), Segment(1, False, False, 0, 0, 1)])  # primary restart
def test_a_simulated_pair_never_has_two_actives_that_hear_each_other(schedule):
    sim = Pair()
    for seg in schedule:
        sim.run(seg)


@settings(max_examples=100, deadline=None)
@given(segments)
def test_a_failover_client_is_served_once_the_pair_is_quiet(schedule):
    """Whatever happened before, a quiet link and a client that follows the refusals end with one
    active broker serving it."""
    sim = Pair()
    for seg in schedule:
        sim.run(seg)
    sim.run(Segment(int(3 * EXPIRY / DT), False, False, 0, 4, 0))
    served = [n.fsm.client(sim.now) for n in sim.nodes]
    assert sorted(Action.SERVE in s for s in served) == [False, True]
