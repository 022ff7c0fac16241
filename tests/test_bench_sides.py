"""``--side NAME[@TREE]=k=v,k=v``: what the side-by-side benchmarks take, and the errors they give."""

import argparse

import pytest

from ovpool.bench.sides import Side, side, tree_side


def test_a_side_names_its_settings():
    got = side("plain=answer_tails=off,prefix_cache=on")
    assert got == Side("plain", ("answer_tails=off", "prefix_cache=on"))
    assert got.settings == {"answer_tails": "off", "prefix_cache": "on"}


def test_a_side_without_settings_runs_the_defaults():
    assert side("base=") == Side("base")
    assert side("base=").settings == {}


def test_a_value_may_hold_an_equals_sign():
    assert side("x=device=GPU.1").settings == {"device": "GPU.1"}


@pytest.mark.parametrize("text", ["plain", "=answer_tails=off", "plain=answer_tails", "plain==off",
                                  "plain@=", "plain=answer_tails=off,oops"])
def test_a_malformed_side_names_the_form(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=k=v"):
        tree_side(text)


def test_an_unknown_setting_is_named():
    with pytest.raises(argparse.ArgumentTypeError, match="unknown setting 'answer_tail'"):
        side("plain=answer_tail=off")


def test_a_tree_side_runs_on_another_checkout(tmp_path):
    other = tree_side(f"base@{tmp_path}=answer_tails=off")
    assert other == Side("base", ("answer_tails=off",), str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="not a folder"):
        tree_side(f"base@{tmp_path / 'missing'}=")
    with pytest.raises(argparse.ArgumentTypeError, match="runs every side here"):
        side(f"base@{tmp_path}=")


def test_argparse_turns_a_bad_side_into_a_usage_error(capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--side", type=side, action="append")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--side", "plain"])
    assert exit_.value.code == 2
    assert "expected NAME=k=v" in capsys.readouterr().err
