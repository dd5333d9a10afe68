"""The package's shape: no import circle between pal_hpc's modules, no module over
MAX_LINES lines.

The import graph is read from the source with `ast` (nothing is imported), and counts
every import statement of a module, also one inside a function: an import made lazy to
dodge a circle at start-up still ties the two modules together for a reader, so it is
a circle here too.  `from pkg import name` is an edge to the submodule pkg.name when
that is a module of ours, to an extension module (pkg/name is not bound in
pkg/__init__.py: the native core) that has no edges of its own, else to pkg.  A
module's implicit import of its parent package is not an edge (every `pkg.a` importing
its sibling `pkg.b` would otherwise close a circle through `pkg/__init__.py`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGE = "pal_hpc"
MAX_LINES = 400
# Modules allowed over MAX_LINES, each with the reason; an entry that is no longer
# needed fails the test, so the list only shrinks.  Empty since issue 25's splits.
OVER_LIMIT: dict[str, str] = {}


def modules(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under root/package."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _bound_names(tree: ast.Module) -> set[str]:
    """Names a package's __init__ binds at module level (imports, defs, assignments)."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
    return names


def import_graph(root: Path, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: line of the first import of it}."""
    mods = modules(root, package)
    trees = {m: ast.parse(p.read_text(encoding="utf-8"), str(p)) for m, p in mods.items()}
    bound = {m: _bound_names(t) for m, t in trees.items() if mods[m].name == "__init__.py"}

    def known(name: str) -> str | None:
        """The module of ours that importing `name` loads last (name or a parent);
        None for an extension module of ours (a name its package does not bind)."""
        while name and name not in mods:
            parent, _, last = name.rpartition(".")
            if parent in bound and last not in bound[parent]:
                return None
            name = parent
        return name or None

    graph: dict[str, dict[str, int]] = {m: {} for m in mods}
    for mod, tree in trees.items():
        here = mod if mods[mod].name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in mods else known(sub))
            for target in targets:
                if target is not None and target != mod:
                    graph[mod].setdefault(target, node.lineno)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each
    sorted; together they are every import circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def describe(graph: dict[str, dict[str, int]], comp: list[str], root: Path) -> str:
    """One circle: its modules and the import lines that tie them together."""
    mods = modules(root)
    inside = set(comp)
    lines = [f"import circle of {len(comp)} modules: {', '.join(comp)}"]
    for m in comp:
        for target, line in sorted(graph[m].items()):
            if target in inside:
                lines.append(f"  {mods[m].relative_to(root)}:{line} imports {target}")
    return "\n".join(lines)


def test_no_import_circle():
    graph = import_graph(ROOT)
    assert len(graph) > 50 and graph["pal_hpc.main"]      # it did read the package
    found = cycles(graph)
    assert not found, "\n".join(describe(graph, c, ROOT) for c in found)


def test_no_module_over_the_line_limit():
    sizes = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
             for p in modules(ROOT).values()}
    over = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in OVER_LIMIT}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"
    stale = [path for path in OVER_LIMIT if sizes.get(path, 0) <= MAX_LINES]
    assert not stale, f"no longer over {MAX_LINES} lines: remove from OVER_LIMIT: {stale}"


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("b_imports_a", [
    "from pal_hpc.a import f\n",                                  # at module level
    "def g():\n    from pal_hpc import a\n",                       # lazily, a submodule
    "from . import a\n",                                           # relative
    "import pal_hpc.sub.c\n",                                      # through a third module
])
def test_the_checker_finds_a_circle(tmp_path, b_imports_a):
    _write(tmp_path, {"pal_hpc/__init__.py": "", "pal_hpc/a.py": "from pal_hpc import b\n",
                      "pal_hpc/b.py": b_imports_a, "pal_hpc/sub/__init__.py": "",
                      "pal_hpc/sub/c.py": "import pal_hpc.a as a\n"})
    graph = import_graph(tmp_path)
    found = cycles(graph)
    assert len(found) == 1 and {"pal_hpc.a", "pal_hpc.b"} <= set(found[0])
    assert "pal_hpc/b.py:" in describe(graph, found[0], tmp_path)


def test_the_checker_passes_a_package_and_its_parts(tmp_path):
    """A package's __init__ importing its parts, which import each other by absolute
    name and import the native core from the package, is no circle."""
    _write(tmp_path, {"pal_hpc/__init__.py": "",
                      "pal_hpc/p/__init__.py": "from pal_hpc.p.x import X\nfrom pal_hpc.p.y import Y\n",
                      "pal_hpc/p/x.py": "from pal_hpc.p import _core\nX = 1\n"
                                        "from pal_hpc.p._core import f\n",
                      "pal_hpc/p/y.py": "from pal_hpc.p.x import X\nY = X\n"})
    graph = import_graph(tmp_path)
    assert graph["pal_hpc.p"] == {"pal_hpc.p.x": 1, "pal_hpc.p.y": 2}
    assert graph["pal_hpc.p.x"] == {} and cycles(graph) == []
