"""The package's floors and walls, held by walking every module's imports with ``ast``.

Floors, lowest first; an import (module level, inside a function, ``TYPE_CHECKING`` or an ``importlib``
string) may only go down or stay on its floor:

ground (spec, report, findings, errors, units) < catalog, families < core < readers < advice < torch_adapters < render
< integrations < cli < the package facade (``fitcheck/__init__.py``, ``fitcheck/run.py``).

Inside ``core`` the rooms are ordered too: optimizers, kernels < states < activations < the orchestration modules.
A module outside a room imports only the room's surface (its ``__init__``), and the surface lists what it
offers in ``__all__``. No import circle, lazy imports included; an import of a surface name counts as an import of
the module that defines it (so a circle through two rooms' surfaces on one floor is seen). No module imports a
private name (``_x``) of another; every ``importlib`` call names what it imports (an f-string with a literal
``fitcheck.`` prefix is resolved to every module under it). ``benchmarks/`` import only surfaces, no private names.
Each rule is also run on a synthetic tree that breaks it (the tests at the end).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

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
    "fitcheck.core.caching": 2,  # the CUDA caching allocator replayed: events in, statistics out
    "fitcheck.core.kernels": 2,  # fused kernels and memory levers (Liger, CCE, offloading): spec-only inputs
    "fitcheck.core.states": 3,
    "fitcheck.core.activations": 4,
    "fitcheck.core.parallelism": 4,
    "fitcheck.core.loading": 4,  # from_pretrained and preparation replayed through the caching allocator
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

# Private-name imports kept until the model-families work (issue 18) rewrites these modules; the list may only
# shrink (an entry that no longer exists fails too). module -> names it imports privately.
PRIVATE_IMPORTS_PENDING: dict[str, frozenset[str]] = {
    "fitcheck.core.activations.decoder": frozenset({
        "_ATTN_LINEARS", "_TRACE", "_attn_impl",
        "_mla_attention_moment", "_mla_outside", "_norm_saved", "_outside_saved",
    }),
}

# The orchestration modules that stay flat in fitcheck/core/.
CORE_FLAT = {"__init__", "estimator", "step", "allocator", "overheads", "compute"}


class Edge(NamedTuple):
    """One fitcheck import: who imports what, where, how, and the module that defines the imported name."""

    src: str
    dst: str  # the module imported (a room's surface when the name is in its __all__)
    line: int
    how: str  # "from", "import", "string", "dynamic" (an importlib call built at run time)
    name: str  # the name imported ("" for ``import x`` and strings)
    defining: str  # the module that defines ``name``: a surface import followed to its source


def module_files(root: Path) -> dict[str, Path]:
    """Every package module under ``root`` (``fitcheck/`` and the shipped ``integrations/``) by dotted name."""
    found = {}
    for path in sorted((root / "fitcheck").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in sorted((root / "integrations").glob("*.py")):
        found["fitcheck.integrations" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return found


MODULES = module_files(ROOT)


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _surface(package: str, modules: dict[str, Path] | None = None) -> frozenset[str]:
    """Names in a package's ``__all__``, read statically (an ``from pkg import name`` of them imports pkg)."""
    path = (MODULES if modules is None else modules).get(package)
    if path is None or path.name != "__init__.py":
        return frozenset()
    for node in ast.walk(_parse(path)):
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


def defining_module(package: str, name: str, modules: dict[str, Path], seen: frozenset[str] = frozenset()) -> str:
    """The module that defines ``name`` offered by ``package``: its ``__init__`` re-export followed to the source.

    Re-exports inside ``TYPE_CHECKING`` (the lazy PEP 562 surfaces) count: they name the module the
    ``__getattr__`` imports. A name the ``__init__`` defines itself, or cannot be followed, stays ``package``.
    """
    path = modules.get(package)
    if path is None or path.name != "__init__.py" or package in seen:
        return package
    for node in ast.walk(_parse(path)):
        if not isinstance(node, ast.ImportFrom):
            continue
        for alias in node.names:
            if (alias.asname or alias.name) != name:
                continue
            target = _resolve(package, path, node)
            if f"{target}.{alias.name}" in modules:
                return f"{target}.{alias.name}"
            return defining_module(target, alias.name, modules, seen | {package}) if target in modules else target
    return package


_IMPORT_CALLS = {"import_module", "__import__"}


def _static_prefix(arg: ast.expr) -> str:
    """The text an importlib argument starts with that is known without running it ("" when none)."""
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr):
        head = ""
        for part in arg.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                break
            head += part.value
        return head
    if isinstance(arg, ast.BinOp) and isinstance(arg.op, ast.Add):
        return _static_prefix(arg.left)
    return ""


