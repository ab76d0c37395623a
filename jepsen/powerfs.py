"""Power cuts for real replica processes: powerfs (tests/powerfs/, a FUSE file system that
keeps what was not synced apart and drops it on command) mounted as their data dirs.

A power cut of replicas is: SIGKILL them all (a power cut stops the processes at once, so
none may write after it), then drop every mount's unsynced state, then start them again on
the same mounts (`power_cut`, then `DevCluster.start_replica`). What survives is what the
replicas fsynced: file data up to each file's last fsync/fdatasync, directory entries up to
each directory's last fsync (docs/faults.md, "Power loss").

`PowerFS(mountpoint, backing).start()` mounts one (the binary is built and cached by
tests/powerfs/build.sh); `drop()` cuts its power; `stop()` unmounts it. `mount_data_dirs`
mounts one under each replica's data dir of a DevCluster, before it starts.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from rlog.tools.dev import DevCluster

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "tests" / "powerfs" / "build.sh"


class PowerFSError(RuntimeError):
    pass


def unavailable() -> str | None:
    """Why powerfs cannot run here (None: it can)."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse (the kernel has no FUSE)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root, and no fusermount3 (Debian's fuse3)"
    if shutil.which("go") is None and not Path("/usr/local/go/bin/go").exists():
        return "no Go toolchain to build powerfs"
    return None


def build() -> Path:
    """The powerfs binary, built by build.sh into its cache if it is not there yet."""
    out = subprocess.run(
        [str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    return Path(out.splitlines()[-1])


def mounted(path: Path) -> bool:
    """Whether `path` is a mount point (per /proc/self/mountinfo)."""
    target = str(Path(path).resolve())
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            # Field 5 is the mount point (spaces and the like escaped as octal).
            point = line.split()[4].encode().decode("unicode_escape")
            if point == target:
                return True
    return False


class PowerFS:
    """One powerfs mount of `backing` at `mountpoint` (both created if missing)."""

    def __init__(self, mountpoint: Path, backing: Path, log: Path | None = None) -> None:
        self.mountpoint = Path(mountpoint)
        self.backing = Path(backing)
        self.log = log if log is not None else self.backing.parent / "powerfs.log"
        # A unix socket's path must be short (108 bytes): not under a test's tmp_path.
        self._sockdir = Path(tempfile.mkdtemp(prefix="rlog-powerfs-"))
        self.control = self._sockdir / "control"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> PowerFS:
        binary = build()
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.backing.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    str(binary),
                    "-control",
                    str(self.control),
                    str(self.backing),
                    str(self.mountpoint),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise PowerFSError(
                    f"powerfs exited ({self.process.returncode}) before mounting "
                    f"{self.mountpoint}: {self.log_tail()}"
                )
            with contextlib.suppress(OSError, PowerFSError):
                self.command("ping")
                return self
            if time.monotonic() > deadline:
                self.stop()
                raise PowerFSError(f"powerfs did not mount {self.mountpoint} in {timeout:g} s")
            time.sleep(0.02)

    def log_tail(self, lines: int = 10) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def command(self, text: str) -> str:
        """Send one control command; its answer after "ok" (PowerFSError if not ok)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(60)
            conn.connect(str(self.control))
            conn.sendall(text.encode() + b"\n")
            answer = conn.makefile("r").readline().strip()
        if answer != "ok" and not answer.startswith("ok "):
            raise PowerFSError(f"powerfs {text}: {answer or 'no answer'}")
        return answer[3:]

    def drop(self) -> str:
        """Cut the power: everything not synced is lost. The processes that use the mount
        must be dead. Returns what was undone ("files=F dirs=D entries=E")."""
        return self.command("drop")

    def pending(self) -> dict[str, int]:
        """How many files and directories have changes a drop would undo."""
        return {
            key: int(value)
            for key, _, value in (part.partition("=") for part in self.command("pending").split())
        }

    def stop(self) -> None:
        """Unmount (the processes using it must be gone) and wait for powerfs to exit."""
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if mounted(self.mountpoint):  # powerfs died without unmounting
            subprocess.run(["umount", "-l", str(self.mountpoint)], check=False)
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self) -> PowerFS:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def mount_data_dirs(cluster: DevCluster) -> list[PowerFS]:
    """A powerfs mount as each replica's data dir, its backing beside it
    (`<replica dir>/backing`). Call before the cluster starts (or prepares: initializing
    the data dirs is written through the mounts too)."""
    mounts: list[PowerFS] = []
    try:
        for i in range(cluster.replicas):
            replica_dir = cluster.replica_dir(i)
            mount = PowerFS(
                cluster.data_dir(i), replica_dir / "backing", replica_dir / "powerfs.log"
            )
            mounts.append(mount.start())
    except BaseException:
        unmount_all(mounts)
        raise
    return mounts


def unmount_all(mounts: Sequence[PowerFS]) -> None:
    for mount in mounts:
        mount.stop()


def power_cut(cluster: DevCluster, mounts: Sequence[PowerFS], replicas: Sequence[int]) -> list[str]:
    """Cut the power of these replicas at once: SIGKILL each, wait until each is dead, then
    drop what each one's mount had not synced. They stay down (`start_replica` brings
    each back on its mount). Returns each drop's report."""
    for i in replicas:
        cluster.kill(i, wait=False)
    for i in replicas:
        process = cluster.processes[i]
        if process is not None:
            process.wait(timeout=30)
    return [mounts[i].drop() for i in replicas]
