"""The embedded default prompt set, built from the Python standard library's own source.

A fresh machine has no prompt files, but every Python installation has its standard library.
We parse a fixed, sorted list of pure-Python stdlib modules with `ast` and turn their
documented functions into three kinds of realistic coding prompts:

- write: "write a function from its signature and docstring";
- explain: "explain this piece of code" (docstring removed);
- complete: "complete this piece of code" (the first part of the function is given).

Deterministic across runs and machines with the same Python minor version: modules and
functions are sorted, the task kind and the train/test split come from a SHA-256 of the
function's qualified name (not Python's salted `hash`), and sampling uses a fixed seed.
The held-out test split is chosen by name hash, so it never overlaps the train split.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import random
import sys
import textwrap

# Pure-Python modules present in every CPython 3.10+ installation (sorted).
MODULES = (
    "argparse",
    "ast",
    "base64",
    "bisect",
    "calendar",
    "colorsys",
    "configparser",
    "csv",
    "dataclasses",
    "difflib",
    "email.utils",
    "fnmatch",
    "fractions",
    "ftplib",
    "functools",
    "getopt",
    "gettext",
    "glob",
    "gzip",
    "heapq",
    "html",
    "http.cookies",
    "imaplib",
    "inspect",
    "ipaddress",
    "json.decoder",
    "json.encoder",
    "locale",
    "logging",
    "mailbox",
    "mimetypes",
    "netrc",
    "ntpath",
    "numbers",
    "operator",
    "optparse",
    "os",
    "pathlib",
    "pickletools",
    "platform",
    "plistlib",
    "posixpath",
    "pprint",
    "pydoc",
    "quopri",
    "random",
    "reprlib",
    "sched",
    "secrets",
    "shlex",
    "shutil",
    "smtplib",
    "statistics",
    "string",
    "tabnanny",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "tokenize",
    "trace",
    "traceback",
    "urllib.parse",
    "urllib.request",
    "uu",
    "uuid",
    "wave",
    "weakref",
    "webbrowser",
    "xml.dom.minidom",
    "zipfile",
)
KINDS = ("write", "explain", "complete")
SPLITS = ("train", "test")
DEFAULT_SIZES = {"train": 480, "test": 48}
TEST_FRACTION = 10  # one function in TEST_FRACTION goes to the held-out pool
MAX_SOURCE_CHARS = 1400  # keeps prompts to a few hundred tokens
MAX_SOURCE_LINES = 40
MIN_SOURCE_LINES = 4
SEED = 20240611


def _digest(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def _module_source(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.loader is None or not hasattr(spec.loader, "get_source"):
        return None
    try:
        return spec.loader.get_source(name)
    except (ImportError, OSError):
        return None


def _signature(src_lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The `def ...:` header as written (may span lines), without decorators."""
    first = node.lineno - 1
    body_start = node.body[0].lineno - 1
    header = src_lines[first:body_start]
    return _dedent("\n".join(header)).rstrip()


def _dedent(text: str) -> str:
    return textwrap.dedent(text)


def _candidates(module: str, source: str) -> list[dict]:
    tree = ast.parse(source)
    lines = source.splitlines()
    out = []

    def visit(body, prefix: str):
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.name.startswith("_") and node.name != "__init__":
                    continue
                doc = ast.get_docstring(node)
                if not doc or len(doc) < 40 or node.end_lineno is None:
                    continue
                start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
                text = _dedent("\n".join(lines[start : node.end_lineno]))
                n_lines = node.end_lineno - start
                if not (MIN_SOURCE_LINES <= n_lines <= MAX_SOURCE_LINES):
                    continue
                if len(text) > MAX_SOURCE_CHARS:
                    continue
                ds = node.body[0]
                # The function without its docstring (for explain / complete).
                code_lines = lines[start : ds.lineno - 1] + lines[ds.end_lineno : node.end_lineno]
                code = _dedent("\n".join(code_lines)).rstrip()
                if len(code.splitlines()) < 3:
                    continue
                out.append(
                    {
                        "module": module,
                        "qualname": prefix + node.name,
                        "signature": _signature(lines, node),
                        "docstring": doc.strip(),
                        "source": text,
                        "code": code,
                    }
                )

    visit(tree.body, "")
    return out


@functools.lru_cache(maxsize=2)
def _pool() -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    pools: dict[str, list[dict]] = {"train": [], "test": []}
    for module in MODULES:
        source = _module_source(module)
        if source is None:
            continue
        for c in _candidates(module, source):
            key = f"{c['module']}:{c['qualname']}"
            split = "test" if _digest("split:" + key) % TEST_FRACTION == 0 else "train"
            c["kind"] = KINDS[_digest("kind:" + key) % len(KINDS)]
            pools[split].append(c)
    for split in pools:
        pools[split].sort(key=lambda c: (c["module"], c["qualname"]))
    return tuple(pools["train"]), tuple(pools["test"])


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line if line.strip() else line for line in text.splitlines())


def _prompt(c: dict) -> str:
    where = f"`{c['module']}`"
    what = f"method `{c['qualname']}`" if "." in c["qualname"] else "function"
    if c["kind"] == "write":
        doc = _indent('"""' + c["docstring"] + '\n"""')
        return (
            f"Write the Python {what} with this signature and docstring (it comes from the "
            f"{where} module of the standard library). Give the complete implementation.\n\n"
            f"```python\n{c['signature']}\n{doc}\n```"
        )
    if c["kind"] == "explain":
        return (
            f"Explain what this Python code from the {where} module does, step by step, and "
            f"mention any edge cases it handles.\n\n```python\n{c['code']}\n```"
        )
    code_lines = c["code"].splitlines()
    keep = max(2, len(code_lines) // 2)
    head = "\n".join(code_lines[:keep])
    return (
        f"Complete this Python function from the {where} module. Continue the code where it "
        f"stops and briefly say what the finished function does.\n\n```python\n{head}\n```"
    )


def embedded_prompts(split: str = "train", n: int | None = None) -> list[dict]:
    """Return the embedded prompt set: `[{"messages": [{"role": "user", "content": ...}]}]`.

    `split` is `train` (DEFAULT_SIZES["train"] rows) or `test` (a held-out set whose
    functions never appear in train). `n` overrides the size (capped by the pool).
    Rows also carry `meta` (module, function, kind) for inspection.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    train, test = _pool()
    pool = list(train if split == "train" else test)
    want = DEFAULT_SIZES[split] if n is None else n
    if len(pool) < min(want, 8):
        raise RuntimeError(
            f"only {len(pool)} stdlib functions with source were found for the embedded "
            f"{split} set; this Python ({sys.version.split()[0]}) may ship without .py sources. "
            "Pass your own prompts with --input PATH instead."
        )
    rng = random.Random(f"{SEED}:{split}")
    chosen = sorted(rng.sample(range(len(pool)), min(want, len(pool))))
    rows = []
    for i in chosen:
        c = pool[i]
        rows.append(
            {
                "messages": [{"role": "user", "content": _prompt(c)}],
                "meta": {"module": c["module"], "function": c["qualname"], "kind": c["kind"]},
            }
        )
    return rows


def embedded_fingerprint(split: str = "train") -> str:
    """SHA-256 of the set's prompts, to record in manifests and compare machines."""
    h = hashlib.sha256()
    for row in embedded_prompts(split):
        h.update(row["messages"][0]["content"].encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()
