"""`qkstudy submit / logs / stop / status` without a cluster: where the dashboard address comes
from (``--address``, else RAY_API_SERVER_ADDRESS, else RAY_ADDRESS, Ray's order), the one-line
refusals of a missing address and of a cluster's own address (``auto``, ``ray://``, GCS), and the
listing of what a submit uploads (Ray's packaging rules: ``excludes``, ``.gitignore``,
``.rayignore``), printed before anything is sent."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.run.driver.submit import AddressError, check_submit_address, resolve_address
from orchestrator.run.driver.upload import upload_files, upload_lines

SPEC = (
    "name: s\nscales: [cpu-xs]\nvariants: [standard]\nbudget: {tokens: 40960}\n"
    "tracking_uri: http://mlflow:5000\nstorage_path: /shared/qkstudy/s\n"
)
# Documentation addresses (RFC 5737): plain http to them is refused before any connection,
# and the refusal names the address that was used.
API, RAY, FLAG = "http://203.0.113.7:8265", "http://198.51.100.9:8265", "http://192.0.2.1:8265"
# Nothing listens on port 9 (discard): a submit that gets past the checks fails to connect.
NOWHERE = "http://127.0.0.1:9"


def _invoke(args: list[str], env: dict[str, str | None]):
    """The CLI in this process, RAY_API_SERVER_ADDRESS and RAY_ADDRESS unset unless ``env`` sets them."""
    return CliRunner().invoke(app, args, env={"RAY_API_SERVER_ADDRESS": None, "RAY_ADDRESS": None, **env})


def _errors(res) -> list[str]:
    return [line for line in res.stderr.splitlines() if line.startswith("error:")]


@pytest.fixture
def spec(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SPEC)
    return tmp_path / "s.yaml"


@pytest.mark.parametrize(
    ("flag", "env", "used"),
    [
        ([], {"RAY_API_SERVER_ADDRESS": API, "RAY_ADDRESS": RAY}, API),  # Ray's order: the API server's variable first
        ([], {"RAY_ADDRESS": RAY}, RAY),
        ([], {"RAY_API_SERVER_ADDRESS": " ", "RAY_ADDRESS": RAY}, RAY),  # blank counts as unset
        (["--address", FLAG], {"RAY_API_SERVER_ADDRESS": API, "RAY_ADDRESS": RAY}, FLAG),  # the command line wins
    ],
)
def test_submit_takes_the_address_from_the_flag_then_ray_api_server_address_then_ray_address(spec, flag, env, used):
    res = _invoke(["submit", "s.yaml", *flag], env)
    assert res.exit_code == 2, res.output
    (line,) = _errors(res)
    assert "refusing to submit" in line and used in line


def test_resolve_address_says_where_it_came_from():
    env = {"RAY_API_SERVER_ADDRESS": API, "RAY_ADDRESS": RAY}
    assert resolve_address(None, env) == (API, "RAY_API_SERVER_ADDRESS")
    assert resolve_address(None, {"RAY_ADDRESS": RAY}) == (RAY, "RAY_ADDRESS")
    assert resolve_address(FLAG, env) == (FLAG, "--address")
    assert resolve_address(None, {}) is None


@pytest.mark.parametrize("command", [["submit", "s.yaml"], ["logs", "raysubmit_x"], ["stop", "raysubmit_x"]])
def test_no_address_anywhere_is_one_error_naming_the_flag_and_both_variables(spec, command):
    res = _invoke(command, {})
    assert res.exit_code == 2, res.output
    (line,) = _errors(res)
    assert "--address" in line and "RAY_API_SERVER_ADDRESS" in line and "RAY_ADDRESS" in line


@pytest.mark.parametrize(
    ("address", "what"),
    [
        ("auto", "find a running Ray"),
        ("LOCAL", "find a running Ray"),
        ("ray://head:10001", "Ray Client address (scheme 'ray')"),
        ("ray-head:6379", "GCS address (port 6379)"),
        ("10.0.0.5:10001", "Ray Client address (port 10001)"),
    ],
)
@pytest.mark.parametrize("command", [["submit", "s.yaml"], ["logs", "raysubmit_x"], ["stop", "raysubmit_x"]])
def test_a_cluster_address_in_ray_address_is_refused_with_the_dashboard_url_to_use(spec, command, address, what):
    res = _invoke(command, {"RAY_ADDRESS": address})
    assert res.exit_code == 2, res.output
    (line,) = _errors(res)
    assert f"RAY_ADDRESS '{address}' is" in line and what in line
    assert "not the Ray dashboard" in line and "http(s)://HOST:8265" in line


@pytest.mark.parametrize("address", ["auto", "ray://head:10001", "head:6379"])
def test_check_submit_address_refuses_a_cluster_address_too(address):
    with pytest.raises(AddressError, match=r"not the Ray dashboard: the Job Submission API needs the dashboard's URL"):
        check_submit_address(address, allow_insecure=True)


def test_a_dashboard_on_another_port_is_still_a_dashboard():
    assert resolve_address(None, {"RAY_ADDRESS": "127.0.0.1:8266"}) == ("127.0.0.1:8266", "RAY_ADDRESS")


def test_status_skips_a_ray_address_meant_for_qkstudy_run_with_a_warning(tmp_path, monkeypatch):
    """`status` lists jobs only when it has a dashboard; a RAY_ADDRESS set for `qkstudy run`
    (a GCS address) must not break it. An explicit bad --address is still refused."""
    from mlflow.tracking import MlflowClient

    from orchestrator.track.tracking import KIND_TAG, sqlite_uri

    monkeypatch.chdir(tmp_path)
    store = sqlite_uri(tmp_path / "mlflow.db")
    c = MlflowClient(store)
    c.create_run(c.create_experiment("st"), tags={KIND_TAG: "train"})
    res = _invoke(["status", "st", "--tracking-uri", store, "--json"], {"RAY_ADDRESS": "ray-head:6379"})
    assert res.exit_code == 0, res.output
    assert "warning: RAY_ADDRESS 'ray-head:6379' is a GCS address" in " ".join(res.stderr.split())
    res = _invoke(["status", "st", "--tracking-uri", store, "--address", "ray://head:10001"], {})
    assert res.exit_code == 2 and "Ray Client address" in _errors(res)[0]


# --------------------------------------------------------------------------- the upload


def _tree(root: Path, files: dict[str, int]) -> None:
    for rel, size in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)


UPLOAD = {
    "s.yaml": 40,
    "pkg/mod.py": 300,
    "pkg/big.bin": 5000,
    "pkg/data/keep.txt": 7,
    "notes.log": 11,  # .gitignore: *.log
    "cache/x.arrow": 13,  # .gitignore: cache/
    "pkg/secret.txt": 17,  # pkg/.gitignore: secret.txt (below pkg/ only)
    "secret.txt": 19,  # not below pkg/: uploaded
    "scratch.tmp": 23,  # .rayignore
    ".venv/lib/x.py": 29,  # EXCLUDES
    "runs/s/mlflow.db": 31,
    "pkg/__pycache__/mod.pyc": 37,
    "qk.egg-info/PKG-INFO": 41,
}
# A deny-list as a runtime_env's ``excludes`` (gitignore syntax), the first rule Ray applies.
EXCLUDES = [".venv/", "runs/", ".git/", "**/__pycache__/", "*.egg-info/"]
UPLOADED = {".gitignore", ".rayignore", "s.yaml", "pkg/.gitignore", "pkg/mod.py", "pkg/big.bin", "pkg/data/keep.txt", "secret.txt"}


@pytest.fixture
def upload(tmp_path) -> Path:
    _tree(tmp_path, UPLOAD)
    (tmp_path / ".gitignore").write_text("*.log\ncache/\n")
    (tmp_path / "pkg" / ".gitignore").write_text("secret.txt\n")
    (tmp_path / ".rayignore").write_text("*.tmp\n")
    return tmp_path


def test_upload_listing_applies_excludes_gitignore_and_rayignore_as_ray_does(upload, tmp_path_factory, monkeypatch):
    monkeypatch.delenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", raising=False)
    files = upload_files({"working_dir": str(upload), "excludes": EXCLUDES})
    assert {p for p, _ in files} == UPLOADED
    assert files[0] == ("pkg/big.bin", 5000) and dict(files)["pkg/mod.py"] == 300  # largest first, sizes in bytes
    # the zip Ray's own upload builds from the same folder holds exactly these files
    from ray._private.runtime_env.packaging import create_package

    pkg = tmp_path_factory.mktemp("zip") / "pkg.zip"
    create_package(str(upload), pkg, include_gitignore=True, excludes=EXCLUDES)
    with zipfile.ZipFile(pkg) as z:
        assert {i.filename for i in z.infolist() if not i.is_dir()} == UPLOADED


def test_upload_listing_follows_ray_when_gitignore_is_off(upload, monkeypatch):
    monkeypatch.setenv("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "1")
    files = {p for p, _ in upload_files({"working_dir": str(upload), "excludes": EXCLUDES})}
    assert files == UPLOADED | {"notes.log", "cache/x.arrow", "pkg/secret.txt"}


def test_a_py_module_is_listed_under_its_own_name(upload):
    files = dict(upload_files({"py_modules": [str(upload / "pkg")], "excludes": EXCLUDES}))
    assert set(files) == {"pkg/.gitignore", "pkg/mod.py", "pkg/big.bin", "pkg/data/keep.txt"}


def test_upload_lines_count_total_and_the_largest():
    files = [(f"f{i}", 100 - i) for i in range(12)]
    lines = upload_lines(files, limit=10)
    assert lines[0] == f"uploading 12 files, {sum(s for _, s in files):,} bytes (0.0 MiB):"
    assert len(lines) == 12 and "2 smaller (--verbose lists every file)" in lines[-1]
    assert len(upload_lines(files, limit=None)) == 13


def test_submit_lists_the_upload_on_stderr_before_sending_and_nothing_with_no_upload(upload, monkeypatch):
    monkeypatch.chdir(upload)
    (upload / "s.yaml").write_text(SPEC)
    res = _invoke(["submit", "s.yaml", "--address", NOWHERE], {})
    assert res.exit_code == 1, res.output  # listed, then the (absent) cluster did not answer
    err = res.stderr
    assert err.index("uploading") < err.index("error:") and res.stdout == ""
    assert "orchestrator/" in err and "--verbose lists every file" in err  # the 10 largest: code
    # --verbose: every file, the allow-list: the code packages and the spec, nothing else of the folder
    res = _invoke(["submit", "s.yaml", "--address", NOWHERE, "--verbose"], {})
    head, *listed = res.stderr.split("error:")[0].splitlines()
    paths = {line.split()[-1] for line in listed}
    assert head.startswith(f"uploading {len(listed)} files, ") and "s.yaml" in paths and "orchestrator/cli.py" in paths
    assert {p.split("/")[0] for p in paths} == {"s.yaml", "orchestrator", "model", "data_pipeline"}
    res = _invoke(["submit", "s.yaml", "--address", NOWHERE, "--no-upload"], {})
    assert res.exit_code == 1 and "uploading" not in res.stderr
