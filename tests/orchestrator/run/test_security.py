"""orchestrator.run.security: submit-address policy, shell quoting, redaction, safe checkpoint load."""

from __future__ import annotations

import logging
import os
import shlex
import subprocess

import pytest
import torch

from orchestrator.run.security import (
    REDACTED,
    InsecureAddressError,
    RedactingFilter,
    UnsafeCheckpointError,
    check_submit_address,
    is_loopback_host,
    is_secret_key,
    known_secrets,
    redact,
    redact_text,
    redact_uri,
    safe_torch_load,
    shell_join,
)

# --------------------------------------------------------------------------- addresses


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("http://127.0.0.1:8265", "http://127.0.0.1:8265"),
        ("http://127.3.4.5:8265/", "http://127.3.4.5:8265"),
        ("HTTP://LocalHost:8265", "http://localhost:8265"),
        ("localhost:8265", "http://localhost:8265"),
        ("http://[::1]:8265", "http://[::1]:8265"),
        ("http://[::ffff:127.0.0.1]:8265", "http://[::ffff:127.0.0.1]:8265"),
        ("https://ray.example.org:8265/", "https://ray.example.org:8265"),
        ("https://Ray.Example.org/proxy/ray/", "https://ray.example.org/proxy/ray"),
        ("  https://10.1.2.3:8265  ", "https://10.1.2.3:8265"),
    ],
)
def test_accepts_tls_and_loopback(address: str, expected: str) -> None:
    assert check_submit_address(address) == expected


@pytest.mark.parametrize(
    "address",
    [
        "http://10.0.0.5:8265",
        "http://ray-head:8265",
        "ray-head.internal:8265",  # no scheme: read as http
        "http://0.0.0.0:8265",
        "http://127.0.0.1.nip.io:8265",  # looks loopback, resolves anywhere
        "http://[2001:db8::1]:8265",
    ],
)
def test_refuses_plain_http_off_loopback(address: str) -> None:
    with pytest.raises(InsecureAddressError, match="allow-insecure"):
        check_submit_address(address)
    # Explicit opt-in lets it through, normalised.
    assert check_submit_address(address, allow_insecure=True).startswith("http://")


def test_insecure_error_is_a_value_error() -> None:
    assert issubclass(InsecureAddressError, ValueError)


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("ray://head:10001", "scheme 'ray'"),
        ("ftp://head:8265", "scheme 'ftp'"),
        ("http://", "no host"),
        ("http://head:99999", "not a valid URL"),
        ("http://head:port", "not a valid URL"),
        ("https://head:8265/?x=1", "query"),
        ("https://head:8265/#frag", "fragment"),
        ("https://alice:s3cret@head:8265", "embeds credentials"),
    ],
)
def test_rejects_garbage_with_clear_message(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        check_submit_address(address, allow_insecure=True)
    assert not isinstance(info.value, InsecureAddressError)
    assert "s3cret" not in str(info.value)  # the error itself must not leak the password


def test_is_loopback_host() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1")
    assert is_loopback_host("localhost") and is_loopback_host("LOCALHOST.")
    assert not is_loopback_host("10.0.0.1") and not is_loopback_host("example.com")
    assert not is_loopback_host("localhost.evil.com")


# --------------------------------------------------------------------------- shell


HOSTILE = "$(touch {p}); `touch {p}`; touch {p} | cat && echo '\"' \n touch {p}"


def test_shell_join_keeps_metacharacters_literal(tmp_path) -> None:
    marker = tmp_path / "pwned"
    argv = ["printf", "%s\\n", "--name", HOSTILE.format(p=marker), "spec with space.yaml"]
    line = shell_join(argv)
    assert shlex.split(line) == argv
    # Run it through a real shell, as Ray's job supervisor does with an entrypoint string.
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines()[1] == HOSTILE.format(p=marker).splitlines()[0]
    assert not marker.exists()


@pytest.mark.parametrize(
    ("argv", "error"),
    [("qkstudy run x.yaml", TypeError), ([], ValueError), (["a", 3], TypeError),
     (["a", "b\x00c"], ValueError)],
)
def test_shell_join_rejects_bad_argv(argv, error) -> None:
    with pytest.raises(error):
        shell_join(argv)


# --------------------------------------------------------------------------- redaction


@pytest.mark.parametrize(
    ("key", "secret"),
    [("password", True), ("MLFLOW_TRACKING_PASSWORD", True), ("hf_token", True),
     ("apiKey", True), ("api_key", True), ("aws_secret_access_key", True),
     ("Authorization", True), ("tokens", False), ("max_tokens", False), ("tokenizer", False),
     ("tracking_uri", False), ("name", False), ("seq_len", False), (3, False)],
)
def test_is_secret_key(key, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_redact_uri() -> None:
    assert redact_uri("postgresql+psycopg://mlflow:pa55@db:5432/mlflow") == (
        f"postgresql+psycopg://mlflow:{REDACTED}@db:5432/mlflow"
    )
    assert redact_uri("http://bob:hunter2@mlflow:5000") == f"http://bob:{REDACTED}@mlflow:5000"
    assert redact_uri("https://tok@host/x") == f"https://{REDACTED}@host/x"
    assert redact_uri("https://h/x?token=abc&a=1") == f"https://h/x?token={REDACTED}&a=1"
    assert redact_uri("s3://bucket/qkstudy") == "s3://bucket/qkstudy"
    assert redact_uri("/data/qkstudy") == "/data/qkstudy"


def test_redact_text_masks_every_form() -> None:
    text = (
        "uri=http://bob:hunter2@mlflow:5000 password=abc123 token: 'xyz789' "
        '{"api_key": "k-456"} Authorization: Basic Ym9iOmh1bnRlcjI= '
        "max_tokens=4096 tokens=100 env-secret=ignored-by-key the-literal-SECRETVALUE-here"
    )
    out = redact_text(text, secrets=["SECRETVALUE"])
    for leaked in ("hunter2", "abc123", "xyz789", "k-456", "Ym9iOmh1bnRlcjI=", "SECRETVALUE"):
        assert leaked not in out, leaked
    assert "max_tokens=4096" in out and "tokens=100" in out and "bob:" in out
    assert "Authorization: Basic ***" in out


def test_known_secrets_reads_env() -> None:
    env = {"MLFLOW_TRACKING_PASSWORD": "pw-123456", "POSTGRES_PASSWORD": "x", "HOME": "/root"}
    assert known_secrets(env) == ["pw-123456"]  # too-short values are not masked


def test_redact_mapping_is_a_deep_copy() -> None:
    spec = {
        "name": "study",
        "tracking_uri": "http://u:p4ss@mlflow:5000",
        "storage_path": "s3://bucket/qkstudy",
        "resources": {"workers": 2, "password": 1234},
        "env": [{"HF_TOKEN": "hf_abcdef"}, "note token=t0k3n"],
        "tokens": 10_000,
        "empty_password": "",
    }
    out = redact(spec, secrets=[])
    assert out["tracking_uri"] == f"http://u:{REDACTED}@mlflow:5000"
    assert out["resources"] == {"workers": 2, "password": REDACTED}
    assert out["env"] == [{"HF_TOKEN": REDACTED}, f"note token={REDACTED}"]
    assert out["storage_path"] == "s3://bucket/qkstudy" and out["tokens"] == 10_000
    assert out["empty_password"] == ""
    assert spec["resources"]["password"] == 1234  # input untouched


def test_redact_pydantic_model() -> None:
    from pydantic import BaseModel

    class Cfg(BaseModel):
        tracking_uri: str
        api_token: str

    out = redact(Cfg(tracking_uri="https://a:b@h", api_token="zzz"), secrets=[])
    assert out == {"tracking_uri": f"https://a:{REDACTED}@h", "api_token": REDACTED}


def test_redacting_filter_cleans_log_records(caplog, monkeypatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "env-pass-987")
    logger = logging.getLogger("qkstudy.test.redaction")
    filt = RedactingFilter()
    logger.addFilter(filt)
    try:
        with caplog.at_level(logging.INFO, logger=logger.name):
            logger.info("connecting to %s as %s", "http://u:pw1@host", "env-pass-987")
    finally:
        logger.removeFilter(filt)
    message = caplog.records[-1].getMessage()
    assert "pw1" not in message and "env-pass-987" not in message
    assert "http://u:***@host" in message


# --------------------------------------------------------------------------- checkpoints


def test_safe_torch_load_round_trip(tmp_path) -> None:
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "step": 7, "tokens": 4096}
    path = tmp_path / "ckpt.pt"
    torch.save(state, path)
    for target in (path, str(path), path.as_uri()):
        loaded = safe_torch_load(target)
        assert loaded["step"] == 7 and loaded["tokens"] == 4096
        assert torch.equal(loaded["model"]["w"], state["model"]["w"])


class _Exploit:
    """Pickles to a call of os.system: a checkpoint someone tampered with."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_safe_torch_load_refuses_code(tmp_path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    torch.save({"w": torch.zeros(2), "x": _Exploit(str(marker))}, path)
    with pytest.raises(UnsafeCheckpointError, match="evil.pt"):
        safe_torch_load(path)
    assert not marker.exists()


def test_safe_torch_load_missing_file(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        safe_torch_load(tmp_path / "nope.pt")
    with pytest.raises(FileNotFoundError, match="nope.pt"):
        safe_torch_load((tmp_path / "nope.pt").as_uri())


# --------------------------------------------------------------------------- static: loaders

UNSAFE_LOADERS = {("pickle", "load"), ("pickle", "loads"), ("dill", "load"), ("dill", "loads"),
                  ("joblib", "load"), ("cloudpickle", "load"), ("cloudpickle", "loads")}


def unsafe_loads(source: str, filename: str) -> list[str]:
    """torch.load without weights_only=True, and pickle-family loads, in `source`."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        name = (owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", ""), node.func.attr)
        if name == ("torch", "load"):
            weights_only = next((k.value for k in node.keywords if k.arg == "weights_only"), None)
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"{filename}:{node.lineno}: torch.load without weights_only=True")
        elif name in UNSAFE_LOADERS:
            found.append(f"{filename}:{node.lineno}: {'.'.join(name)} unpickles arbitrary objects")
    return found


def test_loader_scanner_can_fail() -> None:
    bad = "import torch, pickle\ntorch.load(p)\ntorch.load(p, weights_only=False)\npickle.loads(b)\n"
    assert len(unsafe_loads(bad, "bad.py")) == 3
    assert unsafe_loads("torch.load(p, map_location='cpu', weights_only=True)\n", "ok.py") == []


def test_product_loads_checkpoints_weights_only() -> None:
    """Checkpoints load through safe_torch_load or DeepSpeed's engine.load_checkpoint only."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    files = [p for pkg in ("orchestrator", "model", "data_pipeline")
             for p in sorted((repo / pkg).rglob("*.py"))]
    findings = [f for p in files for f in unsafe_loads(p.read_text(), str(p.relative_to(repo)))]
    assert findings == []
