"""Storage expansion and migration (rlog_operator.storage): quantities, the shrink refusal,
and the planner, over every combination of claim states it can see."""

from __future__ import annotations

import itertools
from decimal import Decimal

import pytest

from rlog_operator import storage as sg
from rlog_operator.quantities import quantity
from rlog_operator.storage import Claim, Storage

PODS = ["log-0", "log-1", "log-2"]
WANTED = Storage("2Gi", "fast")


def claim(i: int, size: str = "2Gi", cls: str = "fast") -> Claim:
    return Claim(f"data-log-{i}", f"log-{i}", Storage(size, cls))


def voting(*not_voting: str) -> dict[str, str]:
    return {p: ("RECOVERING" if p in not_voting else "VOTING") for p in PODS}


# ---- quantities -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", 2**30), ("64Mi", 64 * 2**20), ("1G", 10**9), ("500M", 5 * 10**8), ("1e9", 10**9),
     (1073741824, 2**30), ("1.5Gi", 3 * 2**29), ("100m", Decimal("0.1")), ("2Ti", 2 * 2**40)],
)  # fmt: skip
def test_quantities(text, value):
    assert quantity(text) == value


@pytest.mark.parametrize("bad", ["", "Gi", "1GB", "1 Gi", "-", "1.2.3Gi"])
def test_bad_quantities(bad):
    with pytest.raises(ValueError):
        quantity(bad)


def test_shrinking_is_refused_and_growing_is_not():
    assert "cannot shrink (2Gi -> 1Gi)" in sg.shrink_refusal(Storage("2Gi"), Storage("1Gi"))
    assert sg.shrink_refusal(Storage("1Gi"), Storage("1024Mi")) == ""  # equal, other unit
    assert sg.shrink_refusal(Storage("1Gi"), Storage("2G")) == ""
    assert "cannot shrink" in sg.shrink_refusal(Storage("1Gi"), Storage("1G"))  # 1G < 1Gi


# ---- the planner: the simple cases ------------------------------------------------------------


def plan(
    claims, built=WANTED, wanted=WANTED, states=None, leader="log-0", expandable=False, busy=""
):
    return sg.next_step(
        wanted, built, claims, states=states or voting(), leader=leader,
        expandable=expandable, busy=busy,
    )  # fmt: skip


def test_nothing_to_do_when_every_claim_matches():
    assert plan([claim(i) for i in range(3)]).kind == "none"
    assert plan([], built=None).kind == "none"  # a new log: reconcile creates it


def test_claims_without_a_statefulset_get_it_back():
    assert plan([claim(i) for i in range(3)], built=None).kind == "create-statefulset"


def test_sizes_compare_by_value_not_by_spelling():
    """The API server returns "1024Mi" as "1Gi": no template replacement for that."""
    wanted = Storage("1024Mi", "fast")
    claims = [claim(i, "1Gi") for i in range(3)]
    assert plan(claims, built=Storage("1Gi", "fast"), wanted=wanted).kind == "none"


def test_a_shrink_is_refused_before_anything_else():
    step = plan([claim(i, "4Gi") for i in range(3)], built=Storage("4Gi", "fast"))
    assert step.kind == "refuse" and "cannot shrink" in step.reason


def test_the_template_is_replaced_first():
    step = plan([claim(i, "1Gi") for i in range(3)], built=Storage("1Gi", "fast"))
    assert step.kind == "recreate-statefulset"
    assert step.outdated == tuple(PODS)


def test_an_expandable_class_grows_claims_in_place_without_quorum():
    claims = [claim(0), claim(1, "1Gi"), claim(2, "1Gi")]
    step = plan(claims, expandable=True, states=voting("log-0", "log-2"), busy="a queue")
    assert (step.kind, step.claim, step.size) == ("expand", "data-log-1", "2Gi")


def test_a_class_that_cannot_expand_migrates():
    step = plan([claim(0), claim(1), claim(2, "1Gi")], expandable=False)
    assert (step.kind, step.pod) == ("migrate", "log-2")


