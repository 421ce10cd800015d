"""The README and pyproject.toml as a reader meets them, for the docs tests: a README section, a
page's fenced code blocks, the Quick start command and the distributions it installs, and the
top-level modules a piece of Python imports."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def section(title: str) -> str:
    """The README text under ``## title`` up to the next ``## `` heading."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def quick_start_command() -> str:
    return code_blocks(section("Quick start"), "bash")[0].strip()


def installed_distributions(command: str) -> set[str]:
    """Distributions ``pip install -e ".[extras]"`` brings for this project (extras resolved,
    including the project's references to its own extras)."""
    match = re.search(r'-e\s+"?\.(?:\[([^\]]*)\])?"?(?:\s|$)', command)
    assert match, f"the Quick start does not install this project: {command}"
    wanted = [e.strip() for e in (match.group(1) or "").split(",") if e.strip()]
    names: set[str] = set()
    todo = list(PROJECT["dependencies"])
    seen_extras: set[str] = set()
    while wanted or todo:
        for extra in wanted:
            if extra not in seen_extras:
                seen_extras.add(extra)
                todo += PROJECT["optional-dependencies"][extra]
        wanted = []
        for line in todo:
            req = Requirement(line)
            if canonicalize_name(req.name) == canonicalize_name(PROJECT["name"]):
                wanted += sorted(req.extras)
            else:
                names.add(canonicalize_name(req.name))
        todo = []
    return names


def imported_modules(source: str) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules
