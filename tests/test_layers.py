"""The import rule of docs/architecture.md, held: a module imports only from its own layer or the layers below.

Every import counts, at module level or inside a function (a lazy import still runs in
the same process); only imports under `if TYPE_CHECKING:` are left out, since they never
run. Besides the layers, what serves never imports torch, transformers or the
optimiser, and the terminal UI never opens the store.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Bottom to top, as docs/architecture.md draws them. A name covers the module or package and all under it;
# "appliance" alone is the package's own __init__, nothing under it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("foundation", ("appliance.core", "appliance.samples", "appliance")),
    ("store", ("appliance.store",)),
    ("dataset", ("appliance.data", "appliance.pixels", "appliance.words")),
    ("kernel", ("appliance.inference",)),
    ("train", ("appliance.train",)),
    ("optimise", ("appliance.optimize",)),
    ("registry", ("appliance.registry", "appliance.access")),
    ("serve", ("appliance.serve",)),
    ("operations", ("appliance.operations", "appliance.compliance")),
    ("service", ("appliance.daemon",)),
    ("interface", ("appliance.cli", "appliance.launch", "appliance.__main__", "tui")),
]

NEVER: dict[str, tuple[str, ...]] = {
    "appliance.serve": ("torch", "transformers", "appliance.optimize", "appliance.train", "appliance.operations.pipeline"),
    "appliance.inference": ("torch", "transformers", "appliance.optimize", "appliance.train"),
    "tui": ("appliance.store",),
}


def _owner(name: str, table: list[tuple[str, tuple[str, ...]]] | dict[str, tuple[str, ...]]) -> str | None:
    """The most specific entry whose prefix covers the dotted name."""
    entries = table.items() if isinstance(table, dict) else table
    best = None
    for label, prefixes in entries:
        for prefix in (prefixes if isinstance(prefixes, tuple) else (prefixes,)):
            covers = name == prefix or (prefix != "appliance" and name.startswith(prefix + "."))
            if covers and (best is None or len(prefix) > len(best[1])):
                best = (label, prefix)
    return best[0] if best else None


def _layer(name: str) -> int | None:
    label = _owner(name, LAYERS)
    return None if label is None else [layer for layer, _ in LAYERS].index(label)


def _imports(source: str, module: str) -> list[tuple[int, str]]:
    """(line, imported name) of every import that runs: absolute and relative, top-level or lazy."""
    tree = ast.parse(source)
    skipped = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
               and ast.unparse(block.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
               for statement in block.body for node in ast.walk(statement)}
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def _violations(source: str, module: str) -> list[str]:
    own = _layer(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS and to docs/architecture.md"
    banned = NEVER.get(_owner(module, {prefix: (prefix,) for prefix in NEVER}) or "", ())
    wrong = []
    for line, name in _imports(source, module):
        target = _layer(name)
        if target is not None and target > own and not name.startswith(module + "."):
            wrong.append(f"{module}:{line} imports {name} ({LAYERS[target][0]}) from below it ({LAYERS[own][0]})")
        if any(name == ban or name.startswith(ban + ".") for ban in banned):
            wrong.append(f"{module}:{line} imports {name}, which it must never load")
    return wrong


def _modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted([*ROOT.glob("appliance/**/*.py"), *ROOT.glob("tui/**/*.py")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return found


def test_every_module_imports_only_its_own_layer_and_those_below() -> None:
    wrong = [problem for module, path in _modules() for problem in _violations(path.read_text(), module)]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("module", "source"), [
    ("appliance.registry", "from appliance.serve import runtime\n"),
    ("appliance.store.blobs", "def later():\n    from appliance.data import datasets\n"),
    ("appliance.serve.batching", "def later():\n    import torch\n"),
    ("tui.app", "from appliance.store import audit\n"),
])
def test_the_rule_catches_an_import_against_it(module: str, source: str) -> None:
    assert _violations(source, module)


def test_an_import_only_for_type_checking_is_not_counted() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from appliance.operations.jobs import Job\n"
    assert not _violations(source, "appliance.registry.usage")
