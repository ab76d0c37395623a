"""The journal on a failing disk (docs/faults.md, "A failing disk"): a write that fails with
an OS error fails its waiters at once, keeps every batch queued in order, says so
(`failing`, `on_failing_changed`), probes the disk by writing again, and once the disk
takes writes writes them all and says that too. A failure that is not the disk's stays
final, as before."""

from __future__ import annotations

import asyncio
import errno

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime import journal as journal_module
from rlog.runtime.journal import Journal
from rlog.runtime.metrics import ReplicaMetrics
from rlog.storage import WriteBatch, open_storage
from rlog.storage.base import StorageError


def batch(position: int) -> WriteBatch:
    return WriteBatch(actions=[pb.Action(position=position, type=pb.APPEND, value=b"v")])


def test_a_failing_disk_keeps_the_batches_and_writes_them_once_it_works(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "DISK_FAILING_RETRY", 0.05)
    storage = open_storage(tmp_path, "memory")
    broken = {"on": False}
    real_apply = storage.apply

    def apply(b: WriteBatch) -> None:
        if broken["on"]:
            try:
                raise OSError(errno.EIO, "Input/output error")
            except OSError as exc:
                raise StorageError("segment write failed") from exc
        real_apply(b)

    storage.apply = apply  # type: ignore[method-assign]
    core = ReplicaCore(storage)
    journal = Journal(storage, core, ReplicaMetrics(0))
    changes: list[bool] = []
    journal.on_failing_changed = lambda: changes.append(journal.failing is not None)

    async def scenario() -> None:
        journal.start()
        await journal.persist(batch(1))
        broken["on"] = True
        with pytest.raises(StorageError):
            await journal.persist(batch(2))
        assert journal.failing is not None and changes == [True]
        with pytest.raises(StorageError):  # answered at once, kept queued
            journal.submit(batch(3))
        await asyncio.sleep(0.2)  # probes fail: still failing, said once
        assert journal.failing is not None and changes == [True]
        broken["on"] = False
        for _ in range(100):
            if journal.failing is None:
                break
            await asyncio.sleep(0.02)
        assert journal.failing is None and changes == [True, False]
        await journal.persist(batch(4))
        await journal.close()

    asyncio.run(scenario())
    assert [a.position for a in storage.scan(1, 10)] == [1, 2, 3, 4]


def test_a_failure_that_is_not_the_disks_stays_final(tmp_path) -> None:
    storage = open_storage(tmp_path, "memory")

    def apply(b: WriteBatch) -> None:
        raise StorageError("a batch of 3 GiB is larger than a segment frame holds")

    storage.apply = apply  # type: ignore[method-assign]
    journal = Journal(storage, ReplicaCore(storage), ReplicaMetrics(0))

    async def scenario() -> None:
        journal.start()
        with pytest.raises(StorageError):
            await journal.persist(batch(1))
        assert journal.failing is None
        with pytest.raises(StorageError):
            journal.submit(batch(2))
        await journal.close()

    asyncio.run(scenario())
