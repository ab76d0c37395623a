"""The retention rule (`Retention.expired`, a pure function of the manifest, the archive's
clock and the log's first position) and the flush's `through` parameter, case by case."""

from __future__ import annotations

import pytest

from rlog.archive.archiver import Retention
from rlog.archive.endpoint import ControlPolicy, TlsFiles, flush_position, refusal
from rlog.archive.format import Manifest, SegmentInfo


def archive(*listed: float | None) -> Manifest:
    """Segments of ten positions each from 0, listed at these archive-clock times."""
    segments = [
        SegmentInfo(
            key=SegmentInfo.key_for(10 * i, 10 * i + 9),
            first=10 * i,
            last=10 * i + 9,
            entries=10,
            bytes=100,
            sha256="0" * 64,
            created=1.7e9 + i,  # the wall clock: never read by the rule
            archived_at=at,
        )
        for i, at in enumerate(listed)
    ]
    return Manifest("log", 0, 10 * len(listed) - 1, segments)


def firsts(doomed: list[SegmentInfo]) -> list[int]:
    return [s.first for s in doomed]


def test_age_is_the_archive_clock_between_listings():
    m = archive(0, 100, 200, 5000)
    assert firsts(Retention(max_age=4850).expired(m, 5000, log_begin=10**6)) == [0, 10]
    # a clock far ahead (whatever moved it) ages nothing past the newest listing
    assert firsts(Retention(max_age=4850).expired(m, 10**12, log_begin=10**6)) == [0, 10]
    # and a clock behind the newest listing is what counts
    assert firsts(Retention(max_age=4850).expired(m, 4900, log_begin=10**6)) == [0]


def test_never_what_the_log_holds_nor_the_newest():
    m = archive(0, 100, 200, 5000)
    assert firsts(Retention(max_age=10).expired(m, 5000, log_begin=15)) == [0]  # 10..19 held
    assert firsts(Retention(max_age=10).expired(m, 5000, log_begin=10**6)) == [0, 10, 20]
    assert firsts(Retention(max_age=10, keep_newest=3).expired(m, 5000, 10**6)) == [0]
    assert Retention(max_age=10, keep_newest=0).expired(archive(0), 5000, 10**6) == []


def test_segments_without_a_listing_time_count_as_just_listed():
    m = archive(None, None, 9000)
    assert Retention(max_age=10).expired(m, 9000, log_begin=10**6) == []


def test_keep_from_is_by_position_alone():
    m = archive(0, 0, 0, 0)
    assert firsts(Retention(keep_from=25).expired(m, 0, log_begin=0)) == [0, 10]
    assert firsts(Retention(keep_from=10**6).expired(m, 0, log_begin=0)) == [0, 10, 20]


@pytest.mark.parametrize(
    "query, position",
    [("through=0", 0), ("through=42", 42), ("through=" + "9" * 20, int("9" * 20))],
)
def test_flush_position_accepts_positions(query, position):
    assert flush_position(query) == position


@pytest.mark.parametrize(
    "query, words",
    [
        ("", "missing"),
        ("through=", "is not a position"),
        ("through=+1", "is not a position"),
        ("through=%C2%B2", "is not a position"),  # "²": str.isdigit says yes
        ("through=%EF%BC%91", "is not a position"),  # a fullwidth "1": int() takes it
        ("through=" + "1" * 21, "at most 20"),
        ("through=1&through=2", "once"),
    ],
)
def test_flush_position_refuses_garbage(query, words):
    with pytest.raises(ValueError, match=words):
        flush_position(query)


def test_refusal_contract():
    tls = ControlPolicy(TlsFiles("ca", "cert", "key"))
    assert refusal(tls, {})[0].startswith("401")  # type: ignore[index]
    assert refusal(tls, {"rlog.peer_subject": "admin"})[0].startswith("403")  # type: ignore[index]
    assert refusal(tls, {"rlog.peer_subject": "rlog-operator"}) is None
    assert ControlPolicy().host == "127.0.0.1" and tls.host == ""
    assert refusal(ControlPolicy(), {}) is None  # loopback: the address is the policy
