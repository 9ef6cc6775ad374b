"""What ``qkstudy submit`` sends to the cluster: an allow-list, staged, checked and listed.

Ray zips the job's ``working_dir`` into the cluster's object store, readable by anyone holding
the cluster's token, and onto every node. So nothing is uploaded by walking a folder: the job's
working dir holds exactly ``upload_plan``'s files (the code packages this process imports, the
spec and the bases of its ``extends`` chain, the spec's local plug-ins), each at its path
relative to the submitting folder, so the chain resolves there as it did here. ``check_upload``
refuses a selected file named like a credential (a base or plug-in path can point at one) and
an upload over ``UPLOAD_MAX_BYTES``; ``staged`` copies the files into the temporary folder Ray
zips; ``upload_files`` lists what Ray will package, walked with Ray's own traversal.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from model.plugins import load_plugin
from orchestrator.plan.spec import SpecError, Study
from orchestrator.plan.specfile import EXTENDS, read_layers
from orchestrator.track.provenance import CODE_ROOT

# The packages the job's `python -m orchestrator.cli run` imports (pyproject's packages.find):
# the only code uploaded. Installed metadata (the version) comes from the cluster's image.
CODE_PACKAGES = ("orchestrator", "model", "data_pipeline")
# Skipped inside an uploaded package or plug-in folder (gitignore syntax): bytecode, build residue.
EXCLUDES = ["**/__pycache__/", "*.pyc", "*.egg-info/", ".pytest_cache/", ".git/"]
# The most an upload may hold: code and specs are a few MB; more means data came along. Ray
# stores the package in the cluster's object store, readable by any holder of the cluster's token.
UPLOAD_MAX_BYTES = 50 * 2**20
# File names that hold credentials (fnmatch, lower-case): never uploaded, whatever selected them.
SECRET_NAMES = (
    ".env",
    "*.env",
    ".env.*",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    ".netrc",
    "_netrc",
    ".pgpass",
    ".git-credentials",
    "credentials*.json",
)
SECRET_DIRS = (".aws", ".ssh", ".gnupg", ".kube")  # anything below one of these folders
NOT_SECRET = ("*.example", "*.sample", "*.template")  # templates such as .env.example


class UploadError(SpecError):
    """A file selected for upload that must not leave this machine (its name looks like a
    credential), or an upload over ``UPLOAD_MAX_BYTES``. A SpecError: the CLI exits with code 2
    before anything is sent."""


def secret_pattern(path: str) -> str | None:
    """The ``SECRET_NAMES`` / ``SECRET_DIRS`` pattern that ``path`` (a path in the upload, or a
    local one) matches, case-insensitively, else None. ``*.example``-style templates
    (``.env.example``) are not secrets."""
    parts = [p.lower() for p in Path(path).parts]
    name = parts[-1] if parts else ""
    if any(fnmatch.fnmatchcase(name, p) for p in NOT_SECRET):
        return None
    if hit := next((p for p in SECRET_NAMES if fnmatch.fnmatchcase(name, p)), None):
        return hit
    if hit := next((d for d in SECRET_DIRS if d in parts[:-1]), None):
        return f"{hit}/"
    if parts[-2:] == [".docker", "config.json"]:
        return ".docker/config.json"
    return None


def _walk(root: Path, excludes: Sequence[str] = ()) -> list[Path]:
    """Every file under ``root`` (or ``root`` itself, a file) that Ray's packaging traversal
    keeps: the ``excludes`` patterns, then each folder's ``.gitignore`` (unless
    RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1, as Ray reads it) and ``.rayignore``."""
    import logging

    from ray._private.ray_constants import RAY_RUNTIME_ENV_IGNORE_GITIGNORE
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    include_gitignore = os.environ.get(RAY_RUNTIME_ENV_IGNORE_GITIGNORE, "0") != "1"
    found: list[Path] = []
    root = root.absolute()
    # Ray logs each ignore file it applies at INFO on its own logger: not here, the listing says it
    _dir_travel(
        root,
        [_get_excludes(root, list(excludes))],
        lambda p: found.append(p) if p.is_file() else None,
        include_gitignore=include_gitignore,
        logger=logging.getLogger(__name__),
    )
    return found


def code_files(code_root: str | Path = CODE_ROOT) -> dict[str, Path]:
    """{path in the upload: local file} of the code packages ``CODE_PACKAGES`` under
    ``code_root``, walked like Ray walks a folder (``EXCLUDES`` and each package's own
    ``.gitignore`` applied).

    Raises:
        UploadError: a code package is missing under ``code_root``.
    """
    code = Path(code_root)
    files: dict[str, Path] = {}
    for pkg in CODE_PACKAGES:
        if not (code / pkg / "__init__.py").is_file():
            raise UploadError(
                code / pkg, [("", "the code package the job runs is not here: pass --no-upload if the cluster's image has it")]
            )
        files |= {f.relative_to(code.absolute()).as_posix(): f for f in _walk(code / pkg, EXCLUDES)}
    return files


def upload_plan(spec_path: str | Path, study: Study, working_dir: str | Path, code_root: str | Path = CODE_ROOT) -> dict[str, Path]:
    """What the job's working dir holds, as {path in it (posix): the local file}: the allow-list.

    - the code packages ``CODE_PACKAGES`` from ``code_root`` (walked like Ray walks a folder,
      ``EXCLUDES`` and each package's own ``.gitignore`` applied), at their own names, so the
      job's ``python -m orchestrator.cli`` imports them;
    - the spec at its path relative to ``working_dir``, and each base of its ``extends`` chain
      at the path that chain names from there (an absolute ``extends`` is read on the cluster
      at that path, not uploaded), so the job reads the chain exactly as it was read here;
    - the spec's local plug-ins that lie in the spec's folder, beside it as here (they also
      travel as ``py_modules``, for the training workers).

    Nothing else: no corpus, ``.env``, ``data/``, ``runs/``. Corpus paths are read where the
    job runs (shared storage or the image).

    Raises:
        SpecError: the spec, or a base of its chain, lies outside ``working_dir``; a base or
            ``extends`` cannot be read (``read_layers``).
        UploadError: a code package is missing under ``code_root``; two different files would
            land at one path in the upload.
    """
    wd, code = Path(working_dir).resolve(), Path(code_root)
    files: dict[str, Path] = {}

    def put(dest: PurePosixPath, src: Path) -> None:
        key = dest.as_posix()
        if (prev := files.get(key)) is not None and prev.resolve() != src.resolve():
            raise UploadError(src, [("", f"would be uploaded as {key}, where {prev} already goes")])
        files[key] = src

    for dest_, src_ in code_files(code).items():
        put(PurePosixPath(dest_), src_)
    try:
        dest = PurePosixPath(Path(spec_path).resolve().relative_to(wd).as_posix())
    except ValueError:
        raise SpecError(spec_path, [("", f"the spec must be inside the uploaded working dir {wd}")]) from None
    spec_dir = dest.parent
    for layer in read_layers(Path(spec_path)):
        put(dest, layer.path)
        ext = layer.data.get(EXTENDS) if isinstance(layer.data, dict) else None
        if not isinstance(ext, str) or Path(ext).is_absolute():
            break
        dest = PurePosixPath(posixpath.normpath((dest.parent / ext).as_posix()))
        if dest.parts[:1] == ("..",):
            raise SpecError(layer.path, [(EXTENDS, f"base spec {ext} lies outside the uploaded working dir {wd}: move it inside")])
    here = Path(spec_path).parent.resolve()
    for name in study.plugins:
        plugin = load_plugin(name, here)  # loaded by load_spec: its cached Plugin
        src = Path(plugin.path)
        if plugin.version is not None or not src.resolve().is_relative_to(here):
            continue  # installed, or imported from elsewhere: the workers get it as py_modules / the image
        rel = spec_dir / src.resolve().relative_to(here).as_posix()
        if src.is_file():
            put(rel, src)
        for f in _walk(src, EXCLUDES) if src.is_dir() else []:
            put(rel / f.relative_to(src.absolute()).as_posix(), f)
    return files


def check_upload(entries: Sequence[tuple[str, Path]], spec_path: str | Path, max_bytes: int = UPLOAD_MAX_BYTES) -> int:
    """Refuse an upload (``entries``: (path in the upload, local file)) that holds a file named
    like a credential (``secret_pattern`` of its path in the upload or, for a symlink, of the
    file it points to) or exceeds ``max_bytes`` in all. Returns the total bytes.

    Raises:
        UploadError: naming every secret-looking file (its local path) and the pattern it
            matches; or, for the size, the total, the cap and the largest files.
    """
    secrets_found = [
        (str(src), f"refusing to upload {dest}: its name looks like a credential ({hit}); nothing was sent")
        for dest, src in entries
        if (hit := secret_pattern(dest) or (secret_pattern(str(src.resolve())) if src.is_symlink() else None))
    ]
    if secrets_found:
        raise UploadError(secrets_found[0][0], [("", msg) for _, msg in secrets_found], [f for f, _ in secrets_found])
    sizes = sorted(((src.stat().st_size, dest) for dest, src in entries), reverse=True)
    total = sum(s for s, _ in sizes)
    if total > max_bytes:
        largest = ", ".join(f"{d} ({s:,} bytes)" for s, d in sizes[:3])
        raise UploadError(
            spec_path,
            [
                (
                    "",
                    f"the upload is {total:,} bytes, over the {max_bytes:,}-byte cap (UPLOAD_MAX_BYTES); largest: {largest}. "
                    "Keep data out of the code packages and the spec's folder (the job reads corpora from shared storage), "
                    "or pass --no-upload with the code in the cluster's image",
                )
            ],
        )
    return total


@contextlib.contextmanager
def staged(job: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``job`` with its ``upload`` files copied into a fresh temporary folder at their paths,
    set as ``runtime_env["working_dir"]`` (what Ray zips and uploads) while the context lasts;
    the folder is removed after. A job without files (``--no-upload``) is left as it is.

    Raises:
        OSError: a file cannot be read or the folder written.
    """
    if not job.get("upload"):
        yield job
        return
    with tempfile.TemporaryDirectory(prefix="qkstudy-upload-") as stage:
        for dest, src in job["upload"].items():
            out = Path(stage, dest)
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)  # the content (a symlink's target), mode and mtime
        job["runtime_env"]["working_dir"] = stage
        try:
            yield job
        finally:
            if job["runtime_env"].get("working_dir") == stage:  # Ray's submit replaces it with the package's URI
                del job["runtime_env"]["working_dir"]


