"""The code's shape, checked: no file over 600 lines, no class over 40 methods (inherited ones included),
no import circle between edgeagent's packages and none between its modules (docs/design.md, "Layout").

Read from the source (imports as ``ast`` sees them, every one: at the top, inside functions, under
``TYPE_CHECKING``) and from the classes themselves; a mode's package loaded by name (``importlib``) is
not an import here, as it is not one for Python's import system until it runs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections import defaultdict
from pathlib import Path

import edgeagent

ROOT = Path(edgeagent.__file__).parent
MAX_LINES = 600
MAX_METHODS = 40


def modules() -> dict[str, Path]:
    """Every module of edgeagent by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The edgeagent modules ``name`` imports (``from a import b`` counts ``a.b`` when that is a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in out if m in known and m != name}


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (as the nodes along it), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def package_of(module: str) -> str:
    """``edgeagent.modes.pipeline.central.run`` -> ``edgeagent.modes``: the layer a module belongs to."""
    return ".".join(module.split(".")[:2])


def test_no_file_is_over_600_lines() -> None:
    lines = {name: len(path.read_text().splitlines()) for name, path in modules().items()}
    long = {name: n for name, n in lines.items() if n > MAX_LINES}
    assert long == {}, f"files over {MAX_LINES} lines: {long}"


def test_no_import_circle_between_modules_or_between_packages() -> None:
    found = modules()
    known = set(found)
    graph = {name: imports_of(name, path, known) for name, path in found.items()}
    # A package's __init__ importing its own modules is how a package is built, not a circle of design.
    between = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    assert cycle(between) is None, f"import circle: {' -> '.join(cycle(between) or [])}"
    packages: dict[str, set[str]] = defaultdict(set)
    for module, deps in graph.items():
        own = package_of(module)
        packages[own].update(package_of(d) for d in deps if package_of(d) != own)
    packages.pop("edgeagent", None)  # the package's face (__init__) re-exports from below it
    for deps in packages.values():
        deps.discard("edgeagent")
    assert cycle(packages) is None, f"packages import each other: {' -> '.join(cycle(packages) or [])}"


def test_no_class_has_more_than_40_methods_with_those_it_inherits() -> None:
    counts: dict[str, int] = {}
    for info in pkgutil.walk_packages(edgeagent.__path__, "edgeagent."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, cls in vars(module).items():
            if not inspect.isclass(cls) or cls.__module__ != module.__name__:
                continue
            methods = {
                attr
                for klass in cls.__mro__
                if klass.__module__.startswith("edgeagent")
                for attr, value in vars(klass).items()
                if inspect.isfunction(value) or isinstance(value, staticmethod | classmethod | property)
            }
            counts[f"{module.__name__}.{name}"] = len(methods)
    assert len(counts) > 200  # every module was read
    big = {name: n for name, n in counts.items() if n > MAX_METHODS}
    assert big == {}, f"classes over {MAX_METHODS} methods (inherited included): {big}"


def test_the_circle_finder_finds_circles() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    known = {"edgeagent.x", "edgeagent.x.y", "edgeagent.z"}
    source = ROOT / "pipeline" / "step.py"  # any module: only its imports of ``known`` count
    assert imports_of("edgeagent.pipeline.step", source, known) == set()
