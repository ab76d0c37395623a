"""`kubectl_complete-rlog`: shell completion for `kubectl rlog`, by kubectl's plugin
completion protocol (kubectl 1.26+): for `kubectl rlog status my<TAB>` kubectl runs
`kubectl_complete-rlog status my` from the PATH, prints the lines it writes as the choices,
and reads a last line `:<n>` as cobra's directive (4: no file names).

What completes: the commands, each command's flags, `--role`'s choices, and a log's name
from the ReplicatedLogs of the namespace (`-n`, else the context's), asked of the API with a
short timeout; no cluster, no names, never an error on the terminal. The choices come from
the plugin's own parser (`cli.build_parser`), so a new command or flag completes
without a second list to keep. Rejected: a bash script generated from the parser (kubectl
calls this executable for every shell it completes for, bash, zsh, fish and PowerShell).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from rlog_operator.plugin.cli import build_parser
from rlog_operator.plugin.cluster import Cluster
from rlog_operator.plugin.patches import PluginError

NO_FILE_COMPLETION = 4  # cobra.ShellCompDirectiveNoFileComp
LIST_TIMEOUT = 2.0  # seconds for the API to list the logs, at most, while the user waits
# The positionals that name an existing ReplicatedLog (NEW in `restore` is a new name).
LOG_NAME_DESTS = frozenset({"name"})

LogNames = Callable[[str | None], list[str]]  # namespace (None: the context's) -> names


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not a.option_strings]


def choices(words: Sequence[str], log_names: LogNames) -> list[str]:
    """The completions of the last word of `words` (the arguments after `kubectl rlog`;
    the last may be "", a word not begun)."""
    *done, partial = words or [""]
    parser = build_parser()
    command: argparse.ArgumentParser | None = None
    flags = _flags(parser)
    positionals_given = 0
    namespace: str | None = None
    expecting: argparse.Action | None = None
    for word in done:
        if expecting is not None:
            if expecting.dest == "namespace":
                namespace = word
            expecting = None
        elif word.startswith("-"):
            flag, given, value = word.partition("=")
            action = flags.get(flag)
            if action is None or action.nargs == 0:
                continue
            if not given:
                expecting = action
            elif action.dest == "namespace":
                namespace = value
        elif command is None:
            command = _subcommands(parser).get(word)
            if command is None:
                return []  # not a command of ours: nothing sensible to offer
            flags = _flags(command)  # its own and the cluster options (not --version)
        else:
            positionals_given += 1
    if expecting is not None:  # a flag's value: only fixed choices are offered
        return [str(c) for c in expecting.choices or () if str(c).startswith(partial)]
    if partial.startswith("-"):
        return sorted(f for f in flags if f.startswith(partial) and f.startswith("--"))
    if command is None:
        return sorted(n for n in _subcommands(parser) if n.startswith(partial))
    positionals = _positionals(command)
    if positionals_given < len(positionals):
        if positionals[positionals_given].dest in LOG_NAME_DESTS:
            return [n for n in log_names(namespace) if n.startswith(partial)]
    return []


def _names_from_the_cluster(kubeconfig: str | None, context: str | None) -> LogNames:
    def names(namespace: str | None) -> list[str]:
        try:
            cluster = Cluster(kubeconfig, context)
            return cluster.log_names(namespace or cluster.default_namespace, LIST_TIMEOUT)
        except PluginError:
            return []

    return names


def _option(words: Sequence[str], flag: str) -> str | None:
    """The value given to `flag` among the finished words (`--flag V` or `--flag=V`)."""
    done = words[:-1]
    for at, word in enumerate(done):
        if word == flag and at + 1 < len(done):
            return done[at + 1]
        if word.startswith(flag + "="):
            return word.split("=", 1)[1]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    names = _names_from_the_cluster(_option(words, "--kubeconfig"), _option(words, "--context"))
    for choice in choices(words, names):
        print(choice)
    print(f":{NO_FILE_COMPLETION}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
