"""The README and the docs/*.md pages stay correct as the code changes.

The README is short and links to one page per topic (issue 19). This reads every page as it is
and checks what a reader would run or follow from it, without a server:

- every ```python block parses, reads no name it does not define (it runs on its own), and imports
  only third-party modules that the Quick start's install brings;
- every ``python clients/...`` script, ``locust -f clients/...`` file and ``python -m`` module a
  page names exists; the flags given to a client script are flags it defines, and those given to
  ``specdec serve``/``serve-ray`` in a bash block are in its ``--help``;
- the scripts a bash block runs import only what the Quick start plus the page's own earlier
  ``pip install -e ".[extra]"`` commands install (extras that exist in pyproject.toml);
- every ``python -c '...'`` one-liner parses, every ```json block is JSON (or one member of an
  object);
- every relative link and #anchor points to an existing file and heading, every docs page is
  linked from the README, and every repository path a page names in backticks exists.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import subprocess
import sys
from collections import Counter
from functools import cache
from importlib.metadata import packages_distributions
from importlib.util import find_spec
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.helpers.pages import (
    PROJECT,
    ROOT,
    code_blocks,
    imported_modules,
    installed_distributions,
    quick_start_command,
)

DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
PAGE_IDS = [str(p.relative_to(ROOT)) for p in PAGES]
LOCAL_PACKAGES = {"server", "specdec_core"}
# A repository path in backticks: a file or folder under one of the project's top-level folders.
REPO_PATH = re.compile(r"`((?:server|specdec_core|clients|tests|deploy|docs|\.ci)/[\w./-]*)`")


def text(page: Path) -> str:
    return page.read_text()


def prose(page_text: str) -> str:
    """The page without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", page_text, flags=re.DOTALL | re.MULTILINE)


def bash_commands(page_text: str) -> list[str]:
    """The logical lines of every ```bash block (continuations joined), in page order."""
    lines: list[str] = []
    for block in code_blocks(page_text, "bash"):
        lines += [line for line in block.replace("\\\n", " ").split("\n") if line.strip()]
    return lines


def without_comment(command: str) -> str:
    return re.split(r"\s#\s", " " + command, maxsplit=1)[0]


def inline_commands(page_text: str, program: str) -> list[str]:
    """``program ...`` commands written in inline code spans of the prose (line breaks allowed)."""
    return [m.replace("\n", " ") for m in re.findall(rf"`({re.escape(program)} [^`]+)`", prose(page_text))]


def script_runs(command: str) -> list[tuple[Path, str]]:
    """(script, its arguments) for each ``python clients/X.py`` or ``locust -f clients/X.py`` in a
    command; a script loaded by another program (locust) gets that program's arguments, so none."""
    runs = []
    for part in re.split(r"&&|\|\||;|\|", without_comment(command)):
        match = re.search(r"(python3?|-f)\s+(clients/[\w/.-]+\.py)(.*)", part)
        if match:
            runs.append((ROOT / match.group(2), match.group(3) if match.group(1) != "-f" else ""))
    return runs


def flags(arguments: str) -> list[str]:
    """The flags given (``--x=--y`` gives ``--y`` as the value of ``--x``: not a flag)."""
    return re.findall(r"(?<![\w$=-])(--[a-z][a-z0-9-]*)", arguments)


def module_file(name: str, search: list[Path]) -> Path | None:
    """The file of a project-local module ``a.b`` found under one of the ``search`` folders."""
    for base in search:
        candidate = base.joinpath(*name.split("."))
        for path in (candidate.with_suffix(".py"), candidate / "__init__.py"):
            if path.exists():
                return path
    return None


@cache
def script_closure(script: Path) -> tuple[set[str], list[Path]]:
    """Third-party top-level modules a script imports, and the project files it reads, following its
    imports of the clients' own modules (run as ``python clients/.../X.py``, its folder is on sys.path)."""
    search = [script.parent, ROOT]
    todo, files, third_party = [script], [], set()
    while todo:
        path = todo.pop()
        if path in files:
            continue
        files.append(path)
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level:
                package = path.parent
                for _ in range(node.level - 1):
                    package = package.parent
                base = package.joinpath(*(node.module or "").split(".")) if node.module else package
                targets = [base.with_suffix(".py"), base / "__init__.py", *(base / f"{a.name}.py" for a in node.names)]
                for target in targets:
                    if target.exists():
                        todo.append(target)
                continue
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for name in names:
                top = name.split(".")[0]
                local = module_file(name, search)
                if local is not None:
                    if top not in LOCAL_PACKAGES:  # the project's packages are installed by -e .
                        todo.append(local)
                elif (module_file(top, search) is None and not any((base / top).is_dir() for base in search)
                      and top not in sys.stdlib_module_names and top != "__future__"):  # a folder: a namespace package
                    third_party.add(top)
    return third_party, files


@cache
def _module_distributions() -> dict[str, list[str]]:
    """Every installed distribution's top-level modules: read once (it walks every package's
    metadata, ~1 s here), not once per module of every script of every page."""
    return packages_distributions()


def providers(module: str) -> set[str]:
    """Distributions that provide a top-level module: from this environment, else the module's own
    name (the bench extra is not installed by the test command)."""
    found = {canonicalize_name(d) for d in _module_distributions().get(module, [])}
    return found or {canonicalize_name(module)}


def pip_extras(command: str) -> list[str]:
    match = re.search(r'pip install[^&]*?-e\s+"?\.\[([^\]]*)\]', command)
    return [e.strip() for e in match.group(1).split(",")] if match else []