def dynamic_imports(path: Path, modules: dict[str, Path]) -> Iterator[tuple[int, list[str] | None]]:
    """(line, the fitcheck modules it can import) for every importlib call whose name is built at run time.

    An f-string or concatenation that starts with a fitcheck package is resolved to every module under that
    prefix (all it could import); a name with no static fitcheck prefix and no known outside package is None.
    """
    for node in ast.walk(_parse(path)):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        arg = node.args[0]
        if called not in _IMPORT_CALLS or (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            continue
        prefix = _static_prefix(arg)
        if prefix.startswith("fitcheck"):
            found = [m for m in modules if m.startswith(prefix) and m != prefix.rstrip(".")]
            yield node.lineno, found or None
        elif "." in prefix and not prefix.startswith("."):
            continue  # an outside package, named up to its module (bitsandbytes.{x}): not fitcheck
        else:
            yield node.lineno, None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> Iterator[Edge]:
    """Every fitcheck import of one module: module level, lazy, ``TYPE_CHECKING``, importlib strings and calls."""
    for node in ast.walk(_parse(path)):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(module, path, node)
            if not target.startswith("fitcheck"):
                continue
            surface = _surface(target, modules)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules and alias.name not in surface:
                    yield Edge(module, sub, node.lineno, "from", alias.name, sub)
                else:
                    defining = defining_module(target, alias.name, modules) if alias.name in surface else target
                    yield Edge(module, target, node.lineno, "from", alias.name, defining)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("fitcheck"):
                    yield Edge(module, alias.name, node.lineno, "import", "", alias.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.split(":")[0]
            if node.value.startswith("fitcheck.") and " " not in node.value and text in modules:
                yield Edge(module, text, node.lineno, "string", "", text)
    for line, targets in dynamic_imports(path, modules):
        for target in targets or ():
            yield Edge(module, target, line, "dynamic", "", target)


def all_edges(modules: dict[str, Path]) -> list[Edge]:
    """Every fitcheck import between two different modules of ``modules``."""
    return [e for m, p in modules.items() for e in imports_of(m, p, modules) if e.dst != m]


EDGES = all_edges(MODULES)


def import_circles(modules: dict[str, Path], edges: list[Edge]) -> list[list[str]]:
    """The import circles (strongly connected components > 1), surface imports followed to the defining module.

    A package's ``__init__`` importing its own modules is not a circle of design: those edges are left out. An
    import of a name from a room's surface counts as an import of the module that defines it, so a circle that
    runs through two rooms' surfaces is seen.
    """
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for e in edges:
        for dst in {e.dst, e.defining}:
            if dst in modules and dst != e.src:
                graph[e.src].add(dst)
    for pkg in list(graph):
        if modules[pkg].name == "__init__.py":
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
        for w in sorted(graph[v]):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def private_imports(edges: list[Edge]) -> list[str]:
    """Imports of a private name (``_x``) from another module: a name another module needs is public."""
    return [f"{e.src}:{e.line} imports {e.name} from {e.dst}" for e in edges
            if e.how == "from" and e.name.startswith("_") and not e.name.startswith("__")]


def unresolved_dynamic_imports(modules: dict[str, Path]) -> list[str]:
    """importlib calls whose module name cannot be read statically (the walls cannot see what they import)."""
    return [f"{m}:{line} calls importlib with a name built at run time; import a literal name (or a literal "
            "fitcheck package prefix in the f-string)" for m, p in modules.items()
            for line, targets in dynamic_imports(p, modules) if targets is None]


def benchmark_violations(root: Path, modules: dict[str, Path]) -> list[str]:
    """Imports in ``benchmarks/`` past a room's surface or of a private name: benchmarks use the public API."""
    bad = []
    for path in sorted((root / "benchmarks").glob("*.py")):
        module = f"benchmarks.{path.stem}"
        for e in imports_of(module, path, modules):
            if e.name.startswith("_") and not e.name.startswith("__"):
                bad.append(f"{path.name}:{e.line} imports the private name {e.name} from {e.dst}")
                continue
            if e.dst not in modules or e.how == "string":  # a string names an entry point (``-m fitcheck.cli.main``)
                continue
            _, room = _floor(e.dst)
            if (room in ROOMS or room == "fitcheck.integrations") and e.dst != room:
                bad.append(f"{path.name}:{e.line} imports {e.name or e.dst} from {e.dst}; import it from {room}")
    return bad


def test_every_module_is_on_a_floor() -> None:
    for module in MODULES:
        _floor(module)


def test_no_import_runs_up_a_floor() -> None:
    up = []
    for src, dst, line, how, _, _ in EDGES:
        if dst not in MODULES:
            continue
        (fs, _), (fd, room) = _floor(src), _floor(dst)
        if fd > fs:
            up.append(f"{src}:{line} ({how}) imports {dst} (floor {room})")
    assert not up, "imports that run up a floor:\n" + "\n".join(up)


def test_outside_a_room_only_its_surface_is_imported() -> None:
    bad = []
    for src, dst, line, how, _, _ in EDGES:
        if how in ("string", "dynamic") or dst not in MODULES:
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
    circles = import_circles(MODULES, EDGES)
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


def test_no_private_name_is_imported_from_another_module() -> None:
    found = private_imports(EDGES)
    pending = {f"{m}:{n}" for m, names in PRIVATE_IMPORTS_PENDING.items() for n in names}
    seen = {f"{line.split(':')[0]}:{line.split(' imports ')[1].split(' from ')[0]}" for line in found}
    bad = [line for line in found if f"{line.split(':')[0]}:{line.split(' imports ')[1].split(' from ')[0]}"
           not in pending]
    assert not bad, "private names imported from another module (make them public):\n" + "\n".join(bad)
    assert pending <= seen, f"PRIVATE_IMPORTS_PENDING lists imports that are gone: {sorted(pending - seen)}"


def test_every_importlib_call_names_what_it_imports() -> None:
    bad = unresolved_dynamic_imports(MODULES)
    assert not bad, "\n".join(bad)


def test_benchmarks_import_only_public_surfaces() -> None:
    bad = benchmark_violations(ROOT, MODULES)
    assert not bad, "benchmarks reaching past a surface or importing private names:\n" + "\n".join(bad)


# The rules catch what they are for: each is run on a small synthetic tree that breaks it.


def _tree(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for rel, text in {"fitcheck/__init__.py": "", "fitcheck/core/__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return module_files(root)


_TWO_ROOMS = {
    "fitcheck/core/activations/__init__.py": '"""a."""\nfrom fitcheck.core.activations.a import f\n__all__ = ["f"]\n',
    "fitcheck/core/activations/a.py": "from fitcheck.core.parallelism import g\n\ndef f():\n    return g\n",
    "fitcheck/core/parallelism/__init__.py": '"""p."""\nfrom fitcheck.core.parallelism.b import g\n__all__ = ["g"]\n',
    "fitcheck/core/parallelism/b.py": "from fitcheck.core.activations import f\n\ndef g():\n    return f\n",
}


def test_a_circle_through_two_surfaces_on_one_floor_is_seen(tmp_path: Path) -> None:
    modules = _tree(tmp_path, _TWO_ROOMS)
    edges = all_edges(modules)
    assert import_circles(modules, edges) == [["fitcheck.core.activations.a", "fitcheck.core.parallelism.b"]]
    # without following the surfaces (the old check) the two modules only import __init__s: no circle
    shallow = [e._replace(defining=e.dst) for e in edges]
    assert import_circles(modules, shallow) == []


def test_an_importlib_call_built_at_run_time_is_resolved_or_refused(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        **_TWO_ROOMS,
        "fitcheck/core/parallelism/b.py": "import importlib\n\ndef g(x):\n"
        "    return importlib.import_module(f'fitcheck.core.activations.{x}')\n",
        "fitcheck/core/optimizers/__init__.py": '"""o."""\n__all__ = []\n',
        "fitcheck/core/optimizers/c.py": "import importlib\n\ndef h(name):\n    return importlib.import_module(name)\n",
        "fitcheck/core/optimizers/d.py": "import importlib\n\ndef k(x):\n"
        "    return importlib.import_module(f'bitsandbytes.{x}')\n",
    })
    edges = all_edges(modules)
    dynamic = {(e.src, e.dst) for e in edges if e.how == "dynamic"}
    assert ("fitcheck.core.parallelism.b", "fitcheck.core.activations.a") in dynamic
    assert import_circles(modules, edges)  # the f-string import closes the circle a -> b -> a
    assert unresolved_dynamic_imports(modules) == [
        "fitcheck.core.optimizers.c:4 calls importlib with a name built at run time; import a literal name (or a "
        "literal fitcheck package prefix in the f-string)"
    ]


def test_a_private_name_imported_from_another_module_is_caught(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        **_TWO_ROOMS,
        "fitcheck/core/activations/a.py": "def _helper():\n    return 1\n\ndef f():\n    return 2\n",
        "fitcheck/core/parallelism/b.py": "from fitcheck.core.activations.a import _helper\n",
    })
    assert private_imports(all_edges(modules)) == [
        "fitcheck.core.parallelism.b:1 imports _helper from fitcheck.core.activations.a"
    ]


def test_a_benchmark_past_a_surface_or_importing_a_private_name_is_caught(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        **_TWO_ROOMS,
        "benchmarks/ok.py": "from fitcheck.core.activations import f\n",
        "benchmarks/deep.py": "from fitcheck.core.activations.a import f\n",
        "benchmarks/private.py": "from fitcheck.core.activations import _f\n",
    })
    assert benchmark_violations(tmp_path, modules) == [
        "deep.py:1 imports f from fitcheck.core.activations.a; import it from fitcheck.core.activations",
        "private.py:1 imports the private name _f from fitcheck.core.activations",
    ]


def test_families_stand_on_the_ground_only() -> None:
    """fitcheck.families imports only spec, errors, units (and itself): the readers fill traits from it."""
    allowed = ("fitcheck.spec", "fitcheck.errors", "fitcheck.units", "fitcheck.families")
    bad = [
        f"{e.src}:{e.line} imports {e.dst}"
        for e in EDGES
        if e.src.startswith("fitcheck.families") and e.dst.startswith("fitcheck") and not e.dst.startswith(allowed)
    ]
    assert not bad, "\n".join(bad)


def test_core_reads_traits_not_the_family_registry() -> None:
    """The core reads ``ModelShape.traits``; it never looks a family up (fitcheck.families) itself."""
    bad = [f"{e.src}:{e.line} imports {e.dst}" for e in EDGES
           if e.src.startswith("fitcheck.core") and e.dst.startswith("fitcheck.families")]
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