def test_expansion_waits_for_the_class_lookup():
    step = plan([claim(0), claim(1), claim(2, "1Gi")], expandable=None)
    assert step.kind == "wait" and "StorageClass" in step.reason


def test_the_leader_migrates_last():
    claims = [claim(0, cls="slow"), claim(1, cls="slow"), claim(2)]
    assert plan(claims, leader="log-1").pod == "log-0"
    assert plan([claim(0), claim(1, cls="slow"), claim(2)], leader="log-1").pod == "log-1"


def test_an_unset_class_accepts_any_class():
    wanted = Storage("2Gi")
    claims = [claim(i, cls="whatever") for i in range(3)]
    assert plan(claims, built=wanted, wanted=wanted).kind == "none"


def test_migration_status_counts_progress():
    claims = [claim(0), claim(1, cls="slow"), claim(2, cls="slow")]
    step = plan(claims)
    status = sg.migration_status(WANTED, claims, step)
    assert status["phase"] == "Migrating"
    assert (status["done"], status["total"]) == (1, 3)
    assert status["pending"] == ["log-1", "log-2"]
    assert status["size"] == "2Gi" and status["storageClassName"] == "fast"
    idle = sg.migration_status(
        WANTED, [claim(i) for i in range(3)], plan([claim(i) for i in range(3)])
    )
    assert idle["phase"] == "Idle" and idle["done"] == 3 and "pending" not in idle


# ---- the planner, exhaustively ------------------------------------------------------------------

CLAIM_STATES = {"ok": ("2Gi", "fast"), "small": ("1Gi", "fast"), "class": ("2Gi", "slow"),
                "both": ("1Gi", "slow")}  # fmt: skip


def _cases():
    for kinds in itertools.product(CLAIM_STATES, repeat=3):
        for expandable in (True, False, None):
            for busy in ("", "queued"):
                for not_voting in ((), ("log-1",)):
                    for leader in PODS:
                        yield kinds, expandable, busy, not_voting, leader


@pytest.mark.parametrize("template_matches", [True, False])
def test_every_combination_keeps_the_invariants(template_matches):
    built = WANTED if template_matches else Storage("1Gi", "slow")
    count = 0
    for kinds, expandable, busy, not_voting, leader in _cases():
        count += 1
        claims = [claim(i, *CLAIM_STATES[k]) for i, k in enumerate(kinds)]
        step = plan(claims, built=built, states=voting(*not_voting), leader=leader,
                    expandable=expandable, busy=busy)  # fmt: skip
        outdated = {f"log-{i}" for i, k in enumerate(kinds) if k != "ok"}
        case = (kinds, expandable, busy, not_voting, leader, step)
        assert set(step.outdated) == outdated, case
        if not template_matches:
            assert step.kind == "recreate-statefulset", case  # always first
            continue
        if not outdated:
            assert step.kind == "none", case
            continue
        assert step.kind in ("expand", "migrate", "wait"), case
        if step.kind == "expand":
            # only in place on an expandable class, only for a claim of the right class
            assert expandable is True and kinds[int(step.pod[-1])] == "small", case
            assert step.size == WANTED.size
        if step.kind == "migrate":
            # quorum-gated, one at a time, and a claim that needs it
            assert not busy and not not_voting, case
            assert step.pod in outdated, case
            needs_new_claim = kinds[int(step.pod[-1])] in ("class", "both") or expandable is False
            assert needs_new_claim, case
            if step.pod == leader:  # the leader last: no other claim could move now
                movable = {
                    p
                    for p in outdated
                    if kinds[int(p[-1])] in ("class", "both") or expandable is False
                }
                assert movable == {leader}, case
        if step.kind == "wait":
            assert busy or not_voting or expandable is None, case
            if not busy and not not_voting:  # only the class lookup holds it
                assert all(kinds[int(p[-1])] == "small" for p in outdated), case
        # an expandable small claim is never migrated while it could grow in place
        smalls = [p for p in outdated if kinds[int(p[-1])] == "small"]
        if expandable and smalls:
            assert step.kind == "expand", case
    assert count == 4**3 * 3 * 2 * 2 * 3
