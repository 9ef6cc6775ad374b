"""What `qkstudy submit` uploads: an allow-list (the code packages, the spec, its ``extends``
chain), read from the package Ray's own packaging builds from the staged working dir, for a
study folder outside any checkout and for a checkout, each beside a ``.env``, credentials, a key
and data that must stay home; the printed count and bytes are the package's. Negative controls:
the old whole-folder upload holds those files and the check refuses it; a base or plug-in file
named like a secret is refused, naming it, exit 2; an upload over the cap is refused."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.plan.spec import SpecError
from orchestrator.run.driver import submit as S
from orchestrator.run.driver import upload as U
from orchestrator.track import provenance as P

SPEC = "extends: base/b.yaml\nname: s\nvariants: [standard]\ntracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/s\n"
BASE = "scales: [cpu-xs]\nbudget: {tokens: 40960}\n"
# Nothing listens on port 9 (discard): a submit that gets past its checks fails to connect.
NOWHERE = "http://127.0.0.1:9"
SECRETS = {".env": "AWS_SECRET_ACCESS_KEY=x\n", ".aws/credentials": "[default]\n", "id_rsa": "-----BEGIN KEY-----\n"}
# The deny-list submit used to send the whole folder with.
OLD_EXCLUDES = [".venv/", "runs/", ".git/", "**/__pycache__/", "*.egg-info/", ".pytest_cache/", "reports/", "mlruns/"]


def _study(folder: Path, spec: str = SPEC) -> Path:
    """``folder/s.yaml`` extending ``folder/base/b.yaml``, beside secrets and ``data/big.bin``."""
    (folder / "base").mkdir(parents=True, exist_ok=True)
    (folder / "base" / "b.yaml").write_text(BASE)
    (folder / "s.yaml").write_text(spec)
    for rel, text in SECRETS.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    (folder / "data").mkdir(exist_ok=True)
    (folder / "data" / "big.bin").write_bytes(os.urandom(4096))
    return folder / "s.yaml"


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x", "HOME": str(repo)}
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, timeout=60, env={**os.environ, **env})
    return out.stdout.strip()


def _sent(spec: Path, tmp_path: Path, **kw) -> tuple[set[str], int, list[str], dict]:
    """Submit ``spec`` to NOWHERE; before it is sent, build the package Ray builds from the
    staged working dir (and each py_module). Returns (the package's files, their bytes, the
    lines `qkstudy submit` prints, the job)."""
    from ray._private.runtime_env.packaging import create_package

    seen: dict = {}

    def before_send(job: dict) -> None:
        rt = job["runtime_env"]
        names: set[str] = set()
        size = 0
        for i, root in enumerate([rt["working_dir"], *rt.get("py_modules", [])]):
            pkg = tmp_path / f"pkg{i}.zip"
            create_package(root, pkg, include_gitignore=True, include_parent_dir=i > 0, excludes=rt.get("excludes"))
            with zipfile.ZipFile(pkg) as z:
                names |= {f.filename for f in z.infolist() if not f.is_dir()}
                size += sum(f.file_size for f in z.infolist() if not f.is_dir())
        seen.update(names=names, size=size, lines=U.upload_lines(U.upload_files(rt), limit=None), job=job, stage=Path(rt["working_dir"]))

    with pytest.raises(ConnectionError):
        S.submit(spec, NOWHERE, **kw, before_send=before_send)
    assert not seen["stage"].exists()  # the staged folder is gone once the job is sent (or not)
    return seen["names"], seen["size"], seen["lines"], seen["job"]


def _check_printed(lines: list[str], names: set[str], size: int) -> None:
    m = re.match(r"uploading (\d+) files?, ([\d,]+) bytes", lines[0])
    assert m is not None, lines[0]
    assert (int(m[1]), int(m[2].replace(",", ""))) == (len(names), size)  # what is printed is the package
    assert {line.split()[-1] for line in lines[1:]} == names


def _code(names: set[str]) -> set[str]:
    return {n for n in names if n.split("/")[0] in U.CODE_PACKAGES}


def test_a_study_folder_outside_a_checkout_uploads_the_code_and_the_spec_chain_only(tmp_path, monkeypatch):
    folder = tmp_path / "study"
    spec = _study(folder)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    names, size, lines, job = _sent(spec, tmp_path, working_dir=folder)
    assert names - _code(names) == {"s.yaml", "base/b.yaml"}  # the spec and its base, at their paths
    assert {"orchestrator/cli.py", "model/__init__.py", "data_pipeline/__init__.py"} <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert not names & {*SECRETS, "data/big.bin"}
    _check_printed(lines, names, size)
    assert job["entrypoint"].split()[-1] == "s.yaml"  # read on the cluster where it was put


def test_a_checkout_uploads_its_code_and_spec_chain_not_its_env_or_data(tmp_path, monkeypatch):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    repo = tmp_path / "repo"
    for pkg in U.CODE_PACKAGES:
        shutil.copytree(P.CODE_ROOT / pkg, repo / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(P.CODE_ROOT / "pyproject.toml", repo)
    spec = _study(repo / "jobs")
    for rel in {*(r.split("/")[0] for r in SECRETS), "data"}:  # at the checkout's root too, as a user's checkout holds them
        shutil.move(repo / "jobs" / rel, repo / rel)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "x")
    job = S.build_job(spec, NOWHERE, working_dir=repo, code_root=repo)
    assert set(job["upload"]) - _code(set(job["upload"])) == {"jobs/s.yaml", "jobs/base/b.yaml"}
    assert not set(job["upload"]) & {*SECRETS, "data/big.bin", "pyproject.toml"}
    assert {str(p) for p in job["upload"].values() if p.name == "cli.py"} == {str(repo / "orchestrator" / "cli.py")}  # this checkout's code
    # the job's runs record the commit of the code uploaded
    state = json.loads(job["runtime_env"]["env_vars"][P.SOURCE_ENV])
    assert (state["source"], state["commit"], state["dirty"]) == (P.UPLOAD, _git(repo, "rev-parse", "HEAD"), False)
    # the package Ray builds from the staged job holds exactly the plan, and the listing says so
    from ray._private.runtime_env.packaging import create_package

    with U.staged(job) as staged:
        stage = Path(staged["runtime_env"]["working_dir"])
        create_package(str(stage), tmp_path / "pkg.zip", include_gitignore=True)
        lines = U.upload_lines(U.upload_files(staged["runtime_env"]), limit=None)
    assert not stage.exists() and "working_dir" not in job["runtime_env"]
    with zipfile.ZipFile(tmp_path / "pkg.zip") as z:
        files = [f for f in z.infolist() if not f.is_dir()]
    names = {f.filename for f in files}
    assert names == set(job["upload"])
    _check_printed(lines, names, sum(f.file_size for f in files))


def test_code_from_outside_any_checkout_is_recorded_as_not_a_checkout(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    code = tmp_path / "site"  # an installed qkstudy: its packages, no git
    for pkg in U.CODE_PACKAGES:
        shutil.copytree(P.CODE_ROOT / pkg, code / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    spec = _study(tmp_path / "study")
    job = S.build_job(spec, NOWHERE, working_dir=spec.parent, code_root=code)
    assert json.loads(job["runtime_env"]["env_vars"][P.SOURCE_ENV])["source"] == P.NOT_A_CHECKOUT
    assert job["upload"]["orchestrator/cli.py"] == code / "orchestrator" / "cli.py"


def test_the_old_whole_folder_upload_held_the_secrets_and_the_check_refuses_it(tmp_path):
    folder = tmp_path / "study"
    spec = _study(folder)
    old = U.upload_files({"working_dir": str(folder), "excludes": OLD_EXCLUDES})
    assert {*SECRETS, "data/big.bin"} <= {p for p, _ in old}  # what used to leave the machine
    with pytest.raises(U.UploadError) as e:
        U.check_upload([(p, folder / p) for p, _ in old], spec)
    assert {Path(f).relative_to(folder).as_posix() for f in e.value.files} == set(SECRETS)
    for rel in SECRETS:
        assert f"{folder / rel}: refusing to upload {rel}: its name looks like a credential" in str(e.value)


@pytest.mark.parametrize("base", [".aws/base.yaml", "prod.env", ".ssh/b.yaml", "id_rsa.yaml"])
def test_a_base_named_like_a_secret_is_refused_naming_it_with_exit_2(tmp_path, monkeypatch, base):
    folder = tmp_path / "study"
    spec = _study(folder, SPEC.replace("base/b.yaml", base))
    (folder / base).parent.mkdir(parents=True, exist_ok=True)
    (folder / base).write_text(BASE)  # a valid base: only its name gives it away
    with pytest.raises(U.UploadError, match=re.escape(f"{folder / base}: refusing to upload {base}")):
        S.build_job(spec, NOWHERE, working_dir=folder)
    monkeypatch.chdir(folder)
    res = CliRunner().invoke(app, ["submit", "s.yaml", "--address", NOWHERE])
    assert res.exit_code == 2, res.output
    assert "uploading" not in res.stderr and f"refusing to upload {base}" in " ".join(res.stderr.split())


def test_a_base_reached_through_a_symlink_to_a_secret_folder_is_refused(tmp_path):
    folder = tmp_path / "study"
    spec = _study(folder, SPEC.replace("base/b.yaml", "b.yaml"))
    (folder / ".ssh").mkdir(exist_ok=True)
    (folder / ".ssh" / "b.yaml").write_text(BASE)
    (folder / "b.yaml").symlink_to(folder / ".ssh" / "b.yaml")
    with pytest.raises(U.UploadError, match="refusing to upload b.yaml"):
        S.build_job(spec, NOWHERE, working_dir=folder)


def test_a_plug_in_folder_holding_a_secret_is_refused(tmp_path):
    pkg = tmp_path / "my_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("x = 1\n")
    (pkg / ".env").write_text("TOKEN=x\n")
    listed = U.upload_files({"py_modules": [str(pkg)]})  # how a plug-in travels: Ray's py_modules
    assert "my_plugin/.env" in {p for p, _ in listed}
    with pytest.raises(U.UploadError, match=re.escape(f"{pkg / '.env'}: refusing to upload my_plugin/.env")):
        U.check_upload([(p, tmp_path / p) for p, _ in listed], tmp_path / "s.yaml")


def test_an_upload_over_the_cap_is_refused_with_its_size_and_largest_files(tmp_path):
    (tmp_path / "model.bin").write_bytes(b"x" * 3000)
    (tmp_path / "s.yaml").write_text("x")
    entries = [("s.yaml", tmp_path / "s.yaml"), ("model/model.bin", tmp_path / "model.bin")]
    assert U.check_upload(entries, tmp_path / "s.yaml", max_bytes=3001) == 3001
    with pytest.raises(
        U.UploadError, match=r"the upload is 3,001 bytes, over the 3,000-byte cap .*largest: model/model.bin \(3,000 bytes\)"
    ):
        U.check_upload(entries, tmp_path / "s.yaml", max_bytes=3000)
    assert U.UPLOAD_MAX_BYTES == 50 * 2**20


def test_a_base_outside_the_working_dir_is_refused_naming_the_file(tmp_path):
    folder = tmp_path / "study"
    spec = _study(folder, SPEC.replace("base/b.yaml", "../shared.yaml"))
    (tmp_path / "shared.yaml").write_text(BASE)
    with pytest.raises(SpecError, match=re.escape(f"{spec}: extends: base spec ../shared.yaml lies outside the uploaded working dir")):
        S.build_job(spec, NOWHERE, working_dir=folder)
    job = S.build_job(spec, NOWHERE, working_dir=tmp_path)  # from the folder above, both travel
    assert {"study/s.yaml", "shared.yaml"} <= set(job["upload"])


@pytest.mark.parametrize(
    ("path", "secret"),
    [
        (".env", True),
        ("jobs/.env.local", True),
        ("deploy/prod.env", True),
        (".env.example", False),
        ("id_ed25519.pub", True),
        ("certs/tls.PEM", True),
        ("x/.kube/config", True),
        (".docker/config.json", True),
        ("gcp/credentials-prod.json", True),
        (".netrc", True),
        ("orchestrator/run/driver/submit.py", False),
        ("jobs/base/paper.yaml", False),
        ("docker/config.json", False),
    ],
)
def test_secret_names(path, secret):
    assert (U.secret_pattern(path) is not None) is secret
