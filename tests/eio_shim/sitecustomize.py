"""TEST ONLY: a failing disk for a real replica process (tests/runtime/test_disk_failing_live.py).

On PYTHONPATH with RLOG_TEST_EIO=1, this makes `os.write`, `os.writev`, `os.pwrite`,
`os.fdatasync` and `os.fsync` raise OSError(EIO) on the files of the replica's data dir
(its `--data-dir`) while the file `<data dir>.eio` exists, as a disk whose writes fail
would. Reads are left alone. Without RLOG_TEST_EIO=1 it does nothing.
"""

from __future__ import annotations

import errno
import os
import sys

if os.environ.get("RLOG_TEST_EIO") == "1":
    _NAMES = ("write", "writev", "pwrite", "fdatasync", "fsync")
    _real = {name: getattr(os, name) for name in _NAMES}
    _where: list[str] = []

    def _data_dir() -> str:
        if not _where:
            argv = sys.argv
            path = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv else ""
            _where.append(os.path.realpath(path) if path else "")
        return _where[0]

    def _failing(fd: int) -> bool:
        data_dir = _data_dir()
        if not data_dir or not os.path.exists(data_dir + ".eio"):
            return False
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return False
        return target == data_dir or target.startswith(data_dir + "/")

    def _wrap(name: str):  # type: ignore[no-untyped-def]
        real = _real[name]

        def failing(fd: int, *args):  # type: ignore[no-untyped-def]
            if _failing(fd):
                raise OSError(errno.EIO, f"{os.strerror(errno.EIO)} (test: {name})")
            return real(fd, *args)

        return failing

    for _name in _real:
        setattr(os, _name, _wrap(_name))