def upload_entries(runtime_env: Mapping[str, Any]) -> list[tuple[str, Path]]:
    """(path in the upload, local file) of every file ``runtime_env`` uploads (``upload_files``)."""
    excludes = list(runtime_env.get("excludes") or [])
    wd = [(Path(runtime_env["working_dir"]), False)] if runtime_env.get("working_dir") else []
    out: list[tuple[str, Path]] = []
    for root, named in wd + [(Path(m), True) for m in runtime_env.get("py_modules") or []]:
        root = root.absolute()
        base = root.parent if named or root.is_file() else root  # a py_module keeps its own name
        out += [(f.relative_to(base).as_posix(), f) for f in _walk(root, excludes)]
    return out


def upload_files(runtime_env: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(path in the upload, bytes) of every file a job's ``runtime_env`` uploads, largest first.

    Its ``working_dir`` (``staged``: paths relative to it) and each local ``py_modules`` entry
    (under its own name), walked with Ray's packaging traversal, the one its upload zips with:
    the ``excludes`` patterns (gitignore syntax, relative to the folder uploaded), then in each
    folder its ``.gitignore`` (unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1, as Ray reads it) and
    ``.rayignore`` for what lies below. Empty when nothing is uploaded (``--no-upload``).
    """
    files = [(rel, f.stat().st_size) for rel, f in upload_entries(runtime_env)]
    return sorted(files, key=lambda f: (-f[1], f[0]))


def upload_lines(files: Sequence[tuple[str, int]], *, limit: int | None = 10) -> list[str]:
    """``upload_files`` for a reader: the count and total bytes, then the ``limit`` largest files
    (None: every one) and how many more there are."""
    total = sum(size for _, size in files)
    lines = [f"uploading {len(files)} file{'' if len(files) == 1 else 's'}, {total:,} bytes ({total / 2**20:.1f} MiB):"]
    shown = files if limit is None else files[:limit]
    lines += [f"  {size:>12,}  {path}" for path, size in shown]
    if len(files) > len(shown):
        lines.append(f"  ... and {len(files) - len(shown)} smaller (--verbose lists every file)")
    return lines
