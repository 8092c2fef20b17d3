"""Layering of dspark/data: stages import only earlier stages, never the packages above data,
and no two modules import each other at module level."""

from __future__ import annotations

import ast
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "dspark" / "data"
# The dspark packages outside data that data may use (the shared helpers, the target it
# runs, the decoder its fast backend drives, the engines its server backend starts); never
# eval, training, objectives, modeling...
ALLOWED_OUTSIDE = {
    "dspark.errors",
    "dspark.fileio",
    "dspark.locking",
    "dspark.paths",
    "dspark.config",
    "dspark.target",
    "dspark.decoding",
    "dspark.dtype_probe",
    "dspark.engines",
}
# Stage of each part of dspark/data: a module imports only parts of a stage <= its own.
STAGES = {
    "outputs": 0,
    "masks": 0,
    "collate": 0,
    "packing": 0,
    "prompts": 1,
    "regeneration": 2,
    "tokenize": 2,
    "build_status": 2,
    "features": 3,
    "draft_vocab": 4,
    "cli": 5,
    "tokenize_cli": 5,
}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(DATA.rglob("*.py")):
        rel = path.relative_to(DATA.parent.parent).with_suffix("")
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("dspark.") or m == "dspark"}


def part(module: str) -> str:
    """`dspark.data.prompts.sources` -> `prompts`; `dspark.data.masks` -> `masks`."""
    return module.split(".")[2]


def test_data_imports_no_higher_package():
    bad = []
    for name, path in modules().items():
        for m in imports(path):
            if m.startswith("dspark.data") or m == "dspark":
                continue
            if not any(m == a or m.startswith(a + ".") for a in ALLOWED_OUTSIDE):
                bad.append(f"{name} imports {m}")
    assert not bad, "\n".join(bad)


def test_stages_import_only_earlier_stages():
    mods = modules()
    bad = []
    for name, path in mods.items():
        if name == "dspark.data":
            continue
        own = STAGES[part(name)]
        for m in imports(path):
            if not m.startswith("dspark.data.") or m not in mods:
                continue
            if STAGES[part(m)] > own:
                bad.append(f"{name} (stage {own}) imports {m} (stage {STAGES[part(m)]})")
    assert not bad, "\n".join(bad)


def test_no_module_level_import_cycle():
    mods = modules()
    graph = {n: {m for m in imports(p, top_level_only=True) if m in mods} for n, p in mods.items()}
    state: dict[str, int] = {}

    def visit(n, trail):
        if state.get(n) == 2:
            return
        assert state.get(n) != 1, "import cycle: " + " -> ".join(trail + [n])
        state[n] = 1
        for m in sorted(graph[n]):
            visit(m, trail + [n])
        state[n] = 2

    for n in sorted(graph):
        visit(n, [])


def test_presets_are_plain_data():
    """The presets module names sets; loading them is the sources' job."""
    found = imports(DATA / "prompts" / "presets.py")
    assert not {m for m in found if m.startswith("dspark.data")}, found
    assert not imports(DATA / "prompts" / "public_sets.py")


def test_no_file_in_data_past_400_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in modules().items()}
    assert not {n: k for n, k in long.items() if k > 400}
