"""Layering of the `dspark` package: a lower part never imports a higher one.

Every import counts, the ones inside functions too (a lazy import is still a dependency). From
the bottom: the leaf modules (`paths`, `errors`, `fileio`, `machine`, `timing`), then the
target, the draft model, the decoder, export, calibration, training, and the benchmark
(`eval`) on top of them all.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "dspark"

# part -> the parts it must never import (a part: a subpackage or a top-level module).
HIGHER = {"cli", "eval", "training", "calibration", "export", "data", "objectives"}
FORBIDDEN: dict[str, set[str]] = {
    **{
        leaf: HIGHER | {"target", "modeling", "decoding"}
        for leaf in ("paths", "fileio", "locking", "timing", "from_target")
    },
    "machine": HIGHER | {"target", "modeling", "decoding"},
    "target": HIGHER | {"modeling", "decoding"},
    "modeling": HIGHER | {"decoding"},
    "decoding": HIGHER | {"target"},
    "export": HIGHER - {"export"},
    "calibration": HIGHER - {"calibration", "export"},
    "training": {"cli", "eval"},
}


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
    banned = FORBIDDEN.get(own or "", set())
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
    ],
)
def test_the_check_catches_a_reintroduced_import(module, source):
    assert violations(source, module), f"{module}: {source!r} should be refused"


def test_the_check_allows_imports_downwards():
    assert not violations("from dspark.modeling.lora import apply_lora\n", "dspark.export.api")
    assert not violations("from dspark.paths import cache_root\n", "dspark.decoding.sps")
    assert not violations("from dspark.calibration import fit\n", "dspark.training.calibrate")
    assert not violations("from dspark.training.loop import run\n", "dspark.eval.ablation")
