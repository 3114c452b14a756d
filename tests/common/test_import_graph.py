"""The package's import graph runs one way: no module imports, at module level or inside a function, a module
that imports it back (directly or through others). Layers read bottom-up — config, structure, model, decoder,
request, pipeline, plugin, registry, loading, bench and batch, cli — and a cycle is the sign that something sits
in the wrong layer (the fix is to move it, not to hide the import in a function)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED = {"tests", "examples", "build", ".ci", "docs"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["mmspec", *parts])


def package_modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")
            if p.relative_to(ROOT).parts[0] not in SKIPPED and p.relative_to(ROOT) != Path("setup.py")}


def imported(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules `module` imports anywhere in its file (module level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (path.name == "__init__.py")]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            while name not in modules and "." in name:  # `from pkg import attr`: the module is pkg
                name = name.rsplit(".", 1)[0]
            if name in modules and name != module:
                found.add(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_import_graph_has_no_cycle():
    modules = package_modules()
    assert "mmspec.common.pipeline" in modules and "mmspec.plugins.lantern.plugin" in modules
    graph = {m: imported(m, p, modules) for m, p in modules.items()}
    assert "mmspec.common.registry" in graph["mmspec.common.loading"]  # the parser sees imports at all
    assert cycles(graph) == []


def test_the_pipeline_base_and_the_registry_do_not_load_or_look_plugins_up():
    """A pipeline with no plugin runs plain AR itself; the registry records names and never loads."""
    modules = package_modules()
    pipeline = imported("mmspec.common.pipeline", modules["mmspec.common.pipeline"], modules)
    registry = imported("mmspec.common.registry", modules["mmspec.common.registry"], modules)
    assert not pipeline & {"mmspec.common.registry", "mmspec.common.plugin", "mmspec.common.loading"}
    assert "mmspec.common.loading" not in registry
