"""The admission thread (ovpool.worker.generate.admission): a refusal or a build past its budget
fails only its own request; the model's vocabulary build is not part of the budget."""

from __future__ import annotations

import threading

from ovpool.errors import InvalidRequestError
from ovpool.worker.generate import admission
from ovpool.worker.generate.admission import Preparer

REGEX = {"type": "regex", "pattern": "a+"}


class Vocabulary:
    """Stands for constraint.Vocabulary: its build blocks until ``release`` is set."""

    def __init__(self, release: threading.Event):
        self.release = release

    def constraint(self, fmt: dict, ignore_eos: bool, param: str = "response_format") -> str:
        self.release.wait()
        return "constraint"


def taken(preparer: Preparer) -> list:
    while not (out := preparer.take()):
        preparer.wait(0.01)
    return out


def test_a_build_past_its_budget_fails_its_request_and_the_next_one_is_served(monkeypatch):
    monkeypatch.setattr(admission, "BUDGET_S", 0.0)
    release, preparer = threading.Event(), Preparer()
    preparer.submit("slow", lambda: [1, 2], lambda: Vocabulary(release), REGEX, False)
    [(rid, err)] = taken(preparer)
    assert rid == "slow" and isinstance(err, InvalidRequestError) and err.param == "response_format"
    release.set()  # the abandoned build ends on the thread; a request after it is admitted
    monkeypatch.setattr(admission, "BUDGET_S", 60.0)
    preparer.submit("next", lambda: [3], lambda: Vocabulary(release), REGEX, False)
    assert taken(preparer) == [("next", ([3], "constraint"))] and len(preparer) == 0


def test_a_refused_prompt_fails_alone_and_a_free_one_needs_no_vocabulary():
    def refuse() -> list[int]:
        raise InvalidRequestError("the prompt is empty: give at least one token")

    preparer = Preparer()
    preparer.submit("bad", refuse, lambda: None, REGEX, False)
    preparer.submit("free", lambda: [7], lambda: None, None, False)
    out = dict(taken(preparer))
    while len(out) < 2:
        out |= dict(taken(preparer))
    assert "empty" in str(out["bad"]) and out["free"] == ([7], None)


def test_a_request_just_handed_over_is_taken_in_the_same_step():
    # The step takes what the thread admitted since the last step (a chat's long history takes
    # about a millisecond there) instead of leaving it to the next step.
    preparer = Preparer()
    preparer.submit("turn", lambda: [1, 2, 3], lambda: None, None, False)
    assert preparer.take(fresh_s=30.0) == [("turn", ([1, 2, 3], None))]
    assert preparer.take(fresh_s=30.0) == []  # nothing new: no wait
