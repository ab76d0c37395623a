"""The nemesis: real faults on a seeded schedule, each healed before the next.

Kinds (`--nemesis` takes a comma-separated list, or `mix`; each fault picks one at random):

- `pause-leader`, `pause-random`: SIGSTOP the replica's process group, SIGCONT after the
  hold (peers see a hung replica that keeps its sockets);
- `kill-leader`, `kill-random`: SIGKILL, restarted (same data dir and address) after the
  hold;
- `wipe-leader`, `wipe-random` (a non-leader): SIGKILL, delete the data dir, restart it
  empty after the hold: it must recover (EMPTY -> catch-up -> VOTING). Only when the other
  replicas hold a quorum of VOTING members; otherwise the fault is skipped (a wiped replica
  whose peers are not a quorum could lose chosen values: that is a double fault the log
  does not claim to survive);
- `partition-leader`: the leader cut off from every other replica; `partition-random`: a
  random minority cut off from the majority (needs network namespaces, see network.py).
  Clients still reach every replica;
- `power-loss-one` (a random replica), `power-loss-all` (every replica at once): a power
  cut. SIGKILL, then the replica's powerfs mount drops everything it had not synced
  (jepsen/powerfs.py; the data dirs are powerfs mounts when a power-loss kind is asked
  for), restarted on what is left after the hold: a replica must never have acknowledged,
  accepted or promised what it had not synced;
- `lose-segment`, `truncate-segment`, `bit-flip`, `disk-full`, `eio` (the group `disk`):
  disk faults of a random replica (jepsen/disk.py): a segment deleted, the newest one cut
  short or a byte of a synced frame flipped while it is stopped (SIGKILL, restarted on what
  is left after the hold); its data dir's tmpfs filled up, then freed; its writes failing
  with EIO, then working again. All but disk-full only while the others hold a quorum of
  VOTING members (the target leaves the quorum and must rejoin through one: as a wipe),
  and the target must be VOTING and hold the whole log after healing;
- `split-batch`: the leader cut off alone while its clients keep sending batches (which
  only it accepts: minority-accepted batches); once the others elected a new leader and it
  wrote its first entries (over the head of that range, at a higher proposal), that one cut
  off alone and the old one let back: the third leader's fill meets both leaders' entries
  in one range. This is the scenario in which a fill that settles a batch position by
  position tears a batch (see docs/jepsen.md, "Atomic batches").

The schedule is a pure function of the seed (`schedule()`): every step draws the same
numbers in the same order whatever happens in the cluster, so two runs with one seed inject
the same kinds with the same waits and holds; only *which* replica leads (the target of a
`-leader` kind, and whether a wipe's precondition holds) depends on the run. The wall clock
only times the waits and holds.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen import disk
from jepsen.history import History, now
from jepsen.network import Netns
from jepsen.powerfs import PowerFS, power_cut
from rlog.client.errors import RlogError
from rlog.config import quorum
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

KINDS = (
    "pause-leader",
    "pause-random",
    "kill-leader",
    "kill-random",
    "wipe-leader",
    "wipe-random",
    "partition-leader",
    "partition-random",
    "split-batch",
    "power-loss-one",
    "power-loss-all",
    *disk.DISK,
)
PARTITIONS = {"partition-leader", "partition-random", "split-batch"}
# Kinds that need the data dirs on powerfs (FUSE; jepsen/powerfs.py).
POWER = {"power-loss-one", "power-loss-all"}
# What `mix` means: every kind that needs no extra setup (split-batch is the scenario for
# one proof, asked for by name; the power cuts need FUSE mounts, asked for by name).
MIX = tuple(k for k in KINDS if k != "split-batch" and k not in POWER and k not in disk.DISK)
# Names that stand for several kinds (besides `mix`).
GROUPS = {"disk": disk.DISK}


def expand(kinds: Sequence[str], partitions: bool) -> list[str]:
    """`mix` stands for every kind of MIX (the partitions only when they are possible), a
    group (`disk`) for its kinds."""
    out: list[str] = []
    for kind in kinds:
        for k in MIX if kind == "mix" else GROUPS.get(kind, (kind,)):
            if kind == "mix" and k in PARTITIONS and not partitions:
                continue
            if k not in out:
                out.append(k)
    return out


@dataclass(frozen=True)
class Step:
    """One fault of the schedule, drawn before anything is known about the cluster."""

    kind: str
    wait: float  # healthy time before it
    hold: float  # how long it lasts (split-batch: from the third leader's election on)
    pick: float  # in [0, 1): which replica(s) a random kind targets


def schedule(
    kinds: Sequence[str],
    seed: float,
    interval: tuple[float, float],
    hold: tuple[float, float],
) -> Iterator[Step]:
    """The endless seeded fault schedule. Exactly four draws a step, in one order."""
    rng = random.Random(seed)
    while True:
        wait = rng.uniform(*interval)
        length = rng.uniform(*hold)
        kind = kinds[rng.randrange(len(kinds))]
        yield Step(kind, wait, length, rng.random())


@dataclass
class Fault:
    kind: str
    targets: list[int]
    start: int
    end: int = 0
    leader_known: bool = True
    detail: dict[str, Any] = field(default_factory=dict)  # what the nemesis saw (split-batch)

    def to_json(self, origin: int) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "targets": self.targets,
            "start_s": round((self.start - origin) / 1e9, 3),
            "end_s": round((self.end - origin) / 1e9, 3) if self.end else None,
            "leader_known": self.leader_known,
            **self.detail,
        }


@dataclass
class Nemesis:
    cluster: DevCluster
    kinds: list[str]
    seed: float
    history: History
    network: Netns | None = None
    mounts: list[PowerFS] | None = None  # each replica's data dir on powerfs (power-loss)
    tmpfs: bool = False  # each replica's data dir on a small tmpfs (disk-full)
    interval: tuple[float, float] = (1.0, 3.0)  # healthy time before a fault
    hold: tuple[float, float] = (3.0, 6.0)  # how long a fault lasts (elections take ~2 s)
    quorum_wait: float = 30.0  # how long a wipe waits for the others to be a VOTING quorum
    faults: list[Fault] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # kinds whose precondition never held
    wiped: set[int] = field(default_factory=set)  # every replica wiped in this run
    damaged: set[int] = field(default_factory=set)  # every replica a disk fault took out
    # Replicas that exited by themselves (a start that failed: a full disk at open), each
    # restarted at the next heal as a supervisor (Kubernetes) would: (replica, exit status).
    exited: list[tuple[int, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _paused: set[int] = field(default_factory=set)
    _killed: set[int] = field(default_factory=set)
    _filled: set[int] = field(default_factory=set)  # disk-full in force
    _failing: set[int] = field(default_factory=set)  # eio in force

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown nemesis {sorted(unknown)}; choose from {', '.join(KINDS)}")
        if PARTITIONS & set(self.kinds) and self.network is None:
            raise ValueError("partitions need network namespaces (root and `ip netns`)")
        if POWER & set(self.kinds) and self.mounts is None:
            raise ValueError("power cuts need the data dirs on powerfs (jepsen/powerfs.py)")
        if disk.DISK_FULL in self.kinds and not self.tmpfs:
            raise ValueError("disk-full needs the data dirs on tmpfs mounts (jepsen/disk.py)")

    # ---- observing ------------------------------------------------------------------------

    def _statuses(self) -> list[pb.StatusResponse | None]:
        return self.cluster.statuses(timeout=1.0)

    @staticmethod
    def _leaders(statuses: Sequence[pb.StatusResponse | None], among: Sequence[int]) -> list[int]:
        return [
            i
            for i in among
            if (s := statuses[i]) is not None and s.role == "leader" and s.status == pb.VOTING
        ]

    def _leader(self) -> int | None:
        return self.cluster.leader(timeout=1.0)

    def _voting_quorum_without(self, target: int) -> bool:
        """Whether the replicas other than `target` hold a quorum of VOTING members."""
        statuses = self._statuses()
        voting = sum(
            1
            for i, s in enumerate(statuses)
            if i != target and s is not None and s.status == pb.VOTING
        )
        return voting >= quorum(self.cluster.replicas)

    def _wait(self, predicate: Any, timeout: float, poll: float = 0.05) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline or self._stop.wait(poll):
                return False
        return True

    # ---- targets --------------------------------------------------------------------------

    def _target(self, step: Step) -> tuple[list[int], bool]:
        n = self.cluster.replicas
        pick = random.Random(step.pick)  # a function of the step only
        if step.kind.endswith("leader") or step.kind in ("wipe-random", "split-batch"):
            leader = self._leader()
            if step.kind == "wipe-random":
                others = [i for i in range(n) if i != leader]
                return [others[int(step.pick * len(others))]], leader is not None
            if leader is not None:
                return [leader], True
            return [int(step.pick * n)], False
        if step.kind == "partition-random":
            return sorted(pick.sample(range(n), (n - 1) // 2)), True
        if step.kind == "power-loss-all":
            return list(range(n)), True
        return [int(step.pick * n)], True

    # ---- faults ---------------------------------------------------------------------------

    def inject(self, step: Step) -> Fault | None:
        """Start the fault of `step`; None if its precondition did not hold (skipped)."""
        kind = step.kind
        quorum_needed = kind.startswith("wipe") or kind in disk.NEEDS_QUORUM
        if quorum_needed and not self._wait(
            lambda: self._voting_quorum_without(self._target(step)[0][0]), self.quorum_wait
        ):
            if not self._stop.is_set():  # the run ending is no reason to count it
                self.skipped.append(kind)
            return None
        targets, leader_known = self._target(step)
        if quorum_needed and not self._voting_quorum_without(targets[0]):
            self.skipped.append(kind)  # the leader moved while we waited
            return None
        fault = Fault(kind, targets, now(), leader_known=leader_known)
        if kind.startswith("pause"):
            for i in targets:
                self.cluster.pause(i)
                self._paused.add(i)
        elif kind.startswith("kill"):
            for i in targets:
                self.cluster.kill(i)
                self._killed.add(i)
        elif kind.startswith("wipe"):
            for i in targets:
                self.cluster.wipe(i)  # SIGKILL, then the data dir emptied
                self._killed.add(i)
                self.wiped.add(i)
        elif kind in disk.DISK:
            fault.detail.update(self._disk_fault(kind, targets[0], step))
        elif kind in POWER:
            assert self.mounts is not None
            # All killed first, then what each had not synced dropped: restarted at heal.
            fault.detail["dropped"] = power_cut(self.cluster, self.mounts, targets)
            self._killed.update(targets)
        else:
            assert self.network is not None
            rest = [i for i in range(self.cluster.replicas) if i not in targets]
            self.network.partition([targets, rest])
        self.faults.append(fault)
        return fault

    def _disk_fault(self, kind: str, target: int, step: Step) -> dict[str, Any]:
        """Start a disk fault on `target` (jepsen/disk.py); what it did."""
        data_dir = self.cluster.data_dir(target)
        if kind in disk.STOPPED:
            self.cluster.kill(target)  # SIGKILL: the damage is done to a dead replica
            self._killed.add(target)
            self.damaged.add(target)
            return disk.DAMAGE[kind](data_dir, random.Random(step.pick))
        if kind == disk.DISK_FULL:
            self._filled.add(target)
            return disk.fill(data_dir)
        disk.eio_control(data_dir).touch()
        self._failing.add(target)
        self.damaged.add(target)
        return {}

    def _split_batch(self, step: Step, fault: Fault) -> None:
        """Phase two of split-batch. The first leader, cut off, accepted its clients' last
        batches alone (its `end` grew past everyone's). As soon as the others' new leader
        wrote its first entries past its own old end (positions where the first leader's
        batches are, at a higher proposal: they cover the head of that range), cut the new
        one off alone and let the first one back: whoever leads next fills that range from
        both leaders' entries, position by position unless the fill keeps batches whole."""
        assert self.network is not None
        first = fault.targets[0]
        rest = [i for i in range(self.cluster.replicas) if i != first]
        found: list[int] = []
        statuses: list[pb.StatusResponse | None] = []

        def elected() -> bool:
            statuses[:] = self._statuses()
            found[:] = self._leaders(statuses, rest)
            return len(found) == 1

        if not self._wait(elected, 10.0):
            return  # no new leader in time: the fault stays a plain partition-leader
        second = found[0]
        status = statuses[second]
        assert status is not None  # it leads
        old_end = status.end

        ends = {i: s.end for i, s in enumerate(statuses) if s is not None}
        fault.detail["ends_at_election"] = ends
        new_end: list[int] = []

        def wrote() -> bool:
            try:
                new_end[:] = [self.cluster.status(second, timeout=0.5).end]
            except RlogError:
                return False
            return new_end[0] > old_end

        self._wait(wrote, 5.0, poll=0.005)
        # SIGSTOP first: it stops the new leader's writes at once, where setting up the
        # routes takes a few commands, during which it would write over the whole range.
        self.cluster.pause(second)
        fault.detail["new_leader_end_at_cut"] = new_end[0] if new_end else None
        fault.targets.append(second)
        self.network.heal()
        others = [i for i in range(self.cluster.replicas) if i != second]
        self.network.partition([[second], others])
        self.cluster.resume(second)
        # The hold starts once the others elected a third leader (its fill is the point).
        if self._wait(lambda: len(self._leaders(self._statuses(), others)) == 1, 10.0):
            fault.detail["third_leader"] = self._leaders(self._statuses(), others)

    def heal(self) -> None:
        """Undo every fault in force: resume, restart, remove every partition, free the
        filled disks, let the failing ones work."""
        for i in sorted(self._filled):
            disk.unfill(self.cluster.data_dir(i))
        self._filled.clear()
        for i in sorted(self._failing):
            disk.eio_control(self.cluster.data_dir(i)).unlink(missing_ok=True)
        self._failing.clear()
        for i in sorted(self._paused):
            self.cluster.resume(i)
        self._paused.clear()
        for i in sorted(self._killed):
            self.cluster.start_replica(i)
        self._killed.clear()
        for i, process in enumerate(self.cluster.processes):
            if process is not None and process.poll() is not None:
                self.exited.append((i, process.returncode))
                self.cluster.start_replica(i)
        if self.network is not None:
            self.network.heal()
        for fault in self.faults:
            if not fault.end:
                fault.end = now()

    def run(self, until: float) -> None:
        """Inject and heal faults until the monotonic time `until` (seconds) or `stop()`.
        Run it in a thread that outlives the cluster: replicas it restarts are tied to it."""
        try:
            for step in schedule(self.kinds, self.seed, self.interval, self.hold):
                if self._stop.wait(step.wait):
                    break
                if time.monotonic() + step.hold > until:
                    break
                fault = self.inject(step)
                if fault is None:
                    continue
                if step.kind == "split-batch":
                    self._split_batch(step, fault)
                self._stop.wait(step.hold)
                self.heal()
        finally:
            self.heal()

    def stop(self) -> None:
        self._stop.set()

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(f.kind for f in self.faults))

    def write(self, path: Path) -> None:
        with open(path, "w") as out:
            for fault in self.faults:
                out.write(json.dumps(fault.to_json(self.history.start)) + "\n")
            for i, status in self.exited:
                out.write(json.dumps({"kind": "exited", "replica": i, "status": status}) + "\n")
            for kind in self.skipped:
                out.write(json.dumps({"kind": kind, "skipped": "no VOTING quorum without it"}))
                out.write("\n")
