"""Every script under ``clients/examples/`` and ``clients/tools/`` still starts, and still finds what
it imports from the project.

The measurement tools run rarely (a GPU session, a kernel change, a re-measured README figure), so
between runs nothing exercised them: a renamed module or a path that moved surfaced only when
someone needed the tool again (``cuda_check.py`` could not even print its usage from a checkout).
This runs each script as a user would, ``python clients/<folder>/<script>.py --help`` from another
directory, and resolves every ``from specdec_core/server/clients ... import name`` in it, the
ones inside functions included (most tools import the engine lazily, so ``--help`` alone would not
reach them). A new script in either folder is covered without editing this file. The tools that
do real work on a tiny model have tests of their own (``tests/execution/test_cuda_check.py``,
``tests/speculation/test_speculation_ceiling.py``, ``tests/engine/test_step_budget.py``,
``tests/clients/test_bench_*.py``).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p for folder in ("examples", "tools") for p in (ROOT / "clients" / folder).glob("*.py"))
IDS = [str(p.relative_to(ROOT / "clients")) for p in SCRIPTS]
# Run as scripts: those with a ``__main__`` block (sdk_report is the examples' shared module,
# soak_report the soak's, and locust loads the locustfile itself).
RUNNABLE = [p for p in SCRIPTS if 'if __name__ == "__main__":' in p.read_text()]
PROJECT = ("specdec_core", "server", "clients")


@pytest.fixture(scope="module")
def help_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, subprocess.CompletedProcess[str]]:
    """``--help`` of every runnable script, started together (most of each run is importing torch,
    so in parallel the lot costs about what the slowest does)."""
    cwd = tmp_path_factory.mktemp("elsewhere")
    running = {p: subprocess.Popen([sys.executable, str(p), "--help"], cwd=cwd, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE) for p in RUNNABLE}
    done = {}
    for path, proc in running.items():
        out, err = proc.communicate(timeout=300)
        done[path] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


def test_every_script_is_runnable_or_a_known_module() -> None:
    assert {p.name for p in SCRIPTS} - {p.name for p in RUNNABLE} == {"sdk_report.py", "soak_report.py", "locustfile.py"}


@pytest.mark.parametrize("script", RUNNABLE, ids=[str(p.relative_to(ROOT / "clients")) for p in RUNNABLE])
def test_script_prints_its_usage_from_any_directory(script: Path, help_outputs) -> None:
    result = help_outputs[script]
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:"), result.stdout[:500]


def project_imports(source: str) -> list[tuple[str, str]]:
    """(module, name) for every ``from <project module> import name`` anywhere in the source."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(PROJECT):
            found += [(node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=IDS)
def test_what_the_script_imports_from_the_project_exists(script: Path) -> None:
    for module, name in project_imports(script.read_text()):
        imported = importlib.import_module(module)
        assert hasattr(imported, name) or importlib.util.find_spec(f"{module}.{name}") is not None, (
            f"{script.relative_to(ROOT)}: from {module} import {name}: no such name"
        )
