"""Packages ``chronicle_sdk`` and ``events`` into chronicle-sdk from the repository's root.

This directory holds only the distribution's metadata; the packages live beside it, at the
repository's root, where the server and the tests import them. Built from the repository, the hook
adds ``../chronicle_sdk`` and ``../events``; an sdist holds copies of them, which the wheel built
from it selects itself (``only-include``). Only Python files and ``py.typed`` are shipped;
``chronicle_sdk/_docgen.py`` (it writes the repository's ``docs/sdk.md``) is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.config import BuilderConfig
from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGES = ("chronicle_sdk", "events")
NOT_SHIPPED = frozenset({"chronicle_sdk/_docgen.py"})


def package_files(source: Path, name: str) -> dict[str, str]:
    """The package's shipped files: path on disk -> path in the distribution."""
    if not (source / "__init__.py").is_file():
        raise FileNotFoundError(f"chronicle-sdk: {source} is not the {name} package")
    files: dict[str, str] = {}
    for path in sorted(source.rglob("*")):
        target = f"{name}/{path.relative_to(source).as_posix()}"
        shipped = path.suffix == ".py" or path.name == "py.typed"
        if path.is_file() and shipped and "__pycache__" not in path.parts and target not in NOT_SHIPPED:
            files[str(path)] = target
    return files


class SiblingPackages(BuildHookInterface[BuilderConfig]):
    """hatchling's custom build hook (``[tool.hatch.build.hooks.custom]``)."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if version == "editable":
            return  # dev-mode-dirs puts the repository's root on sys.path instead
        root = Path(self.root)
        for name in PACKAGES:
            if not (root / name).is_dir():  # not an sdist's copy: the package beside this directory
                build_data["force_include"].update(package_files(root.parent / name, name))
