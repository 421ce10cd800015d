"""The project's modules import each other as a DAG: no cycle, counting every import statement
(module level, inside functions, and under ``if TYPE_CHECKING``), so each layer can be read, and
tested, without the ones above it. The layers themselves are fixed: ``clients -> server ->
specdec_core``, and inside the core ``engine -> speculation -> decoding/loading -> execution ->
kernels`` (the C library); an import may only point down (or sideways inside one package). A cycle check alone let the
core's packages import upward from inside functions and type-only blocks (the speculation
proposers took the engine's ``Request``), so a newcomer could not read one package without the
one above it. The server has floors of its own (``SERVER_ORDER``): with ``server`` as one layer,
four pairs of its packages imported each other unseen."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("server", "specdec_core", "clients")
# Higher imports lower, never the reverse. Equal ranks (decoding, loading) may not import each
# other either: neither needs the other, and a sideways import is a cycle waiting to happen.
TOP_ORDER = {"clients": 2, "server": 1, "specdec_core": 0}
# "" is the package itself: the core's facade re-exports the engine (above it all); the server's
# holds only its version (below it all).
CORE_ORDER = {"": 5, "engine": 4, "speculation": 3, "decoding": 2, "loading": 2, "execution": 1, "kernels": 0}
SERVER_ORDER = {
    "": 0, "settings": 0, "prometheus": 0, "logging_setup": 0,  # process configuration
    "http": 1,  # HTTP plumbing: errors, bodies, JSON, auth, the request log
    "api": 2,  # API-neutral: schema base, limits, parsing, response types, the speculative report
    "tools": 3, "services": 3,  # tool calling; the engine host, grammar pool, response store
    "state": 4,  # the process's one state object, owning the services
    "generation": 5,  # engine requests of one HTTP request, output items, SSE framing, prompts
    "openai": 6, "anthropic": 6,  # one package per API: schemas and answers
    "routes": 7,
    "app": 8,
    "runner": 9, "ray_serve": 9,
    "cli_flags": 10, "cli": 11, "__main__": 12,
}
ORDERS = {"specdec_core": CORE_ORDER, "server": SERVER_ORDER}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules that ``name`` imports; ``from pkg import mod`` counts as importing ``pkg.mod``."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]  # `import a.b.c` of a name inside a module
            if target and target != name:
                found.add(target)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_find_cycle_reports_a_cycle_and_accepts_a_dag() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_relative_and_from_imports_resolve_to_modules(tmp_path: Path) -> None:
    modules = {"pkg": tmp_path / "__init__.py", "pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    (tmp_path / "a.py").write_text("from . import b\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b\n")
    assert imports_of("pkg.a", tmp_path / "a.py", modules) == {"pkg.b"}
    (tmp_path / "b.py").write_text("def f():\n    from pkg.a import thing\n")
    assert imports_of("pkg.b", tmp_path / "b.py", modules) == {"pkg.a"}


def test_the_project_has_no_import_cycle() -> None:
    modules = project_modules()
    assert "specdec_core.engine.engine" in modules and "server.app" in modules
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def layer(module: str) -> tuple[int, str]:
    """Where ``module`` sits: its top-level package's rank and, inside the core or the server, its
    package or top-level module ("" for the package's own ``__init__``)."""
    parts = module.split(".")
    order = ORDERS.get(parts[0])
    if order is None:
        return TOP_ORDER[parts[0]], parts[0]
    inner = parts[1] if len(parts) > 1 else ""
    assert inner in order, f"{module}: place {inner!r} in the order of {parts[0]!r}"
    return TOP_ORDER[parts[0]], inner


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every edge of ``graph`` that does not point down the layers, as ``importer -> imported``."""
    bad = []
    for name, targets in sorted(graph.items()):
        (top, pkg) = layer(name)
        for target in sorted(targets):
            (t_top, t_pkg) = layer(target)
            if t_top != top:
                ok = t_top < top
            else:  # one top-level package: down its own order, or inside one of its packages
                order = ORDERS.get(name.split(".")[0], {})
                ok = pkg == t_pkg or order[t_pkg] < order[pkg]
            if not ok:
                bad.append(f"{name} -> {target}")
    return bad


def test_upward_imports_are_found() -> None:
    graph = {
        "specdec_core.engine.a": {"specdec_core.speculation.b", "specdec_core.execution.c"},
        "specdec_core.speculation.b": {"specdec_core.decoding.d", "specdec_core.engine.a"},
        "specdec_core.decoding.d": {"specdec_core.loading.e", "specdec_core.decoding.f"},
        "specdec_core.execution.c": {"specdec_core"},
        "specdec_core": {"specdec_core.engine.a"},
        "server.app": {"specdec_core.engine.a", "clients.bench"},
        "server.generation.g": {"server.openai.o", "server.api.a", "server"},
        "server.openai.o": {"server.anthropic.m", "server.generation.g"},
        "clients.bench": {"server.app", "specdec_core.engine.a"},
    }
    assert upward_imports(graph) == ["server.app -> clients.bench",
                                     "server.generation.g -> server.openai.o",
                                     "server.openai.o -> server.anthropic.m",
                                     "specdec_core.decoding.d -> specdec_core.loading.e",
                                     "specdec_core.execution.c -> specdec_core",
                                     "specdec_core.speculation.b -> specdec_core.engine.a"]


def test_packages_import_only_down_the_layers() -> None:
    modules = project_modules()
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    assert upward_imports(graph) == []
