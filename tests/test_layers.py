"""The package's floors and walls, held by walking every module's imports with ``ast``.

Floors, lowest first; an import (module level, inside a function, ``TYPE_CHECKING`` or an ``importlib``
string) may only go down or stay on its floor:

ground (spec, report, findings, errors, units) < catalog, families < core < readers < advice < torch_adapters < render
< integrations < cli < the package facade (``fitcheck/__init__.py``, ``fitcheck/run.py``).

Inside ``core`` the rooms are ordered too: optimizers, kernels < states < activations < the orchestration modules.
A module outside a room imports only the room's surface (its ``__init__``), and the surface lists what it
offers in ``__all__``. No import circle, lazy imports included.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FLOORS: dict[str, int] = {
    "fitcheck.spec": 0,
    "fitcheck.report": 0,
    "fitcheck.findings": 0,
    "fitcheck.errors": 0,
    "fitcheck.units": 0,
    "fitcheck.catalog": 1,
    "fitcheck.families": 1,  # model families (inventory + traits): imports only spec, errors, units
    "fitcheck.core.optimizers": 2,
    "fitcheck.core.kernels": 2,  # fused kernels and memory levers (Liger, CCE, offloading): spec-only inputs
    "fitcheck.core.states": 3,
    "fitcheck.core.activations": 4,
    "fitcheck.core.parallelism": 4,
    "fitcheck.core.trainers": 4,
    "fitcheck.core": 5,
    "fitcheck.readers": 6,
    "fitcheck.advice": 7,
    "fitcheck.torch_adapters": 8,
    "fitcheck.render": 9,
    "fitcheck.integrations": 10,
    "fitcheck.cli": 11,
    "fitcheck.run": 12,
    "fitcheck": 12,
}

# Rooms with a declared surface: sub-packages whose __init__ has a docstring and __all__.
ROOMS = [name for name in FLOORS if (ROOT / name.replace(".", "/") / "__init__.py").exists()] + [
    "fitcheck.integrations"
]

# The orchestration modules that stay flat in fitcheck/core/.
CORE_FLAT = {"__init__", "estimator", "step", "allocator", "overheads", "compute"}


def _module_files() -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / "fitcheck").rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path
    for path in sorted((ROOT / "integrations").glob("*.py")):
        name = "fitcheck.integrations" + ("" if path.stem == "__init__" else f".{path.stem}")
        yield name, path


MODULES = dict(_module_files())


def _surface(package: str) -> frozenset[str]:
    """Names in a package's ``__all__``, read statically (an ``from pkg import name`` of them imports pkg)."""
    path = MODULES.get(package)
    if path is None or path.name != "__init__.py":
        return frozenset()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                return frozenset(ast.literal_eval(node.value))
    return frozenset()


