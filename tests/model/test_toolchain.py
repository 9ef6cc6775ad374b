"""Whether torch.compile can build here (`model.toolchain`), and what the QK transform does when
it cannot: "auto" on CUDA falls back to the uncompiled transform and says why once; an explicit
"compile" is refused with the reason. Controls: this machine has the compilers and headers, so
the same calls answer "can" and pick "compile" when Triton is there."""

import logging
import sysconfig
from types import SimpleNamespace

import pytest
import torch

from model import fused_qk, toolchain
from model.fused_qk import resolve_impl
from model.toolchain import compile_unavailable

CUDA_INPUT = SimpleNamespace(device=torch.device("cuda"))  # resolve_impl reads only the device


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for var in ("CC", "CXX"):
        monkeypatch.delenv(var, raising=False)
    toolchain._unavailable.cache_clear()
    fused_qk._warn_no_compile.cache_clear()
    monkeypatch.setattr(toolchain, "_has_triton", lambda: True)  # as in the GPU image
    yield
    toolchain._unavailable.cache_clear()


def test_this_machine_can_compile_for_both_devices():
    assert compile_unavailable("cpu") is None and compile_unavailable("cuda") is None


def test_no_compiler_on_path_is_named_per_device(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no compiler
    assert compile_unavailable("cpu") == "torch.compile on cpu needs a C++ compiler (g++ / c++ / clang++ on PATH: not found)"
    assert compile_unavailable("cuda") == "torch.compile on cuda needs a C compiler (cc / gcc / clang on PATH: not found)"


def test_a_chosen_compiler_that_does_not_exist_and_no_triton(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(toolchain, "_has_triton", lambda: False)
    assert compile_unavailable("cuda") == (
        "torch.compile on cuda needs Triton (not importable), a C compiler ($CC='/nonexistent/cc': not found)"
    )
    assert compile_unavailable("cpu") is None  # $CC is the CUDA launcher's; CPU kernels build with g++


def test_missing_python_headers_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"include": str(tmp_path)})
    assert compile_unavailable("cuda") == f"torch.compile on cuda needs Python.h (not in {tmp_path})"


def test_auto_on_cuda_compiles_when_it_can_and_falls_back_once_with_the_reason(monkeypatch, tmp_path, caplog):
    assert resolve_impl("auto", CUDA_INPUT) == "compile"  # the control: everything there
    monkeypatch.setenv("PATH", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="model.fused_qk"):
        assert resolve_impl("auto", CUDA_INPUT) == "fused"  # training without autocast: the fused Functions
        assert resolve_impl("auto", CUDA_INPUT) == "fused"
    warned = [r.getMessage() for r in caplog.records if r.name == "model.fused_qk"]
    assert warned == [
        "QK transform: torch.compile on cuda needs a C compiler (cc / gcc / clang on PATH: not found); "
        "running it uncompiled (eager or fused) instead"
    ]


def test_an_explicit_compile_without_a_compiler_is_refused_with_the_reason(monkeypatch, tmp_path):
    x = torch.zeros(1)
    assert resolve_impl("compile", x) == "compile"  # the control
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match=r"cannot compile: torch.compile on cpu needs a C\+\+ compiler"):
        resolve_impl("compile", x)
