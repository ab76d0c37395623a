"""`rlog state ...`: the replicated state (rlog.state) from the command line.

    rlog state get NAME              <version>\t<value>   (version 0: no such variable)
    rlog state set NAME VALUE [--if-version V]   prints the new version
    rlog state list                  <name>\t<version>, one per variable
    rlog state watch NAME            <version>\t<value> now, then for each new version
    rlog state compact               writes a snapshot, truncates below the previous one

`--json` prints one object per line: {"name", "version", "value": "<base64>"}.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from collections.abc import Callable
from typing import Any

from rlog.client.errors import RlogError


class StateCommandError(RlogError):
    """A state command whose condition did not hold (exit 1)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action", choices=["get", "set", "list", "watch", "compact"], metavar="ACTION"
    )
    parser.add_argument("name", nargs="?", metavar="NAME")
    parser.add_argument("value", nargs="?", metavar="VALUE")
    parser.add_argument(
        "--if-version",
        type=int,
        metavar="V",
        help="set: store only if the variable is still at version V (0: does not exist)",
    )
    parser.add_argument("--base64", action="store_true", help="set: VALUE is base64")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument(
        "--strict",
        action="store_true",
        help="refuse to start on a log that was truncated but holds no state",
    )


def _as_json(variable: Any) -> str:
    return json.dumps(
        {
            "name": variable.name,
            "version": variable.version,
            "value": base64.b64encode(variable.value).decode("ascii"),
        }
    )


def _print_variable(variable: Any, as_json: bool) -> None:
    if as_json:
        print(_as_json(variable))
    else:
        print(f"{variable.version}\t{variable.text}")
    sys.stdout.flush()


def run(args: argparse.Namespace, endpoint: str, usage_error: Callable[[str], Exception]) -> int:
    from rlog.state import State, Variable
    from rlog.tools.client_args import credentials_of

    needs_name = args.action in ("get", "set", "watch")
    if needs_name and not args.name:
        raise usage_error(f"state {args.action} needs a NAME")
    if args.action == "set" and args.value is None:
        raise usage_error("state set needs NAME and VALUE")
    if args.action != "set" and (args.value is not None or args.if_version is not None):
        raise usage_error(f"state {args.action} takes no VALUE or --if-version")
    if args.action in ("list", "compact") and args.name:
        raise usage_error(f"state {args.action} takes no NAME")
    with State(
        endpoint,
        timeout=args.timeout,
        append_timeout=max(args.timeout, 1.0),
        strict=args.strict,
        credentials=credentials_of(args),
    ) as state:
        if args.action == "get":
            _print_variable(state.fetch(args.name), args.json)
        elif args.action == "set":
            if args.base64:
                try:
                    value = base64.b64decode(args.value, validate=True)
                except ValueError:
                    raise usage_error("VALUE is not valid base64") from None
            else:
                value = args.value.encode("utf-8", "surrogateescape")
            stored = _set(state, Variable, args.name, value, args.if_version)
            if args.json:
                print(_as_json(stored))
            else:
                print(stored.version)
        elif args.action == "list":
            for name, variable in state.variables().items():
                if args.json:
                    print(_as_json(variable))
                else:
                    print(f"{name}\t{variable.version}")
        elif args.action == "watch":
            for variable in state.watch(args.name):
                _print_variable(variable, args.json)
        else:
            as_of = state.compact()
            if args.json:
                print(json.dumps({"snapshot": as_of}))
            else:
                print(f"snapshot as of position {as_of}")
    return 0


def _set(state: Any, variable_type: Any, name: str, value: bytes, if_version: int | None) -> Any:
    if if_version is not None:
        stored = state.store(variable_type(name, value, if_version))
        if stored is None:
            now = state.fetch(name).version
            raise StateCommandError(
                f"{name} is not at version {if_version} (it is at {now}): nothing stored"
            )
        return stored
    # Without a condition: last writer wins, an update decided inside the batch.
    return state.update(name, lambda _current: value)
