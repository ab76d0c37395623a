"""The storage engine of a data dir: `auto` (the default) opens a data dir with the engine
whose store it holds and gives a dir that holds none the default engine (segment); a dir
holding two engines' stores is refused, never guessed; an engine named explicitly is used
as named and refused on another engine's store. Real files on real disks, the real `rlog`
command, and a real log of replica processes whose LMDB data dirs outlive the change of
default."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_runs import assert_one_line_error, rlog
from engines import DISK, action
from format_fixtures import SUBDIR, snapshot, unpack_v1
from live import append_acked, check

from rlog.client import Client
from rlog.proto import rlog_pb2 as pb
from rlog.storage import (
    AUTO,
    DEFAULT_ENGINE,
    ENGINE_CHOICES,
    ENGINES,
    StorageError,
    WriteBatch,
    engine_of,
    open_storage,
    resolve_engine,
)
from rlog.tools.dev import DevCluster, free_port

ALL_SUBDIRS = set(SUBDIR.values())


def subdirs(data: Path) -> set[str]:
    """The engine sub-directories the data dir holds."""
    return {p.name for p in data.iterdir() if p.name in ALL_SUBDIRS}


def write(data: Path, engine: str, values: dict[int, bytes]) -> None:
    """Open the data dir with `engine`, write the values at their positions and a VOTING
    metadata, synced, and close it."""
    store = open_storage(data, engine)
    try:
        meta = store.metadata()
        meta.status = pb.VOTING
        actions = [action(p, v) for p, v in sorted(values.items())]
        store.apply(WriteBatch(metadata=meta, actions=actions, sync=True))
    finally:
        store.close()


def read_back(data: Path, engine: str) -> tuple[pb.Status.ValueType, dict[int, bytes]]:
    store = open_storage(data, engine)
    try:
        return store.metadata().status, {a.position: a.value for a in store.scan(0, 2**64 - 1)}
    finally:
        store.close()


VALUES = {1: b"one", 2: b"two", 7: b"seven"}


# ---- the rule ---------------------------------------------------------------------------


def test_auto_is_the_default_and_never_memory() -> None:
    assert DEFAULT_ENGINE == "segment"
    assert ENGINE_CHOICES[0] == AUTO and AUTO not in ENGINES
    assert DEFAULT_ENGINE in ENGINES and DEFAULT_ENGINE != "memory"


def test_a_missing_or_empty_dir_holds_no_store(tmp_path: Path) -> None:
    assert engine_of(tmp_path / "missing") is None
    assert engine_of(tmp_path) is None
    (tmp_path / "some-file").write_text("not a store\n")
    assert engine_of(tmp_path) is None
    assert resolve_engine(tmp_path / "missing", AUTO) == DEFAULT_ENGINE


def test_auto_on_a_fresh_dir_creates_a_segment_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    write(data, AUTO, VALUES)
    assert subdirs(data) == {"segments"}
    assert engine_of(data) == "segment"
    assert read_back(data, "segment") == (pb.VOTING, VALUES)


def test_open_storage_without_an_engine_is_auto(tmp_path: Path) -> None:
    write(tmp_path / "lmdb-dir", "lmdb", VALUES)
    open_storage(tmp_path / "lmdb-dir").close()  # no engine named: the LMDB store opens
    assert subdirs(tmp_path / "lmdb-dir") == {"lmdb"}
    open_storage(tmp_path / "fresh").close()
    assert subdirs(tmp_path / "fresh") == {"segments"}


@pytest.mark.parametrize("engine", DISK)
def test_auto_opens_the_store_a_dir_holds(engine: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    write(data, engine, VALUES)
    assert engine_of(data) == engine
    assert read_back(data, AUTO) == (pb.VOTING, VALUES)
    write(data, AUTO, {9: b"nine"})  # and writes go to that store
    assert read_back(data, engine) == (pb.VOTING, {**VALUES, 9: b"nine"})
    assert subdirs(data) == {SUBDIR[engine]}  # no store of the default engine beside it


@pytest.mark.parametrize("engine", DISK)
def test_auto_opens_a_dir_written_by_rlog_before_format_versions(
    engine: str, tmp_path: Path
) -> None:
    data = unpack_v1(engine, tmp_path)
    assert engine_of(data) == engine
    store = open_storage(data, AUTO)
    try:
        assert store.first_position() is not None  # the fixture's log, not an empty one
    finally:
        store.close()
    assert subdirs(data) == {SUBDIR[engine]}


def two_stores(tmp_path: Path) -> Path:
    """A data dir holding an LMDB store and, moved in beside it, a segment store."""
    data = tmp_path / "data"
    write(data, "lmdb", VALUES)
    write(tmp_path / "other", "segment", {3: b"three"})
    shutil.move(tmp_path / "other" / "segments", data / "segments")
    return data


def test_a_dir_holding_two_stores_is_refused_naming_both_and_left_as_it_is(
    tmp_path: Path,
) -> None:
    data = two_stores(tmp_path)
    before = snapshot(data), sorted(p.name for p in data.rglob("*"))
    for call in (lambda: engine_of(data), lambda: open_storage(data, AUTO)):
        with pytest.raises(StorageError) as refused:
            call()
        message = str(refused.value)
        assert "'lmdb' and 'segment'" in message and str(data) in message
        assert "\n" not in message
    assert (snapshot(data), sorted(p.name for p in data.rglob("*"))) == before
    # An engine named explicitly opens its own store, as it always did.
    assert read_back(data, "lmdb") == (pb.VOTING, VALUES)


@pytest.mark.parametrize(("held", "asked"), [("lmdb", "segment"), ("segment", "lmdb")])
def test_an_explicit_engine_is_refused_on_another_engines_store(
    held: str, asked: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    write(data, held, VALUES)
    with pytest.raises(StorageError, match=f"holds a '{held}' store.*not '{asked}'"):
        open_storage(data, asked)
    assert subdirs(data) == {SUBDIR[held]}  # nothing of the other engine created
    assert read_back(data, held) == (pb.VOTING, VALUES)


def test_an_unknown_engine_is_refused_naming_the_choices(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"unknown storage engine 'nope' \(one of auto, lmdb"):
        open_storage(tmp_path / "data", "nope")
    assert not (tmp_path / "data").exists()


# ---- the command line -------------------------------------------------------------------


def test_rlog_initialize_creates_a_segment_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    result = rlog("initialize", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    assert subdirs(data) == {"segments"}
    assert read_back(data, "segment") == (pb.VOTING, {})


def test_rlog_initialize_keeps_the_engine_of_an_empty_lmdb_store(tmp_path: Path) -> None:
    data = tmp_path / "data"
    open_storage(data, "lmdb").close()  # an EMPTY replica's store, never initialized
    result = rlog("initialize", "--data-dir", str(data))
    assert result.returncode == 0, result.stderr
    assert subdirs(data) == {"lmdb"}
    assert read_back(data, "lmdb") == (pb.VOTING, {})


def test_rlog_initialize_refuses_a_dir_holding_two_stores(tmp_path: Path) -> None:
    data = two_stores(tmp_path)
    result = rlog("initialize", "--data-dir", str(data))
    assert_one_line_error(result, 1, "'lmdb' and 'segment'")


def test_rlog_replica_refuses_a_dir_holding_two_stores(tmp_path: Path) -> None:
    data = two_stores(tmp_path)
    peer = f"127.0.0.1:{free_port()}"
    result = rlog("replica", "--id", "0", "--peers", peer, "--data-dir", str(data))
    assert_one_line_error(result, 1, "'lmdb' and 'segment'")


@pytest.mark.parametrize("command", ["initialize", "replica"])
def test_an_unknown_storage_engine_is_a_usage_error(command: str, tmp_path: Path) -> None:
    args = ["--data-dir", str(tmp_path / "d"), "--storage-engine", "nope"]
    if command == "replica":
        args += ["--id", "0", "--peers", f"127.0.0.1:{free_port()}"]
    line = assert_one_line_error(rlog(command, *args), 2, "nope")
    assert "auto" in line  # the choices are named
    assert not (tmp_path / "d").exists()


# ---- a live log -------------------------------------------------------------------------


@pytest.mark.slow
def test_lmdb_replicas_restarted_without_an_engine_keep_their_lmdb_stores(
    tmp_path: Path,
) -> None:
    """A log written by replicas started with `--storage-engine lmdb` (the old default),
    restarted without the flag as the operator starts them: every replica reopens its LMDB
    store with everything acknowledged; a replica whose data dir is then lost comes back on
    a segment store and recovers the log from its LMDB peers."""
    cluster = DevCluster(3, tmp_path, election_timeout=0.5, storage_engine="lmdb")
    try:
        cluster.start()
        with Client(cluster.endpoints) as client:
            acknowledged = {}
            for i in range(20):
                values = [b"before-%d-%d" % (i, j) for j in range(5)]
                positions = append_acked(client, values)
                acknowledged.update(zip(positions, values, strict=True))
        cluster.stop()
        assert all(subdirs(d) == {"lmdb"} for d in cluster.data_dirs)

        cluster.storage_engine = AUTO
        assert "--storage-engine" not in cluster.command(0)
        cluster.start()
        check(cluster, acknowledged)
        with Client(cluster.endpoints) as client:
            values = [b"after-%d" % j for j in range(5)]
            acknowledged.update(zip(append_acked(client, values), values, strict=True))
        check(cluster, acknowledged)
        for i, data in enumerate(cluster.data_dirs):
            assert subdirs(data) == {"lmdb"}
            assert f"storage: lmdb engine (data dir {data} holds a lmdb store)" in (
                cluster.log_file(i).read_text()
            )

        lost = (cluster.wait_for_leader() + 1) % 3  # a follower: the log stays available
        cluster.wipe(lost)
        cluster.start_replica(lost)
        cluster.wait_for(
            lambda found: found[lost] is not None and found[lost].status == pb.VOTING,
            60,
            "the replica whose data dir was lost VOTING again",
        )
        check(cluster, acknowledged)
        assert subdirs(cluster.data_dir(lost)) == {"segments"}
        assert "holds no store: the default engine" in cluster.log_file(lost).read_text()
    finally:
        cluster.stop()
