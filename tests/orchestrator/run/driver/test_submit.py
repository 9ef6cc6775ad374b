"""orchestrator.run.driver.submit's two guards: the submit-address policy and shell quoting."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from orchestrator.run.driver.submit import AddressError, InsecureAddressError, check_submit_address, is_loopback_host, shell_join

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
        # Rejected for another reason before the credentials check: still no password shown.
        ("http://alice:s3cret@head:99999", "not a valid URL"),
        ("alice:s3cret@head:port", "not a valid URL"),
        ("ftp://alice:s3cret@head", "scheme 'ftp'"),
    ],
)
def test_rejects_garbage_with_clear_message(address: str, message: str) -> None:
    with pytest.raises(AddressError, match=message) as info:
        check_submit_address(address, allow_insecure=True)
    assert not isinstance(info.value, InsecureAddressError) and isinstance(info.value, ValueError)
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
    ("argv", "error"), [("qkstudy run x.yaml", TypeError), ([], ValueError), (["a", 3], TypeError), (["a", "b\x00c"], ValueError)]
)
def test_shell_join_rejects_bad_argv(argv, error) -> None:
    with pytest.raises(error):
        shell_join(argv)
