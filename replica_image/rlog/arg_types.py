"""Argument types shared by the command lines (`rlog`, `rlog archive/restore`, `kubectl
rlog`): a value that is not one gets argparse's one-line usage error saying why. And the
one argument every command that opens data dirs shares, `--storage-engine`."""

from __future__ import annotations

import argparse


def add_storage_engine_argument(parser: argparse.ArgumentParser, dirs: str) -> None:
    """`--storage-engine`, `auto` by default; `dirs` names what it opens ("the data dir")."""
    # imported here: `kubectl rlog` takes the other types and must not load the storage
    # engines (nor protobuf) to start
    from rlog.storage import AUTO, ENGINE_CHOICES

    parser.add_argument(
        "--storage-engine",
        choices=ENGINE_CHOICES,
        default=AUTO,
        help=f"auto (default): the engine whose store {dirs} holds, segment if none",
    )


def nonnegative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not positive")
    return value
