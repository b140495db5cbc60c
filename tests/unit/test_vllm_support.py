"""The vLLM fixture's choice of dtype (tests/support/vllm.py), from the CPU's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.vllm import dtype


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n\nprocessor\t: 1\n")
    return path


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ("avx2 avx512f avx512_bf16", "bfloat16"),
        ("avx2 amx_tile amx_bf16", "bfloat16"),
        ("avx2 avx512f", "float32"),  # AVX-512 without its bf16 extension
        ("avx avx2", "float32"),
    ],
)
def test_bf16_only_where_the_cpu_computes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: str, expected: str
) -> None:
    monkeypatch.delenv("VLLM_DTYPE", raising=False)
    assert dtype(_cpuinfo(tmp_path, flags)) == expected


def test_the_environment_overrides_and_no_cpuinfo_means_fp32(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_DTYPE", raising=False)
    assert dtype(tmp_path / "missing") == "float32"
    monkeypatch.setenv("VLLM_DTYPE", "bfloat16")
    assert dtype(_cpuinfo(tmp_path, "avx2")) == "bfloat16"