def _floor(module: str) -> tuple[int, str]:
    """The floor of a module and the key (room) that placed it there: the longest matching prefix."""
    best = ""
    for key in FLOORS:
        if (module == key or module.startswith(key + ".")) and len(key) > len(best):
            best = key
    assert best, f"{module} is on no floor: add it to FLOORS in tests/test_layers.py"
    return FLOORS[best], best


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path) -> Iterator[tuple[str, int, str]]:
    """(imported module, line, how) for every fitcheck import, lazy and importlib strings included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            if not target.startswith("fitcheck"):
                continue
            surface = _surface(target)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                as_module = sub in MODULES and alias.name not in surface
                yield (sub if as_module else target), node.lineno, "from"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fitcheck"):
                    yield alias.name, node.lineno, "import"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text.startswith("fitcheck.") and " " not in text and text.split(":")[0] in MODULES:
                yield text.split(":")[0], node.lineno, "string"


EDGES = [(m, t, line, how) for m, p in MODULES.items() for t, line, how in _imports(m, p) if t != m]


def test_every_module_is_on_a_floor() -> None:
    for module in MODULES:
        _floor(module)


def test_no_import_runs_up_a_floor() -> None:
    up = []
    for src, dst, line, how in EDGES:
        if dst not in MODULES:
            continue
        (fs, _), (fd, room) = _floor(src), _floor(dst)
        if fd > fs:
            up.append(f"{src}:{line} ({how}) imports {dst} (floor {room})")
    assert not up, "imports that run up a floor:\n" + "\n".join(up)


def test_outside_a_room_only_its_surface_is_imported() -> None:
    bad = []
    for src, dst, line, how in EDGES:
        if how == "string" or dst not in MODULES:
            continue
        _, room = _floor(dst)
        if room not in ROOMS or dst == room:
            continue
        _, src_room = _floor(src)
        if src_room == room or src_room.startswith(room + "."):
            continue
        bad.append(f"{src}:{line} imports {dst}; import from {room} instead")
    assert not bad, "\n".join(bad)


def test_no_import_circle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for src, dst, _, _ in EDGES:
        if dst in MODULES:
            graph[src].add(dst)
    # A package's __init__ re-exporting its own modules is not a circle of design; skip __init__ -> own child.
    for pkg in list(graph):
        if (ROOT / pkg.replace(".", "/") / "__init__.py").exists() or pkg == "fitcheck.integrations":
            graph[pkg] = {d for d in graph[pkg] if not d.startswith(pkg + ".")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
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
                circles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_core_keeps_only_orchestration_flat() -> None:
    flat = {p.stem for p in (ROOT / "fitcheck" / "core").glob("*.py")}
    assert flat <= CORE_FLAT, f"modules flat in fitcheck/core beyond the orchestration: {sorted(flat - CORE_FLAT)}"


@pytest.mark.parametrize("room", ROOMS)
def test_every_room_declares_its_surface(room: str) -> None:
    module = importlib.import_module(room)
    assert module.__doc__ and module.__doc__.strip(), f"{room}/__init__.py has no docstring"
    surface = getattr(module, "__all__", None)
    assert isinstance(surface, list), f"{room} declares no __all__"
    for name in surface:
        assert hasattr(module, name), f"{room}.__all__ names {name!r}, which it does not offer"


def test_the_pure_floors_import_no_torch() -> None:
    heavy = ("torch", "transformers", "accelerate", "peft", "bitsandbytes", "deepspeed")
    bad = []
    for module, path in MODULES.items():
        if _floor(module)[0] > FLOORS["fitcheck.advice"]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad += [f"{module}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in heavy]
    assert not bad, "\n".join(bad)


def test_every_package_ships_in_the_wheel() -> None:
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fitcheck").rglob("__init__.py")}
    assert found | {"fitcheck.integrations"} == listed, "pyproject.toml [tool.setuptools] packages is out of date"


def test_families_stand_on_the_ground_only() -> None:
    """fitcheck.families imports only spec, errors, units (and itself): the readers fill traits from it."""
    allowed = ("fitcheck.spec", "fitcheck.errors", "fitcheck.units", "fitcheck.families")
    bad = [
        f"{src}:{line} imports {dst}"
        for src, dst, line, _ in EDGES
        if src.startswith("fitcheck.families") and dst.startswith("fitcheck") and not dst.startswith(allowed)
    ]
    assert not bad, "\n".join(bad)


def test_core_reads_traits_not_the_family_registry() -> None:
    """The core reads ``ModelShape.traits``; it never looks a family up (fitcheck.families) itself."""
    bad = [f"{src}:{line} imports {dst}" for src, dst, line, _ in EDGES
           if src.startswith("fitcheck.core") and dst.startswith("fitcheck.families")]
    assert not bad, "\n".join(bad)


# The envelope's checked cells are generated data keyed by model_type (moved out of source separately).
_CORE_NAME_EXEMPT = {"fitcheck.core.activations.envelope"}
MAX_MODEL_TYPE_LITERALS_IN_CORE = 5


def _core_trees() -> Iterator[tuple[str, ast.AST]]:
    for module, path in MODULES.items():
        if module.startswith("fitcheck.core") and module not in _CORE_NAME_EXEMPT:
            yield module, ast.parse(path.read_text(encoding="utf-8"))


def test_core_names_almost_no_model_type() -> None:
    """String literals equal to a ``model_type`` in fitcheck/core: at most 5 (the core reads traits instead)."""
    from fitcheck.families import FAMILIES

    names = set(FAMILIES) | {"gemma3", "qwen2_5_vl", "qwen2_moe", "roberta", "deepseek_v3"}
    found = [
        f"{module}:{node.lineno} {node.value!r}"
        for module, tree in _core_trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]
    assert len(found) <= MAX_MODEL_TYPE_LITERALS_IN_CORE, "model_type literals in core:\n" + "\n".join(found)


def _is_model_config(node: ast.AST) -> bool:
    """``<...>.model.config`` or ``inv.config`` / ``inventory.config`` / ``model.config``: the raw config.json."""
    if not (isinstance(node, ast.Attribute) and node.attr == "config"):
        return False
    owner = node.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "model") or (
        isinstance(owner, ast.Name) and owner.id in {"inv", "inventory", "model"}
    )


def test_core_reads_no_raw_config() -> None:
    """No ``spec.model.config`` (``[...]``, ``.get(...)`` or passed on) in fitcheck/core: the readers turn
    config.json into typed ``ModelShape`` fields and traits."""
    found = [
        f"{module}:{node.lineno}"
        for module, tree in _core_trees()
        for node in ast.walk(tree)
        if _is_model_config(node)
    ]
    assert not found, "raw config.json reads in core:\n" + "\n".join(found)
