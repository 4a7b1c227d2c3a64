"""bench/native's build helper, without building: a missing toolchain is a clear error
naming the packages, and a built binary is reused while its sources are unchanged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import bench.native as native


def test_missing_tools_name_the_packages(monkeypatch, tmp_path):
    monkeypatch.setattr(
        shutil, "which", lambda t: None if t == "grpc_cpp_plugin" else f"/usr/bin/{t}"
    )
    with pytest.raises(native.NativeUnavailable) as err:
        native.loadgen_binary(tmp_path)
    assert "missing grpc_cpp_plugin" in str(err.value)
    assert "protobuf-compiler-grpc" in str(err.value)
    assert list(tmp_path.iterdir()) == []  # nothing half-built left behind


def test_a_built_binary_is_reused_until_a_source_changes(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda t: f"/usr/bin/{t}")
    builds: list[Path] = []

    def fake_build(out: Path) -> None:
        builds.append(out)
        (out / "loadgen").write_text("#!/bin/sh\n")

    monkeypatch.setattr(native, "_build", fake_build)
    first = native.loadgen_binary(tmp_path)
    assert native.loadgen_binary(tmp_path) == first
    assert len(builds) == 1

    source = tmp_path / "loadgen.cc"
    source.write_text("// changed\n")
    monkeypatch.setattr(native, "SOURCES", [source, *native.SOURCES[1:]])
    second = native.loadgen_binary(tmp_path)
    assert second != first and second.is_file()
    assert len(builds) == 2


def test_a_failed_build_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda t: f"/usr/bin/{t}")

    def failing_build(out: Path) -> None:
        (out / "half.o").write_text("")
        raise native.NativeUnavailable("g++ failed on loadgen.cc")

    monkeypatch.setattr(native, "_build", failing_build)
    with pytest.raises(native.NativeUnavailable, match="g\\+\\+ failed"):
        native.loadgen_binary(tmp_path)
    assert list(tmp_path.iterdir()) == []
