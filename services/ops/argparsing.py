"""The CLI's argument parser: a refused argument is one line, ``<prog>: <error>``, exit 2.

argparse's own parser prints its usage line before the error (two lines or more for a single
mistake); every other refusal of the CLI is one line, so this one is too (``--help`` still shows
the usage). Subcommands' parsers are made of the same class (``add_subparsers`` uses the parser's
type), so ``chronicle archive --bogus`` says ``chronicle archive: …``."""

from __future__ import annotations

import argparse
from typing import NoReturn

REFUSED_EXIT = 2
"""argparse's exit status for arguments it refuses (the CLI's SETTINGS_EXIT is the same)."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(REFUSED_EXIT, f"{self.prog}: {' '.join(message.split())}\n")