def heading_anchors(page_text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown page."""
    seen: Counter[str] = Counter()
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", prose(page_text), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug if not seen[slug] else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    return anchors


def names_read_but_not_defined(source: str) -> set[str]:
    """Names a snippet loads that nothing in it binds (scopes ignored: a snippet is flat)."""
    tree = ast.parse(source)
    bound, loaded = set(dir(builtins)), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
    return loaded - bound


def test_readme_is_short_and_keeps_no_dated_record() -> None:
    """The README is the front page: at most 200 lines, and no measurement record of a day (those
    are the *-measurements pages'; a dated speed section crept back in twice). Dates inside link
    targets (a record's anchor) are fine."""
    readme = text(ROOT / "README.md")
    assert len(readme.splitlines()) <= 200
    prose = re.sub(r"\]\([^)]*\)", "]", readme)
    assert re.findall(r"\b20\d\d-[01]\d-[0-3]\d\b", prose) == []


def test_readme_links_every_docs_page() -> None:
    readme = text(ROOT / "README.md")
    assert DOCS, "docs/*.md is missing"
    for page in DOCS:
        assert f"(docs/{page.name})" in readme or f"(docs/{page.name}#" in readme, f"README does not link {page.name}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_links_and_anchors_resolve(page: Path) -> None:
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(text(page))):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        assert linked.exists(), f"{page.name}: link to missing {target}"
        if anchor:
            assert anchor in heading_anchors(linked.read_text()), (
                f"{page.name}: no heading for #{anchor} in {linked.name}"
            )


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_python_blocks_parse_run_on_their_own_and_need_only_the_quick_start(page: Path) -> None:
    installed = installed_distributions(quick_start_command())
    for block in code_blocks(text(page), "python"):
        undefined = names_read_but_not_defined(block)  # parses, or raises SyntaxError here
        assert not undefined, f"{page.name}: a python block reads {sorted(undefined)} without defining them:\n{block}"
        for module in imported_modules(block) - LOCAL_PACKAGES - set(sys.stdlib_module_names) - {"__future__"}:
            assert providers(module) & installed, (
                f"{page.name}: {module!r}, imported by a python block, is not installed by the Quick start"
            )


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_named_scripts_and_modules_exist_and_take_the_flags_given(page: Path) -> None:
    page_text = text(page)
    commands = bash_commands(page_text) + inline_commands(page_text, "python")
    for command in commands:
        for script, arguments in script_runs(command):
            assert script.exists(), f"{page.name}: {script.relative_to(ROOT)} does not exist"
            sources = "\n".join(p.read_text() for p in script_closure(script)[1])
            for flag in flags(arguments):
                assert f'"{flag}"' in sources or f"'{flag}'" in sources, (
                    f"{page.name}: {script.relative_to(ROOT)} defines no {flag}"
                )
        for module in re.findall(r"python3? -m ([\w.]+)", without_comment(command)):
            local = module_file(module, [ROOT])
            if local is not None:
                assert local.name != "__init__.py" or (local.parent / "__main__.py").exists(), (
                    f"{page.name}: python -m {module}: the package has no __main__.py"
                )
            else:
                assert find_spec(module.split(".")[0]) is not None, f"{page.name}: python -m {module}: no such module"
    for path in re.findall(r"(?<![\w/.-])(clients/[\w/.-]+\.(?:py|sh|json))", page_text):
        assert (ROOT / path).exists(), f"{page.name}: {path} does not exist"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_specdec_flags_in_bash_blocks_exist(page: Path) -> None:
    helps: dict[str, str] = {}
    for command in bash_commands(text(page)):
        for sub, arguments in re.findall(r"specdec (serve-ray|serve)\b(.*)", without_comment(command)):
            if sub not in helps:
                helps[sub] = subprocess.run(
                    [sys.executable, "-m", "server", sub, "--help"],
                    cwd=ROOT, capture_output=True, text=True, check=True,
                ).stdout
            arguments = re.sub(r"\$\([^)]*\)", "", arguments)  # a $(python -c ...) value is no flag
            for flag in flags(arguments.split("&&")[0]):
                assert re.search(rf"{flag}(?![\w-])", helps[sub]), f"{page.name}: specdec {sub} has no {flag}"


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_scripts_in_bash_blocks_are_installed_by_the_page(page: Path) -> None:
    """A script run in a bash block imports only what the Quick start and the page's own earlier
    ``pip install -e ".[extra]"`` commands install."""
    extras_defined = set(PROJECT["optional-dependencies"])
    quick_start = quick_start_command()
    extras: list[str] = []
    for command in bash_commands(text(page)):
        named = pip_extras(command)
        assert set(named) <= extras_defined, f"{page.name}: no such extra in pyproject.toml: {named}"
        extras += named
        page_install = f'-e ".[{",".join(extras)}]"' if extras else "-e ."
        installed = installed_distributions(quick_start) | installed_distributions(page_install)
        for script, _ in script_runs(command):
            for module in sorted(script_closure(script)[0]):
                assert providers(module) & installed, (
                    f"{page.name}: {script.relative_to(ROOT)} imports {module!r}, which neither the Quick start "
                    f"nor the page's install commands before it ({extras or 'none'}) install"
                )
        for snippet in re.findall(r"python3? -c '([^']*)'", command):
            ast.parse(snippet)


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_json_blocks_parse(page: Path) -> None:
    for block in code_blocks(text(page), "json"):
        try:
            json.loads(block)
        except json.JSONDecodeError:
            json.loads("{" + block + "}")  # one member of an object, e.g. the "speculative" report


@pytest.mark.parametrize("page", PAGES, ids=PAGE_IDS)
def test_repository_paths_named_exist(page: Path) -> None:
    for path in REPO_PATH.findall(prose(text(page))):
        assert (ROOT / path).exists(), f"{page.name} names {path}, which does not exist"
