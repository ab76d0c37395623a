"""The nemesis schedule is a function of the seed alone (the same kinds, waits, holds and
picks whatever the cluster does), and `mix` means every kind the machine can inject."""

from __future__ import annotations

import itertools

from jepsen.nemesis import KINDS, MIX, PARTITIONS, expand, schedule


def steps(kinds, seed, n=50):
    return list(itertools.islice(schedule(kinds, seed, (0.1, 0.5), (0.2, 1.0)), n))


def test_the_schedule_depends_on_the_seed_only():
    kinds = list(MIX)
    assert steps(kinds, 0.25) == steps(kinds, 0.25)
    assert steps(kinds, 0.25) != steps(kinds, 0.5)
    for step in steps(kinds, 0.25, 500):
        assert step.kind in kinds
        assert 0.1 <= step.wait <= 0.5 and 0.2 <= step.hold <= 1.0 and 0 <= step.pick < 1
    assert {s.kind for s in steps(kinds, 0.25, 500)} == set(kinds)


def test_the_schedule_draws_the_same_numbers_whatever_the_kinds():
    # One kind more changes which kind is drawn, never the waits and holds: a schedule's
    # timing does not depend on what the faults are.
    a = steps(["pause-random"], 0.75)
    b = steps(["pause-random", "kill-random"], 0.75)
    assert [(s.wait, s.hold, s.pick) for s in a] == [(s.wait, s.hold, s.pick) for s in b]


def test_mix_means_every_kind_but_the_scenario():
    assert expand(["mix"], partitions=True) == list(MIX)
    assert "split-batch" in KINDS and "split-batch" not in MIX
    without = expand(["mix"], partitions=False)
    assert without == [k for k in MIX if k not in PARTITIONS]
    assert {"wipe-random", "wipe-leader", "kill-leader", "pause-random"} <= set(without)
    assert expand(["kill-random", "mix", "split-batch"], partitions=True) == [
        "kill-random",
        *[k for k in MIX if k != "kill-random"],
        "split-batch",
    ]
