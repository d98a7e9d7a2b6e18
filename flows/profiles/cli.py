"""Command line of the named profiles (:mod:`flows.profiles`): ``python -m flows.profiles``.

Exit codes: 0 ok, 1 ``check`` found problems, 2 a wrong profile or override (message on stderr).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import yaml

from bert_core.constants import REPO_ROOT
from flows import profiles
from flows.overrides import ProfileError, parse_set_args, set_args
from flows.profiles import apply, check_profiles, describe_profile, list_profiles, resolve


def main(argv: list[str] | None = None, root: Path = REPO_ROOT) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.profiles", description=profiles.__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list profiles with their descriptions")
    for cmd, text in (
        ("show", "print the overrides a profile makes to the workspace params"),
        ("args", "print the -S arguments of `dvc exp run` for a profile"),
        ("apply", "write a profile's values into the params files (for `dvc repro`)"),
    ):
        p = sub.add_parser(cmd, help=text)
        p.add_argument("name", help="profile name (see `list`)")
        p.add_argument(
            "-S", "--set-param", dest="sets", action="append", default=[], metavar="FILE:KEY=VALUE"
        )
    sub.add_parser("check", help="validate every profile against the params files and stage models")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name in list_profiles(root):
                print(f"{name:12s} {describe_profile(name, root)}")
            return 0
        if args.command == "check":
            report = check_profiles(root)
            for note in report.notes:
                print(f"note: {note}")
            for problem in report.problems:
                print(f"error: {problem}", file=sys.stderr)
            print(f"{len(list_profiles(root))} profiles checked: {'ok' if report.ok else 'FAILED'}")
            return 0 if report.ok else 1
        overrides = resolve(args.name, parse_set_args(args.sets), root)
        if args.command == "args":
            print(" ".join(shlex.quote(a) for a in set_args(overrides)))
        elif args.command == "show":
            print(yaml.safe_dump(overrides, sort_keys=False).rstrip() if overrides else "# no changes")
        else:
            for path in apply(overrides, root):
                print(f"updated {path.relative_to(root)}")
        return 0
    except ProfileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
