"""TRL's config dataclasses read from the installed source with ``ast``: fields, defaults, what their checks read.

Importing ``trl`` imports transformers and torch: ``import trl.trainer.base_config`` took ~10 CPU-s cold on this
2-core machine (``python -X importtime``; session 18), the whole cost of a ``--trainer sft --no_trace`` answer.
What a TRL run's settings check needs from its config class (``torch_adapters.trl_config_check``) is in the
class's source: its fields (``@dataclass`` annotations, the class and its bases), their literal defaults and which
fields the value checks of its ``__post_init__`` read. The installed files stay the final word: nothing here is a
copy of TRL's tables; the parse is redone when a file's size or mtime changes.

How a class is found, all from the installed source and without executing it: the package's ``__init__.py``
``_import_structure`` dict (trl and transformers build their lazy modules from it: ``trl/__init__.py`` ->
``"trainer"``, ``trl/trainer/__init__.py`` -> ``"sft_config": ["SFTConfig"]``), then the class's bases through the
module's ``from ... import`` lines (``sft_config.py``: ``from .base_config import _BaseConfig``;
``base_config.py``: ``from transformers import TrainingArguments``). Anything else (a base from another place, a
file that does not parse) answers None, and the caller imports trl.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import ast
    from collections.abc import Iterable

_TREES: dict[tuple[str, int, int], ast.Module] = {}


class ConfigSource(NamedTuple):
    """One config dataclass as its source declares it (its bases' fields first, as ``dataclasses.fields``).

    Attributes:
        fields: Field name -> annotation text (``ast.unparse``), every field of the class and its bases.
        defaults: Field name -> default, for the fields whose default (``= v``, ``field(default=v)``) or
            ``default_factory`` (``lambda: v``, ``list``, ``dict``) is a literal.
        checks_read: Every attribute of ``self`` that the ``__post_init__`` of the class and of its bases in the same
            package read (a field the run leaves at its default cannot change what they raise); None when a
            ``__post_init__`` calls a method of ``self`` or passes ``self`` on. The ``__post_init__`` of a base from
            another package (``TrainingArguments``) is not read: its fields' checks are the plain Trainer's.
        outside: (package, class) of a base from another package, whose fields are not in ``fields`` (read by
            :func:`read_config_fields` only when asked for a name the package's own classes do not declare).
    """

    fields: dict[str, str]
    defaults: dict[str, object]
    checks_read: frozenset[str] | None
    outside: tuple[str, str] | None = None


def _tree(path: str) -> ast.Module:
    """The parsed file, kept per (path, size, mtime_ns) for this process."""
    import ast

    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _TREES:
        with open(path, encoding="utf-8") as f:
            _TREES[key] = ast.parse(f.read(), path)
    return _TREES[key]


def _locate(package: str, name: str) -> str | None:
    """The file of the module that defines ``name``, from ``package``'s ``_import_structure`` (None: not found)."""
    import ast

    spec = importlib.util.find_spec(package)  # a top-level package: found without importing it
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = spec.submodule_search_locations[0]
    for _ in range(4):  # trl -> trl.trainer -> sft_config.py
        init = os.path.join(directory, "__init__.py")
        found = None
        for node in _tree(init).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_import_structure"
                                                    for t in node.targets) and isinstance(node.value, ast.Dict):
                for key, value in zip(node.value.keys, node.value.values, strict=True):
                    if isinstance(key, ast.Constant) and isinstance(value, ast.List | ast.Tuple) and any(
                            isinstance(e, ast.Constant) and e.value == name for e in value.elts):
                        found = str(key.value)
        if found is None:
            return None
        path = os.path.join(directory, *found.split("."))
        if os.path.isfile(path + ".py"):
            return path + ".py"
        directory = path
    return None


def read_config_class(package: str, name: str) -> ConfigSource | None:
    """``package.name`` (a ``@dataclass``: ``trl``'s ``SFTConfig``, ...) read from its installed source.

    Returns:
        The class's fields, literal defaults and what its ``__post_init__`` checks read; None when the package is
        not installed or its source cannot be read this way (the caller then imports it).
    """
    try:
        path = _locate(package, name)
        return None if path is None else _read(package, path, name)
    except (OSError, SyntaxError, ValueError):
        return None


def read_config_fields(package: str, name: str, keys: Iterable[str]) -> dict[str, str] | None:
    """The annotation text of each of ``keys`` that is a field of ``package.name`` (absent: not a field).

    A base from another package (``TrainingArguments``) is read only for a key the package's own classes do not
    declare. None: the source cannot be read this way (the caller imports the class).
    """
    own = read_config_class(package, name)
    if own is None:
        return None
    wanted = set(keys)
    out = {k: own.fields[k] for k in wanted if k in own.fields}
    if len(out) < len(wanted) and own.outside is not None:
        base = read_config_class(*own.outside)
        if base is None or base.outside is not None:
            return None
        out.update({k: base.fields[k] for k in wanted - out.keys() if k in base.fields})
    return out


def _read(package: str, path: str, name: str) -> ConfigSource | None:
    import ast

    module = _tree(path)
    node = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        return None
    fields: dict[str, str] = {}
    defaults: dict[str, object] = {}
    reads: frozenset[str] | None = frozenset()
    outside: tuple[str, str] | None = None
    for base in node.bases:
        inherited = _base(package, path, module, base)
        if inherited is None:
            return None
        fields.update(inherited.fields)
        for key in inherited.fields:
            defaults.pop(key, None)
        defaults.update(inherited.defaults)
        reads = None if reads is None or inherited.checks_read is None else reads | inherited.checks_read
        if inherited.outside is not None:
            if outside is not None:
                return None
            outside = inherited.outside
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if "ClassVar" in annotation:
                continue
            fields[stmt.target.id] = annotation
            defaults.pop(stmt.target.id, None)
            default = _default(stmt.value)
            if default is not _NONE:
                defaults[stmt.target.id] = default
    post_init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__post_init__"), None)
    if post_init is not None:
        own = _checks_read(post_init)
        reads = None if reads is None or own is None else reads | own
    return ConfigSource(fields, defaults, reads, outside)


def _base(package: str, path: str, module: ast.Module, base: ast.expr) -> ConfigSource | None:
    """A base class: in the same module, a relative import of the same package, or another package's class
    (not read here: ``outside``)."""
    import ast

    if not isinstance(base, ast.Name):
        return None
    if any(isinstance(n, ast.ClassDef) and n.name == base.id for n in module.body):
        return _read(package, path, base.id)
    for stmt in module.body:
        if isinstance(stmt, ast.ImportFrom) and any((a.asname or a.name) == base.id for a in stmt.names):
            if base.id != next(a.name for a in stmt.names if (a.asname or a.name) == base.id):
                return None
            if stmt.level == 1 and stmt.module:
                return _read(package, os.path.join(os.path.dirname(path), *stmt.module.split(".")) + ".py", base.id)
            if stmt.level == 0 and stmt.module and "." not in stmt.module and stmt.module != package:
                return ConfigSource({}, {}, frozenset(), (stmt.module, base.id))
    return None


class _Missing:
    pass


_NONE = _Missing()


def _default(value: ast.expr | None) -> object:
    """A field's literal default, or what its ``default_factory`` (``lambda: <literal>``, ``list``, ``dict``) returns
    (``_NONE``: no default, or not a literal)."""
    import ast

    if value is None:
        return _NONE
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        keywords = {k.arg: k.value for k in value.keywords}
        factory = keywords.get("default_factory")
        if isinstance(factory, ast.Lambda) and not factory.args.args:  # field(default_factory=lambda: ["sigmoid"])
            keywords["default"] = factory.body
        elif isinstance(factory, ast.Name) and factory.id in ("list", "dict"):
            return [] if factory.id == "list" else {}
        if "default" not in keywords:
            return _NONE
        value = keywords["default"]
    try:
        return ast.literal_eval(value)
    except ValueError:
        return _NONE


def _checks_read(function: ast.FunctionDef) -> frozenset[str] | None:
    """Every ``self`` attribute ``function`` reads (None: it calls a method of ``self`` or passes ``self`` on).

    Any expression of a ``__post_init__`` can raise (a ``raise`` under an ``if``, ``int(...)``, ``%`` by zero), so a
    field it never reads cannot change whether it raises. A property (``self.device``, ``self.world_size``) counts
    as its own name, not as the fields behind it.
    """
    import ast

    out: set[str] = set()
    selves = 0
    for n in ast.walk(function):
        if isinstance(n, ast.Name) and n.id == "self":
            selves += 1
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
            selves -= 1
            if isinstance(n.ctx, ast.Load):
                out.add(n.attr)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Attribute):
            out.add(n.target.attr)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == "self":
            return None
    return None if selves else frozenset(out)
