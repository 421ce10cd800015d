"""The README's first command installs everything its "Using it" section runs.

A new user ran the Quick start and then the SDK snippet and ``clients/examples/openai_*.py`` as written:
``ModuleNotFoundError: No module named 'openai'``. This reads the README and pyproject.toml as
they are and checks that every third-party module imported by the Python examples of "Using it"
(and by the scripts it runs with ``python clients/...``) comes with the Quick start's install.
The docs/*.md pages' examples (and the README's own, beyond this) are checked by
``test_docs_examples.py``; both read the pages through ``tests/helpers/pages.py``.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import packages_distributions

from packaging.utils import canonicalize_name

from tests.helpers.pages import ROOT, code_blocks, imported_modules, installed_distributions, quick_start_command, section


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
