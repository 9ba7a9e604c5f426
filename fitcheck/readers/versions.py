"""Which library versions the estimate is for: installed ones (read from package metadata) or ``--stack``.

The installed version is read from the name of the distribution's ``NAME-VERSION.dist-info`` folder on
``sys.path`` (the wheel and PEP 376 layout that ``importlib.metadata`` itself searches); only where no such
folder is found does ``importlib.metadata.version`` parse METADATA. Nothing is imported, so this stays fast (no
``importlib.metadata``/``email`` import: about 0.05 s of CPU in a fresh process on the CI machine) and works
without torch. ``--stack transformers=4.46,peft=0.13`` describes another environment
instead (a cluster, an older container). The result is plain data (:class:`fitcheck.spec.StackSpec`) that the
core reads (``fitcheck.core.activations.versions``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Mapping

from fitcheck.errors import ConfigError, short_repr
from fitcheck.spec import MODELLED_VERSIONS, StackSpec

# Distribution names whose version changes what a training step allocates.
PACKAGES: tuple[str, ...] = tuple(MODELLED_VERSIONS)
_VERSION = re.compile(r"^\d{1,6}(\.\d{1,6}){0,3}([.+-]?[0-9A-Za-z.+-]{0,40})?$")
# The longest --stack value read (characters): a few packages with their versions; a longer one is refused
# before it is split or matched.
MAX_STACK_CHARS = 1000


def _normal(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()


def _dist_info_versions(names: tuple[str, ...], paths: list[str]) -> dict[str, tuple[str | None, bool]]:
    """For each of ``names``: the version in the first ``NAME-VERSION.dist-info`` folder on ``paths``, as
    ``importlib.metadata`` finds it (first on the path wins; names compare with ``-``/``.`` as ``_``, any case);
    and whether some other layout (``.egg-info``, ``.egg``) names it before that, which only METADATA can tell.

    Each path entry is listed once for all the names (a site-packages folder holds hundreds of entries: listing it
    and normalising every entry once per package cost ~10 ms of CPU per answer for the seven packages).
    """
    wanted = {_normal(name): name for name in names}
    found: dict[str, tuple[str | None, bool]] = {}
    other: dict[str, bool] = dict.fromkeys(wanted, False)
    for entry in paths:
        if len(found) == len(wanted):
            break
        try:
            folders = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in folders:
            stem, dot, kind = folder.rpartition(".")
            if not dot or kind not in ("dist-info", "egg-info", "egg"):
                continue
            dist, _, version = stem.partition("-")
            want = _normal(dist)
            if want not in wanted or want in found:
                continue
            if kind == "dist-info" and version:
                found[want] = (version, other[want])
            else:
                other[want] = True
    return {name: found.get(want, (None, other[want])) for want, name in wanted.items()}


def _dist_info_version(name: str, paths: list[str]) -> tuple[str | None, bool]:
    """:func:`_dist_info_versions` of one name."""
    return _dist_info_versions((name,), paths)[name]


def _metadata_version(name: str, scanned: Mapping[str, tuple[str | None, bool]] | None = None) -> str | None:
    found, other = scanned[name] if scanned is not None and name in scanned else _dist_info_version(name, sys.path)
    if found is not None or not other:
        return found
    from importlib import metadata  # an egg-info or other layout: let importlib.metadata parse it

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def installed_stack(version_of: Callable[[str], str | None] | None = None) -> StackSpec:
    """The installed versions of :data:`PACKAGES` (absent packages are left out).

    Args:
        version_of: Package name -> version or None (default: ``importlib.metadata.version``).

    Returns:
        A ``StackSpec`` with ``source="installed"``.
    """
    if version_of is None:  # sys.path listed once for every package
        scanned = _dist_info_versions(PACKAGES, sys.path)
        found = ((name, _metadata_version(name, scanned)) for name in PACKAGES)
    else:
        found = ((name, version_of(name)) for name in PACKAGES)
    return StackSpec(versions=tuple((n, v) for n, v in found if v is not None), source="installed")


def parse_stack(text: str, *, where: str = "--stack") -> StackSpec:
    """Read ``NAME=VERSION,NAME=VERSION`` (e.g. ``transformers=4.46,peft=0.13``).

    Packages not named keep no version (the report says the modelled one is assumed for them).

    Raises:
        ConfigError: An entry is not ``NAME=VERSION``, names a package fitcheck does not know, or repeats one.
    """
    versions: dict[str, str] = {}
    text = str(text)
    if len(text) > MAX_STACK_CHARS:
        raise ConfigError(
            f"{where}: {len(text):,} characters is too long for NAME=VERSION pairs; "
            "e.g. --stack transformers=4.46,peft=0.13"
        )
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, version = item.partition("=")
        name, version = name.strip().lower(), version.strip()
        if not sep or not name or not version:
            raise ConfigError(
                f"{where}: {short_repr(item)} is not NAME=VERSION; e.g. --stack transformers=4.46,peft=0.13"
            )
        if name not in PACKAGES:
            raise ConfigError(f"{where}: unknown package {short_repr(name)}; known: {', '.join(PACKAGES)}")
        if name in versions:
            raise ConfigError(f"{where}: {name} is given twice")
        if not _VERSION.match(version):
            raise ConfigError(
                f"{where}: {name}={short_repr(version)} is not a version number (e.g. 4.46 or 4.46.3)"
            )
        versions[name] = version
    if not versions:
        raise ConfigError(f"{where}: empty; e.g. --stack transformers=4.46,peft=0.13")
    return StackSpec(versions=tuple(versions.items()), source="--stack")


def stack_from_values(
    values: Mapping[str, object], where: str, installed: Callable[[], StackSpec] = installed_stack
) -> StackSpec:
    """``--stack`` when given, else the installed versions.

    Args:
        values: Canonical flag values; ``stack`` is read.
        where: Where ``stack`` came from, for error messages.
        installed: Reads the installed versions (a parameter so tests can pin an environment).
    """
    raw = values.get("stack")
    if raw is None:
        return installed()
    if isinstance(raw, Mapping):
        raw = ",".join(f"{k}={v}" for k, v in raw.items())
    return parse_stack(str(raw), where=where)
