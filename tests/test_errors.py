import pickle

import pytest

from ovpool import errors
from ovpool.errors import BY_CODE, OvpoolError, from_wire

ALL = sorted(BY_CODE.values(), key=lambda c: c.code)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_wire_round_trip_gives_same_class(cls):
    err = cls("something went wrong: try X")
    back = from_wire(*err.to_wire())
    assert type(back) is cls and str(back) == str(err)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_errors_pickle(cls):
    back = pickle.loads(pickle.dumps(cls("msg")))
    assert type(back) is cls and back.message == "msg"


def test_codes_are_unique_and_nested_by_class():
    codes = [c.code for c in ALL]
    assert len(codes) == len(set(codes))
    for cls in ALL:
        parent = cls.__mro__[1]
        if parent is not OvpoolError and cls is not OvpoolError:
            assert cls.code.startswith(parent.code + "."), cls


def test_unknown_code_falls_back_to_nearest_ancestor():
    err = from_wire("request.some_future_error", "new")
    assert type(err) is errors.RequestError and str(err) == "new"
    assert type(from_wire("totally.unknown", "x")) is OvpoolError


def test_docstring_draws_every_class():
    for cls in ALL:
        assert cls.__name__ in errors.__doc__, cls.__name__
