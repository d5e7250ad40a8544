"""The house's floors, read from the code's imports: ``distilserve.models`` at the bottom;
``distilserve.training`` and ``distilserve.bench`` on it; ``distilserve.server`` (the
service and its protocols) on models and training (the embedded default is trained);
the CLI at the top; ``distilserve.client`` on its own. No import runs down-to-up, and no
two modules import each other, however far round (an import under ``if TYPE_CHECKING:``,
a type only, runs nothing and is left out). No source file is over 450 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distilserve"

# the floors each part may import from (itself included)
ALLOWED = {"models": {"models"}, "training": {"models", "training"},
           "bench": {"models", "bench"}, "client": {"client"},
           "server": {"models", "training", "server"},
           "cli": {"models", "training", "bench", "server", "cli"}}


def part(module: str) -> str:
    if module.startswith("distilserve.server.cli"):
        return "cli"
    return module.split(".")[1] if module.count(".") else "root"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _type_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of the package that ``name`` imports, anywhere in its code (a function's
    deferred import too), but for type-only imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()

    def visit(node: ast.AST) -> None:
        if _type_only(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_import_runs_down_to_up():
    wrong = [f"{a} imports {b}" for a, targets in graph().items() for b in sorted(targets)
             if part(a) in ALLOWED and part(b) not in ALLOWED[part(a)]]
    assert wrong == []


def test_no_import_circle():
    edges = graph()
    circles, done, path = [], set(), []

    def walk(module: str) -> None:
        path.append(module)
        for target in sorted(edges[module]):
            if target in path:
                circles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in done:
                walk(target)
        path.pop()
        done.add(module)

    for module in sorted(edges):
        if module not in done:
            walk(module)
    assert circles == []


def test_the_graph_is_read():  # the tests above would pass on an empty graph
    edges = graph()
    assert "distilserve.models.runtime.base" in edges["distilserve.models.runtime.onnx"]
    assert "distilserve.training.finetune" in edges["distilserve.server.embedded_default"]


TRANSPORTS = ("fastapi", "starlette", "grpc", "ray", "uvicorn")


def test_the_core_imports_no_transport():
    """distilserve.server.core: plain values in and out; only the package's core and models."""
    core = {name: path for name, path in modules().items()
            if name.startswith("distilserve.server.core")}
    assert "distilserve.server.core.registry" in core
    wrong = []
    for name, path in core.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            wrong += [f"{name} imports {n}" for n in names if n.split(".")[0] in TRANSPORTS
                      or (n.startswith("distilserve.") and not n.startswith(
                          ("distilserve.server.core", "distilserve.models")))]
    assert wrong == []


def test_no_source_file_is_over_450_lines():
    """A file a reader can hold in mind: past 450 lines, it is two."""
    long = {str(path.relative_to(ROOT)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text().splitlines())) > 450}
    assert long == {}
