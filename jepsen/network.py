"""Network partitions between replica processes, with network namespaces we create.

Why namespaces: on one loopback every replica and every client share 127.0.0.1 as the
source of their connections (the kernel picks the loopback route's source, 127.0.0.1, even
towards 127.0.0.2), so address rules cannot tell replica 0's traffic from a client's; and
this machine has no iptables for uid-owner rules. So each replica runs in a namespace of
its own, `<tag>-r<i>`, with one address, 10.213.<net>.<i+1>; the clients run in `<tag>-cl`
(10.213.<net>.100); every namespace has a veth into a bridge in `<tag>-sw`. Nothing is added
to the host's own network: every address, link and route lives in these namespaces, and
deleting them removes everything.

A partition is a pair of blackhole routes: in replica i's namespace to j's address and in
j's to i's. Packets between them are dropped at the sender (new connections fail, open ones
stall), while clients still reach every replica. Healing flushes every blackhole route of
every replica namespace (we add no other kind).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

PORT = 7000


def _ip(*args: str, check: bool = True) -> None:
    subprocess.run(["ip", *args], check=check, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Netns:
    def __init__(self, replicas: int, tag: str | None = None, net: int | None = None) -> None:
        self.replicas = replicas
        self.tag = tag or f"rlj{os.getpid() % 100000}"
        self.net = os.getpid() % 250 if net is None else net
        self.blocked: set[tuple[int, int]] = set()

    # ---- names and addresses ------------------------------------------------------------

    def ns(self, who: int | str) -> str:
        return f"{self.tag}-{'r' + str(who) if isinstance(who, int) else who}"

    def address(self, who: int | str) -> str:
        last = who + 1 if isinstance(who, int) else 100
        return f"10.213.{self.net}.{last}"

    @property
    def client_ns(self) -> str:
        return self.ns("cl")

    def endpoints(self) -> list[str]:
        return [f"{self.address(i)}:{PORT}" for i in range(self.replicas)]

    # ---- setup and teardown --------------------------------------------------------------

    def create(self) -> Netns:
        switch = self.ns("sw")
        _ip("netns", "add", switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for who in [*range(self.replicas), "cl"]:
            ns = self.ns(who)
            name = f"v{who}"  # names are per namespace
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip(
                "-n",
                ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                name,
                "netns",
                switch,
            )
            _ip("-n", ns, "addr", "add", f"{self.address(who)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", switch, "link", "set", name, "master", "br0")
            _ip("-n", switch, "link", "set", name, "up")
        return self

    def destroy(self) -> None:
        for who in [*range(self.replicas), "cl", "sw"]:
            _ip("netns", "del", self.ns(who), check=False)

    def python_wrapper(self, directory: Path, python: str) -> Path:
        """An executable that DevCluster runs instead of python: it runs `python ARGS` in the
        namespace of the replica whose `--id` ARGS give (exec all the way: same pid)."""
        wrapper = directory / "python-in-netns"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# run the replica with this --id in its own network namespace\n"
            'id=""; prev=""\n'
            'for a in "$@"; do [ "$prev" = "--id" ] && id=$a; prev=$a; done\n'
            f'exec ip netns exec "{self.tag}-r$id" "{python}" "$@"\n'
        )
        wrapper.chmod(0o755)
        return wrapper

    # ---- faults -------------------------------------------------------------------------

    def _block(self, i: int, j: int) -> None:
        if (i, j) not in self.blocked:
            _ip("-n", self.ns(i), "route", "add", "blackhole", f"{self.address(j)}/32")
            self.blocked.add((i, j))

    def partition(self, groups: Sequence[Iterable[int]]) -> None:
        """Cut every replica off from the replicas of the other groups (both ways)."""
        sets = [set(g) for g in groups]
        for a, group in enumerate(sets):
            for other in sets[a + 1 :]:
                for i in group:
                    for j in other:
                        self._block(i, j)
                        self._block(j, i)

    def heal(self) -> None:
        for i in range(self.replicas):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip("-n", self.ns(i), "route", "flush", "type", "blackhole")
        self.blocked.clear()


def available() -> bool:
    """Root with `ip` and network namespaces (a throwaway one is created and deleted)."""
    if os.geteuid() != 0:
        return False
    probe = f"rljprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (OSError, subprocess.CalledProcessError):
        return False
    _ip("netns", "del", probe, check=False)
    return True
