"""The CLI's argument parser: a refused argument is one line, ``<prog>: <error>``, exit 2.

argparse's own parser prints its usage line before the error (two lines or more for a single
mistake); every other refusal of the CLI is one line, so this one is too (``--help`` still shows
the usage). Subcommands' parsers are made of the same class (``add_subparsers`` uses the parser's
type), so ``chronicle archive --to-seq x`` says ``chronicle archive: …``, and so does an unknown
option of a subcommand, ``chronicle verify --bogus`` (argparse leaves those to the top-level
parser, which named itself alone: ``chronicle: unrecognized arguments: --bogus``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

REFUSED_EXIT = 2
"""argparse's exit status for arguments it refuses (the CLI's SETTINGS_EXIT is the same)."""

_REFUSER = "_one_line_parser_refusing"
"""The namespace attribute naming the innermost parser that left arguments unrecognized."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(REFUSED_EXIT, f"{self.prog}: {' '.join(message.split())}\n")

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's; the innermost parser whose arguments were left over is noted in the
        namespace (a subcommand's parser runs, and returns, inside its parent's)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and not hasattr(parsed, _REFUSER):
            setattr(parsed, _REFUSER, self)
        return parsed, extras

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        """Arguments no parser took are refused by the subcommand they were given to (the top
        level's, when they came before any subcommand)."""
        parsed, extras = self.parse_known_args(args, namespace)
        refuser: Any = vars(parsed).pop(_REFUSER, self)
        if extras:
            refuser.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed
