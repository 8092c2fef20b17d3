"""Layering of the `dspark` package: a lower part never imports a higher one.

Every import counts, the ones inside functions too (a lazy import is still a dependency). From
the bottom: the leaf modules (`paths`, `errors`, `fileio`, `machine`, `timing`, `plotting`),
then the target, the engines users serve with (llama.cpp's server), the draft model, the
decoder, export, calibration, training, the benchmark (`eval`), and on top of them all the
measurement harness (`bench`), which no other part imports.

Also the package's file names: a name used by two modules is the same idea in parallel
packages, and each of them names a counterpart in its docstring.

And the imports themselves: the modules' import-time imports (`if TYPE_CHECKING:` aside) form
no cycle, and an import inside a function says why on its line (`# optional: gguf`, `# cycle:
...`, `# after argument parsing: --help stays instant`); every other import sits at the top.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dspark"

# part -> the parts it must never import (a part: a subpackage or a top-level module).
HIGHER = {"bench", "cli", "eval", "training", "calibration", "export", "data", "objectives"}
FORBIDDEN: dict[str, set[str]] = {
    **{
        leaf: HIGHER | {"target", "modeling", "decoding"}
        for leaf in ("paths", "fileio", "locking", "timing", "from_target", "plotting")
    },
    "machine": HIGHER | {"target", "modeling", "decoding"},
    "target": HIGHER | {"modeling", "decoding", "engines"},
    "engines": HIGHER | {"modeling", "decoding"},
    "modeling": HIGHER | {"decoding"},
    "decoding": HIGHER | {"target"},
    "export": HIGHER - {"export"},
    "calibration": HIGHER - {"calibration", "export"},
    "training": {"bench", "cli", "eval"},
}
TOP = "bench"  # the measurement harness: it may import any part, and no other part imports it


def banned_for(part: str | None) -> set[str]:
    """The parts `part` must not import: its own list, and `bench` for every part but itself."""
    if part == TOP:
        return set()
    return FORBIDDEN.get(part or "", set()) | {TOP}


def part_of(module: str) -> str | None:
    """`dspark.eval.runner` -> `eval`; `dspark.paths` -> `paths`; outside dspark -> None."""
    parts = module.split(".")
    if parts[0] != "dspark" or len(parts) < 2:
        return None
    return parts[1]


def imported_modules(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every module `source` (the text of `module`) imports, at any depth, absolute names."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append(name)
            if name == "dspark":  # `from dspark import dtype_choice`: the submodule
                found += [f"dspark.{a.name}" for a in node.names]
    return found


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    own = part_of(module)
    banned = banned_for(own)
    return [
        name
        for name in imported_modules(source, module, is_package)
        if part_of(name) in banned and part_of(name) != own
    ]


def package_modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((path, ".".join(rel.parts)))
    return out


def test_no_lower_part_imports_a_higher_one():
    hits = []
    for path, module in package_modules():
        is_package = path.name == "__init__.py"
        for name in violations(path.read_text(), module, is_package):
            hits.append(f"{path.relative_to(PACKAGE.parent)} imports {name}")
    assert not hits, "move the shared piece down instead:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("dspark.modeling.draft", "def f():\n    from dspark.training.lora import apply_lora\n"),
        ("dspark.export.api", "from dspark.training import lora\n"),
        ("dspark.training.calibrate", "from dspark.eval.calibrate import fit_on_prompts\n"),
        ("dspark.training.report", "import dspark.eval.runner\n"),
        ("dspark.decoding.sps", "from dspark.target.loading import cache_root\n"),
        ("dspark.decoding.sps", "from ..target import loading\n"),
        ("dspark.calibration.fit", "from dspark import eval\n"),
        ("dspark.eval.runner", "from dspark.bench.cost_model import measure_costs\n"),
        ("dspark.eval.report", "def f():\n    from ..bench import cost_model\n"),
        ("dspark.training.loop", "from dspark.bench.train_memory import estimate\n"),
        ("dspark.training.loop", "import dspark.bench.train_speed\n"),
        ("dspark.decoding.sps", "from dspark.bench.sps_plot import plot_profile\n"),
        ("dspark.cli", "from dspark import bench\n"),
        ("dspark.dtype_probe", "from dspark.bench.cost_model import measure_costs\n"),
        ("dspark.data.cli", "from dspark.bench.llama_cpp_build import build_server\n"),
    ],
)
def test_the_check_catches_a_reintroduced_import(module, source):
    assert violations(source, module), f"{module}: {source!r} should be refused"


def test_the_check_allows_imports_downwards():
    assert not violations("from dspark.modeling.lora import apply_lora\n", "dspark.export.api")
    assert not violations("from dspark.paths import cache_root\n", "dspark.decoding.sps")
    assert not violations("from dspark.calibration import fit\n", "dspark.training.calibrate")
    assert not violations("from dspark.training.loop import run\n", "dspark.bench.cache_speed")
    assert not violations("from dspark.eval.prompts import render\n", "dspark.bench.load_sweep")
    assert not violations("from dspark.bench import llama_cpp_flags\n", "dspark.bench.llama_cpp")


def module_docstrings() -> dict[str, str]:
    """`eval/report.py` (the path under dspark/) -> that module's docstring."""
    return {
        path.relative_to(PACKAGE).as_posix(): ast.get_docstring(ast.parse(path.read_text())) or ""
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _mentions(doc: str, rel: str) -> bool:
    """Whether `doc` names the module at `rel` (`eval/report.py`): `dspark/eval/report.py`,
    `dspark.eval.report`, or `eval/report.py` for a module inside a subpackage (a top-level
    `cli.py` is named only in full: `cli.py` alone would also match `data/cli.py`)."""
    dotted = rel.removesuffix(".py").replace("/", ".")
    forms = [f"dspark/{rel}", f"dspark.{dotted}"] + ([rel] if "/" in rel else [])
    edge = r"(?<![\w/.])"  # a form starts at a word's start, not inside another path
    return any(re.search(edge + re.escape(f) + r"(?![\w/])", doc) for f in forms)


def unexplained_shared_names(docstrings: dict[str, str]) -> list[str]:
    """The modules (paths under dspark/) whose file name another module also has, and whose
    docstring names none of those other modules (`__init__.py` aside)."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for rel in docstrings:
        name = rel.rsplit("/", 1)[-1]
        if name != "__init__.py":
            by_name[name].append(rel)
    return [
        rel
        for rels in by_name.values()
        if len(rels) > 1
        for rel in rels
        if not any(_mentions(docstrings[rel], other) for other in rels if other != rel)
    ]


def test_a_shared_file_name_is_the_same_idea_and_says_so():
    hits = unexplained_shared_names(module_docstrings())
    assert not hits, (
        "a module shares its file name with another: rename it for its own idea, or (the same "
        "idea in a parallel package) name its counterpart in its docstring:\n" + "\n".join(hits)
    )


def test_the_shared_name_check_catches_a_silent_one():
    docs = {
        "cli.py": "Console entry points.",  # names nothing
        "data/cli.py": "The data steps' command lines, beside `dspark/export/cli.py`.",
        "export/cli.py": "Export's command line (its script: data_scripts/cli.py).",  # no module
        "eval/report.py": "The benchmark's report (`dspark/eval/report.py`).",  # itself only
        "training/report.py": "Parallels `dspark.eval.report`.",
        "calibration/metrics.py": "Calibration metrics; see dspark/eval/metrics_io.py.",  # another
        "eval/metrics.py": "Speed metrics; `calibration/metrics.py` holds the calibration ones.",
        "eval/runner.py": "A name of its own needs no counterpart.",
    }
    assert sorted(unexplained_shared_names(docs)) == [
        "calibration/metrics.py",
        "cli.py",
        "eval/report.py",
        "export/cli.py",
    ]


# -- module-level imports: no cycle; function-level imports: each says why --------------------
def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_time_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports a module runs when it is imported: not inside a function, not under
    `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            elif isinstance(node, ast.If) and _is_type_checking(node):
                walk(node.orelse)
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    sub = getattr(node, field, None)
                    if isinstance(sub, list):
                        walk(sub)

    walk(tree.body)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """module -> the package modules it imports at import time. `sources`: module -> (its text,
    whether it is a package's `__init__`). `from pkg import sub` counts `pkg.sub`; importing
    `a.b.c` from outside `a.b` also runs `a.b`'s `__init__`, so that counts too."""
    graph: dict[str, set[str]] = {}
    for module, (source, is_package) in sources.items():
        edges: set[str] = set()
        for node in import_time_imports(ast.parse(source)):
            text = ast.unparse(node)
            for name in imported_modules(text, module, is_package):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    ancestor = ".".join(parts[:i])
                    inside = module == ancestor or module.startswith(ancestor + ".")
                    if ancestor in sources and not inside:
                        edges.add(ancestor)
                if isinstance(node, ast.ImportFrom):
                    subs = [f"{name}.{a.name}" for a in node.names]
                    edges.update(s for s in subs if s in sources and s != module)
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def package_sources() -> dict[str, tuple[str, bool]]:
    out = {}
    for path, module in package_modules():
        is_package = path.name == "__init__.py"
        out[module.removesuffix(".__init__")] = (path.read_text(), is_package)
    return out


def test_module_level_imports_have_no_cycle():
    cycle = find_cycle(import_graph(package_sources()))
    assert cycle is None, (
        "modules import each other at import time: "
        + " -> ".join(cycle or [])
        + "\nmove the shared piece into a module below both"
    )


def unexplained_function_imports(source: str) -> list[int]:
    """The lines of the imports inside functions that carry no `#` comment giving the reason
    (an optional dependency, a cycle, a command line's start-up); a comment on any line of a
    wrapped import counts."""
    lines = source.splitlines()
    hits = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                end = child.end_lineno or child.lineno
                text = lines[child.lineno - 1 : end]
                if not any("#" in line for line in text):
                    hits.append(child.lineno)
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            walk(child, inner)

    walk(ast.parse(source), False)
    return hits


def test_every_import_inside_a_function_says_why():
    hits = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path, _ in package_modules()
        for line in unexplained_function_imports(path.read_text())
    ]
    assert not hits, (
        "an import inside a function: move it to the top of the module, or give the reason "
        "on its line (`# optional: gguf`, `# cycle: dspark.x imports this module`):\n"
        + "\n".join(hits)
    )


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("def f():\n    import json\n", [2]),
        ("def f():\n    from dspark.paths import cache_root\n", [2]),
        ("class A:\n    def f(self):\n        if x:\n            import torch\n", [4]),
        ("async def f():\n    from . import x\n", [2]),
        ("def f():\n    import gguf  # optional: gguf\n", []),
        ("def f():\n    from a import (  # cycle: a imports this module\n        b,\n    )\n", []),
        ("import json\n\n\ndef f():\n    return json\n", []),
        ("try:\n    import yaml\nexcept ImportError:\n    yaml = None\n", []),
    ],
)
def test_the_reason_check_flags_only_a_silent_import(source, flagged):
    assert unexplained_function_imports(source) == flagged


@pytest.mark.parametrize(
    ("sources", "cycle"),
    [
        (
            {"p.a": ("from p.b import x\n", False), "p.b": ("from p.a import y\n", False)},
            ["p.a", "p.b", "p.a"],
        ),
        (
            {"p.a": ("from . import b\n", False), "p.b": ("import p.a\n", False)},
            ["p.a", "p.b", "p.a"],
        ),
        (  # through a package's __init__, which importing a submodule runs
            {
                "p": ("", True),
                "p.q": ("from p.q.a import x\n", True),
                "p.q.a": ("", False),
                "p.b": ("import p.q.a\n", False),
                "p.q.c": ("from p.b import y\n", False),
            },
            None,
        ),
        (
            {
                "p": ("", True),
                "p.q": ("from p.q.c import x\n", True),
                "p.q.a": ("", False),
                "p.q.c": ("from p.b import y\n", False),
                "p.b": ("import p.q.a\n", False),
            },
            ["p.b", "p.q", "p.q.c", "p.b"],
        ),
        (
            {"p.a": ("def f():\n    from p.b import x\n", False), "p.b": ("import p.a\n", False)},
            None,
        ),
        (
            {
                "p.a": (
                    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.b import x\n",
                    False,
                ),
                "p.b": ("import p.a\n", False),
            },
            None,
        ),
    ],
)
def test_the_cycle_check_finds_a_cycle(sources, cycle):
    assert find_cycle(import_graph(sources)) == cycle
