#!/usr/bin/env python3
"""Writes flashjit's platform wheel: the Python package with libflashjit.so (and the
LLVM plugin, libflashjit_llvm.so, where the build has one) inside it.

    scripts/make_wheel.py BUILD_DIR OUT_DIR

A wheel is a zip archive with a .dist-info directory (PEP 427); this writes one with
the standard library only, so no setuptools, wheel or network is needed. The tag is
py3-none-<platform>: the package is pure Python over ctypes, the libraries are the
platform part. The libraries keep their dependencies on the system: libfmt, and for
the plugin LLVM 22's libLLVM and libclang-cpp (Debian: libllvm22, libclang-cpp22).
"""
import base64
import hashlib
import pathlib
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent


def project_version():
    text = (ROOT / "python" / "pyproject.toml").read_text()
    m = re.search(r'^version = "([^"]+)"', text, re.M)
    if not m:
        sys.exit("make_wheel: no version in python/pyproject.toml")
    return m.group(1)


def record_line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def stripped(path, scratch):
    """The library without its debug sections (the build keeps them)."""
    out = scratch / path.name
    shutil.copyfile(path, out)
    strip = shutil.which("strip")
    if strip:
        subprocess.run([strip, "--strip-debug", str(out)], check=True)
    return out.read_bytes()


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    build, out_dir = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2])
    library = build / "runtime" / "libflashjit.so"
    plugin = build / "runtime" / "libflashjit_llvm.so"
    if not library.exists():
        sys.exit(f"make_wheel: {library} is missing: build flashjit first (scripts/setup.sh), "
                 "or set FLASHJIT_BUILD_DIR to a build that has it")
    version = project_version()
    machine = platform.machine()
    tag = f"py3-none-linux_{machine}"
    dist_info = f"flashjit-{version}.dist-info"

    files = {}  # archive name -> bytes
    for source in sorted((ROOT / "python" / "flashjit").glob("*.py")):
        files[f"flashjit/{source.name}"] = source.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = pathlib.Path(tmp)
        files["flashjit/libflashjit.so"] = stripped(library.resolve(), scratch)
        if plugin.exists():
            files["flashjit/libflashjit_llvm.so"] = stripped(plugin, scratch)
        else:
            print(f"make_wheel: {plugin} is missing (a build without LLVM): the wheel compiles "
                  "with nvrtc/hiprtc only and has no CPU emulator", file=sys.stderr)
    files[f"{dist_info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        "Name: flashjit\n"
        f"Version: {version}\n"
        "Summary: FlashAttention kernels generated at run time for AMD (and NVIDIA) GPUs\n"
        "License: MIT\n"
        "Requires-Python: >=3.9\n"
        "Provides-Extra: numpy\n"
        "Requires-Dist: numpy; extra == \"numpy\"\n"
        "Provides-Extra: torch\n"
        "Requires-Dist: torch; extra == \"torch\"\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        "Wheel-Version: 1.0\n"
        "Generator: flashjit scripts/make_wheel.py\n"
        "Root-Is-Purelib: false\n"
        f"Tag: {tag}\n").encode()
    files[f"{dist_info}/LICENSE"] = (ROOT / "LICENSE").read_bytes()
    files[f"{dist_info}/top_level.txt"] = b"flashjit\n"
    record_name = f"{dist_info}/RECORD"
    record = [record_line(name, data) for name, data in files.items()] + [f"{record_name},,"]
    files[record_name] = ("\n".join(record) + "\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"flashjit-{version}-{tag}.whl"
    partial = wheel.with_suffix(".whl.partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            executable = name.endswith(".so")
            info.external_attr = (0o755 if executable else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    partial.replace(wheel)
    print(wheel)


if __name__ == "__main__":
    main()
