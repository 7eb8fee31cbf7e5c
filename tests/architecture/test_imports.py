"""Architecture rules checked on the source: no import circle in pace_core (lazy and
type-checking imports included), and no module that grows past the size budget."""

from __future__ import annotations

import ast
from pathlib import Path

import pace_core

ROOT = Path(pace_core.__file__).resolve().parent
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every pace_core module ``name`` imports anywhere in its body (functions included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                       for a in node.names]  # fmt: skip
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_pace_core():
    modules = _modules()
    graph = {name: _imports(name, path, set(modules)) for name, path in modules.items()}
    assert graph["pace_core.engine.llm"] >= {"pace_core.speculative.speculator"}  # sees imports
    assert _cycles(graph) == []


def test_the_walk_finds_a_circle_when_there_is_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_every_module_stays_small():
    too_big = {
        name: n
        for name, path in _modules().items()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert too_big == {}


def _package(module: str) -> str | None:
    """The sub-package of ``pace_core`` a module belongs to (None for the root modules)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (ROOT / parts[-1]).is_dir() else None


def test_no_import_circle_between_packages():
    """Sub-packages depend one way (engine -> speculative -> models, never back): a module
    may import another package's module only if that package never imports back."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        src = _package(name)
        if src is None:
            continue
        for dep in _imports(name, path, set(modules)):
            dst = _package(dep)
            graph.setdefault(src, set())
            if dst is not None and dst != src:
                graph[src].add(dst)
                graph.setdefault(dst, set())
    assert graph["engine"] >= {"speculative", "models"}  # sees the packages
    assert _cycles(graph) == []


def test_the_runtime_never_imports_the_benchmarks():
    """``pace_bench`` is its own distribution: ``pip install pace-core`` carries none of it,
    so no runtime module may import it (``pace bench`` arrives through an entry point)."""
    def imported(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        return [node.module or ""] if isinstance(node, ast.ImportFrom) else []

    importers = [
        name
        for name, path in _modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if any(n.startswith("pace_bench") for n in imported(node))
    ]
    assert importers == []


def _private_uses(tree: ast.AST) -> list[str]:
    """``from pace_x.y import _name`` and ``mod._name`` on a module imported from a pace
    package: a private name used outside the module that defines it."""
    modules: set[str] = set()  # local names bound to pace modules
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pace_"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names
                           if a.name.startswith("pace_"))  # fmt: skip
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_")
                and not node.attr.startswith("__")):  # fmt: skip
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_private_name_crosses_a_module():
    """A helper another module needs is part of its module's interface: public, with a
    docstring. Runtime, plugins and benchmarks alike (tests may reach inside)."""
    repo = ROOT.parent
    roots = [ROOT, repo / "bench" / "pace_bench", *sorted((repo / "plugins").glob("*/pace_*"))]
    crossing = {
        str(path.relative_to(repo)): uses
        for root in roots
        for path in sorted(root.rglob("*.py"))
        if (uses := _private_uses(ast.parse(path.read_text())))
    }
    assert crossing == {}


def test_the_private_name_check_sees_both_forms():
    tree = ast.parse("from pace_core.x import _a, b\nfrom pace_bench import peers\npeers._c()\n")
    assert _private_uses(tree) == ["pace_core.x._a", "peers._c"]
