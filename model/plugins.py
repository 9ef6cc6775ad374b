"""Plug-in variants: a variant defined outside this repository, loaded into `model.registry`.

A plug-in is a Python module that calls `model.register(Variant(...))` when imported, the same
call the built-ins make. It is found one of two ways:

* an installed package names its module in the entry-point group ``qkstudy.variants``
  (pyproject: ``[project.entry-points."qkstudy.variants"] my_variant = "my_pkg.variants"``);
  every such module is loaded before a spec is validated (`load_entry_points`);
* a study spec names it (``plugins: [gated_qk]``): a module importable from the spec's folder
  (a ``.py`` file or a package beside the spec) or installed (`load_plugin`).

Each loaded module is a `Plugin`: its module name, its distribution's version (None for a local
module), the SHA-256 of its source (the module's file, or every ``.py`` file of its package),
and the file or folder that travels to the Ray workers (``runtime_env.py_modules``). The plan
puts (module, version, source hash) in the identity of every run of a plug-in variant, so
changed plug-in code means new runs; built-in runs' identities do not change.

Loading checks the stage contract of each variant the module registers, on a tiny model
(`model.check.contract_problems`); a module that fails to import, registers nothing, reuses a
registered name or breaks the contract raises `PluginError` naming it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
import sys
import traceback
from dataclasses import dataclass
from importlib import import_module, metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from model.registry import REGISTRY

__all__ = ["ENTRY_POINT_GROUP", "Plugin", "PluginError", "load_entry_points", "load_planned", "load_plugin", "plugin_of", "py_modules"]

ENTRY_POINT_GROUP = "qkstudy.variants"


class PluginError(ValueError):
    """A plug-in that cannot be used: ``plugin`` is its module name, the message says why."""

    def __init__(self, plugin: str, why: str) -> None:
        super().__init__(f"plugin {plugin!r}: {why}")
        self.plugin, self.why = plugin, why


@dataclass(frozen=True)
class Plugin:
    """A loaded plug-in module (module docstring). ``path``: its ``.py`` file or package folder."""

    module: str
    version: str | None
    source_hash: str
    path: str
    variants: tuple[str, ...]

    def identity(self) -> dict[str, Any]:
        """What enters the identity of a run of one of its variants (no path: where it lies is not what it computes)."""
        return {"module": self.module, "version": self.version, "source_hash": self.source_hash}


_LOADED: dict[str, Plugin] = {}  # module name -> Plugin, once per process


def plugin_of(variant: str) -> Plugin | None:
    """The loaded plug-in that registered ``variant``; None for a built-in (or unknown) name."""
    return next((p for p in _LOADED.values() if variant in p.variants), None)


def source_of(module: ModuleType) -> tuple[Path, list[Path]]:
    """(what travels to the workers, the source files hashed) of a module: a package's folder
    and every ``.py`` under it, or a module's own file."""
    file = Path(module.__file__ or "")
    if not file.is_file():
        raise PluginError(module.__name__, "has no source file (a namespace package or a built-in module)")
    if file.name == "__init__.py":
        return file.parent, sorted(file.parent.rglob("*.py"))
    return file, [file]


