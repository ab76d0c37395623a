"""TEST ONLY: a failing disk for a real replica process (tests/runtime/test_disk_failing_live.py).

On PYTHONPATH with RLOG_TEST_EIO=1, this makes `os.write`, `os.writev`, `os.pwrite`,
`os.fdatasync` and `os.fsync` raise OSError(EIO) on the files of the replica's data dir
(its `--data-dir`) while the file `<data dir>.eio` exists, as a disk whose writes fail
would; OSError(EROFS) instead if that file says `EROFS` (a file system the kernel remounted
read-only after an error). Reads are left alone. Without RLOG_TEST_EIO=1 it does nothing.
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

    def _failing(fd: int) -> int:
        """The errno the call on `fd` fails with (0: it does not fail)."""
        data_dir = _data_dir()
        if not data_dir:
            return 0
        try:
            with open(data_dir + ".eio") as control:
                name = control.read().strip()
        except OSError:
            return 0
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return 0
        if target != data_dir and not target.startswith(data_dir + "/"):
            return 0
        return errno.EROFS if name == "EROFS" else errno.EIO

    def _wrap(name: str):  # type: ignore[no-untyped-def]
        real = _real[name]

        def failing(fd: int, *args):  # type: ignore[no-untyped-def]
            code = _failing(fd)
            if code:
                raise OSError(code, f"{os.strerror(code)} (test: {name})")
            return real(fd, *args)

        return failing

    for _name in _real:
        setattr(os, _name, _wrap(_name))
