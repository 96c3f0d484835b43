"""The ``vidgen`` command line: one module per subcommand, each with ``add_parser`` and ``run``.

A request the user can fix raises :class:`~vidgen.validation.InputError` (the one error type of
the API, the jobs file and the UI too), wherever the fact is known; ``main`` prints its one-line
message and exits with status 2 (no traceback). Arguments are parsed and checked before anything heavy (torch, diffusers) is
imported, so a mistake is reported at once; the subcommands import the stack inside ``run``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from vidgen.validation import InputError  # light: no torch

# name -> module under vidgen.cli; modules are imported only when their command runs or --help lists them
_COMMANDS = {
    "render": "render",
    "serve": "serve",
    "bench": "bench",
    "train": "train",
    "eval": "evaluate",
    "info": "info",
    "convert": "convert",
}


class _CommandParser(argparse.ArgumentParser):
    """A subcommand's parser: a mistake is one line (the usage is one ``--help`` away)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_NEGATIVE_SPECIALS = {"-inf", "-infinity", "-nan"}


def _join_negative_specials(argv: list[str]) -> list[str]:
    """``--seconds -inf``: argparse reads ``-inf`` as an option and reports a missing value; joined
    as ``--seconds=-inf`` the value reaches the checks, which say what is wrong with it."""
    joined: list[str] = []
    for arg in argv:
        previous = joined[-1] if joined else ""
        if arg.lower() in _NEGATIVE_SPECIALS and previous.startswith("--") and "=" not in previous:
            joined[-1] = f"{previous}={arg}"
        else:
            joined.append(arg)
    return joined


def build_parser() -> argparse.ArgumentParser:
    from vidgen import __version__

    parser = argparse.ArgumentParser(prog="vidgen", description="Long-form video generation.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    sub.required = True
    for name, module_name in _COMMANDS.items():
        module = importlib.import_module(f"vidgen.cli.{module_name}")
        module.add_parser(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_join_negative_specials(sys.argv[1:] if argv is None else list(argv)))
    try:
        return int(args.run(args) or 0)
    except InputError as err:
        print(f"vidgen {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vidgen {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