def _source_hash(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    base = root if root.is_dir() else root.parent
    for f in files:
        h.update(f.relative_to(base).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _version(module: str) -> str | None:
    dists = metadata.packages_distributions().get(module.split(".")[0], [])
    return metadata.version(dists[0]) if dists else None


def load_plugin(module: str, search: str | Path | None = None, check: bool = True) -> Plugin:
    """Import plug-in ``module`` (from ``search``, the spec's folder, first) and check each
    variant it registers (``check=False``: not, for `qkstudy model check`, which reports every
    check itself); loading a module again returns its `Plugin`. A dotted name ships and hashes
    its whole top-level package (what the workers import it from).

    Raises:
        PluginError: the name is not a module name; a module beside the spec has the name of
            another importable module (it would shadow it here and not reach the workers);
            the module fails to import (SystemExit included), registers no variant, reuses a
            registered name, or a variant breaks the stage contract
            (`model.check.contract_problems`); its variants are removed from the registry again.
    """
    if module in _LOADED:
        return _LOADED[module]
    if not MODULE_NAME.fullmatch(module):
        raise PluginError(module, "is not a module name (name a plug-in as it is imported, e.g. my_variant or my_pkg.variants)")
    folder = Path(search).resolve() if search is not None else None
    local = _local_copy(module, folder)
    before = set(REGISTRY)
    sys.path[:0] = [str(folder)] if local else []
    try:
        import_module(module)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - any import failure of someone else's code is that plug-in's
        _forget(module, before)
        raise PluginError(module, f"failed to import: {type(e).__name__}: {e}{_where(e)}") from None
    finally:
        if local:
            sys.path.remove(str(folder))
    added = tuple(n for n in REGISTRY if n not in before)
    if not added:
        raise PluginError(module, "registered no variant (call model.register(Variant(...)) when imported)")
    # torch only here: a spec without plug-ins validates without it
    from model.check import contract_problems

    problems = [f"variant {name!r}: {p}" for name in added for p in contract_problems(name)] if check else []
    if problems:
        _forget(module, before)
        raise PluginError(module, "breaks the stage contract: " + "; ".join(problems))
    root, files = source_of(sys.modules[module.split(".")[0]])
    version = None if local else _version(module)
    _LOADED[module] = plugin = Plugin(module, version, _source_hash(root, files), str(root), added)
    return plugin


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _local_copy(module: str, folder: Path | None) -> Path | None:
    """The file or package of ``module``'s top-level name in ``folder`` (the spec's), or None.

    Raises PluginError when that name is also another importable module (installed, or already
    imported): the local one would shadow it in this process, and the workers, which import
    by name, would get the other one."""
    top = module.split(".")[0]
    if folder is None:
        return None
    local = next((p for p in (folder / f"{top}.py", folder / top) if p.exists()), None)
    if local is None:
        return None
    loaded = sys.modules.get(top)
    if loaded is not None:
        origin = getattr(loaded, "__file__", None)
    else:
        spec = importlib.util.find_spec(top)
        origin = spec.origin if spec is not None and spec.origin not in ("built-in", "frozen") else None
    found = Path(origin) if origin else None
    if found is not None and not found.resolve().is_relative_to(local.resolve()) and not _same_source(local, found):
        raise PluginError(module, f"{local} has the name of another importable module ({found}): rename the plug-in")
    return local


def _same_source(local: Path, found: Path) -> bool:
    """Whether the importable module at ``found`` is a copy of ``local`` (same source hash):
    inside a submitted job the spec's folder and the job's ``py_modules`` hold the same plug-in."""
    other = found.parent if found.name == "__init__.py" else found
    if local.is_dir() != other.is_dir():
        return False
    return _source_hash(local, _py_files(local)) == _source_hash(other, _py_files(other))


def _py_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py")) if root.is_dir() else [root]


def _where(e: BaseException) -> str:
    """`` (FILE, line N)`` of the innermost frame of an import error that lies outside this
    process's own packages (the plug-in's line), or '' when none."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "importlib" not in f.filename and f.filename != __file__]
    return f" ({frames[-1].filename}, line {frames[-1].lineno})" if frames else ""


def _forget(module: str, before: set[str]) -> None:
    """Undo a failed load: its variants leave the registry, its module the import cache (so a
    fixed module can be loaded again in this process)."""
    for name in set(REGISTRY) - before:
        del REGISTRY[name]
    sys.modules.pop(module, None)


def load_entry_points() -> list[Plugin]:
    """Load every module named in the ``qkstudy.variants`` entry-point group (each once per
    process: `load_plugin` keeps what it loaded).

    Raises PluginError naming the entry point's module and the distribution that installed it
    (see `load_plugin`)."""
    loaded = []
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            loaded.append(load_plugin(ep.module))
        except PluginError as e:
            dist = f"distribution {ep.dist.name!r}" if ep.dist is not None else "an installed distribution"
            raise PluginError(ep.module, f"installed by {dist} (entry point {ep.name!r} in {ENTRY_POINT_GROUP}): {e.why}") from None
    return loaded


def load_planned(planned: dict[str, Any]) -> Plugin:
    """Load the plug-in a run was planned with (`RunSpec.plugin`: module, version,
    source_hash) where the run trains; PluginError if it fails to load or its source is not
    the planned one (the code that trains must be the code the run id names)."""
    plugin = load_plugin(planned["module"])
    if plugin.source_hash != planned["source_hash"]:
        raise PluginError(
            plugin.module,
            f"its source here ({plugin.path}, sha256 {plugin.source_hash[:12]}) is not the one the run was planned with "
            f"(sha256 {planned['source_hash'][:12]}): replan, or ship the planned code",
        )
    return plugin


def py_modules(planned: list[dict[str, Any] | None]) -> list[str]:
    """The files and folders of the local plug-ins (no installed version) among runs' `RunSpec.plugin`
    entries: what Ray's ``runtime_env.py_modules`` ships to the workers. Installed ones are
    expected in the workers' environment (the image)."""
    return sorted({p["path"] for p in planned if p is not None and p.get("version") is None})
