"""The README's first command installs everything its "Using it" section runs.

A new user ran the Quick start and then the SDK snippet and ``clients/examples/openai_*.py`` as written:
``ModuleNotFoundError: No module named 'openai'``. This reads the README and pyproject.toml as
they are and checks that every third-party module imported by the Python examples of "Using it"
(and by the scripts it runs with ``python clients/...``) comes with the Quick start's install.
The docs/*.md pages' examples (and the README's own, beyond this) are checked by
``test_docs_examples.py``, which reuses the helpers here.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
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


def using_it_modules() -> set[str]:
    """Top-level modules the Python examples and ``python clients/examples/X.py`` scripts of "Using it"
    import (a script's sibling modules followed: it runs with its own folder on ``sys.path``)."""
    text = section("Using it")
    sources = code_blocks(text, "python")
    scripts = {ROOT / path for path in re.findall(r"python (clients/[\w/]+\.py)", text)}
    assert sources and scripts, "the README's Using it section changed shape; update this test"
    folders = {script.parent for script in scripts}
    siblings = {p.stem: p for folder in folders for p in folder.glob("*.py")}
    local = set(siblings) | {"server", "specdec_core", "clients"}
    todo = [p.read_text() for p in scripts] + sources
    modules: set[str] = set()
    while todo:
        found = imported_modules(todo.pop()) - modules
        modules |= found
        todo += [siblings[m].read_text() for m in found & set(siblings)]
    return {m for m in modules if m not in sys.stdlib_module_names and m not in local and m != "__future__"}


def test_quick_start_is_one_line_that_installs_what_using_it_runs() -> None:
    command = quick_start_command()
    assert "\n" not in command
    installed = installed_distributions(command)
    dists = packages_distributions()
    needed = using_it_modules()
    assert "openai" in needed
    for module in sorted(needed):
        providers = {canonicalize_name(d) for d in dists.get(module, [])}
        assert providers, f"{module!r} (imported by Using it) is not installed in this environment"
        assert providers & installed, (
            f"{module!r}, imported by the README's Using it, is not installed by the Quick start "
            f"({command.split('&&')[0].strip()}); add it to an extra that command installs"
        )
