"""The ctypes declarations of the CUDA driver calls (sim/validation/cuda_device.py) agree
with cuda.h.

The policy backend drives CUDA's virtual-memory API through ctypes; a wrong struct layout or a
parameter of the wrong width would corrupt the call on a GPU, silently. Where a C compiler and
CUDA's headers are installed (CUDA_HOME, or /usr/local/cuda), this compiles a small program
against cuda.h that prints the layouts, the parameter widths and the constants, and compares
them with the Python side. No GPU and no driver are needed.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from allocsim.sim.validation import cuda_device
from allocsim.sim.validation.cuda_device import (
    CUDA_ERROR_MEMORY_ALLOCATION,
    DRIVER_SIGNATURES,
    CudaVMM,
    _CUmemAccessDesc,
    _CUmemAllocationProp,
    _CUmemLocation,
)


def _cuda_include() -> Path | None:
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "include" / "cuda.h").exists():
            return Path(root) / "include"
    return None


INCLUDE = _cuda_include()
COMPILER = shutil.which("cc") or shutil.which("gcc")
pytestmark = pytest.mark.skipif(INCLUDE is None or COMPILER is None,
                                reason="needs cuda.h (CUDA_HOME or /usr/local/cuda) and a C "
                                       "compiler")

STRUCTS = {"CUmemLocation": _CUmemLocation, "CUmemAllocationProp": _CUmemAllocationProp,
           "CUmemAccessDesc": _CUmemAccessDesc}    # C type -> its ctypes mirror
CONSTANTS = {
    "CU_MEM_ALLOCATION_TYPE_PINNED": CudaVMM.CU_MEM_ALLOCATION_TYPE_PINNED,
    "CU_MEM_LOCATION_TYPE_DEVICE": CudaVMM.CU_MEM_LOCATION_TYPE_DEVICE,
    "CU_MEM_ACCESS_FLAGS_PROT_READWRITE": CudaVMM.CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    "CUDA_ERROR_OUT_OF_MEMORY": CudaVMM.CUDA_ERROR_OUT_OF_MEMORY,
    "CU_MEM_ALLOC_GRANULARITY_MINIMUM": 0,             # the option CudaVMM passes
    "cudaErrorMemoryAllocation": CUDA_ERROR_MEMORY_ALLOCATION,
}


def _prototypes(header: str) -> dict[str, list[str]]:
    """name -> parameter types, for the functions DRIVER_SIGNATURES names, from cuda.h."""
    out = {}
    for name in DRIVER_SIGNATURES:
        match = re.search(rf"CUresult\s+CUDAAPI\s+{name}\s*\(([^)]*)\)\s*;", header)
        assert match, f"cuda.h declares no {name}"
        types = []
        for parameter in match.group(1).split(","):
            parameter = " ".join(parameter.split())
            # Drop the parameter's name: the last identifier, unless the type is all there is.
            typed = re.match(r"(.*?[\s*])(\w+)$", parameter)
            types.append((typed.group(1) if typed else parameter).strip())
        out[name] = types
    return out


def _fields(structure: type, prefix: str = "") -> list[tuple[str, type]]:
    out = []
    for name, kind, *_ in structure._fields_:
        if isinstance(kind, type) and issubclass(kind, ctypes.Structure):
            out += _fields(kind, f"{prefix}{name}.")
        else:
            out.append((f"{prefix}{name}", kind))
    return out


def _ctypes_offset(structure: type, dotted: str) -> int:
    offset, kind = 0, structure
    for part in dotted.split("."):
        descriptor = getattr(kind, part)
        offset += descriptor.offset
        kind = {n: t for n, t, *_ in kind._fields_}[part]
    return offset


@pytest.fixture(scope="module")
def from_c(tmp_path_factory) -> dict[str, int]:
    header = (INCLUDE / "cuda.h").read_text(errors="replace")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <cuda.h>",
             "#include <driver_types.h>", "int main(void) {"]
    for c_type, structure in STRUCTS.items():
        lines.append(f'printf("sizeof {c_type} %zu\\n", sizeof({c_type}));')
        for dotted, _kind in _fields(structure):
            lines.append(f'printf("offsetof {c_type}.{dotted} %zu\\n", '
                         f'offsetof({c_type}, {dotted}));')
    for name, types in _prototypes(header).items():
        for index, c_type in enumerate(types):
            lines.append(f'printf("param {name}.{index} %zu\\n", sizeof({c_type}));')
            if c_type.endswith("*"):
                pointee = c_type[:-1].strip()
                lines.append(f'printf("pointee {name}.{index} %zu\\n", sizeof({pointee}));')
        lines.append(f'printf("params {name} %d\\n", {len(types)});')
    for name in CONSTANTS:
        lines.append(f'printf("const {name} %lld\\n", (long long){name});')
    lines += ["return 0;", "}"]
    folder = tmp_path_factory.mktemp("abi")
    source, program = folder / "abi.c", folder / "abi"
    source.write_text("\n".join(lines) + "\n")
    subprocess.run([COMPILER, f"-I{INCLUDE}", str(source), "-o", str(program)], check=True,
                   capture_output=True, text=True)
    out = subprocess.run([str(program)], check=True, capture_output=True, text=True).stdout
    return {key: int(value) for key, value in
            (line.rsplit(" ", 1) for line in out.splitlines())}


@pytest.mark.parametrize("c_type", sorted(STRUCTS))
def test_struct_layouts_match_cuda_h(from_c, c_type: str) -> None:
    structure = STRUCTS[c_type]
    assert ctypes.sizeof(structure) == from_c[f"sizeof {c_type}"]
    for dotted, _kind in _fields(structure):
        assert _ctypes_offset(structure, dotted) == from_c[f"offsetof {c_type}.{dotted}"], dotted


@pytest.mark.parametrize("name", sorted(DRIVER_SIGNATURES))
def test_driver_call_parameters_have_cuda_h_widths(from_c, name: str) -> None:
    argtypes = DRIVER_SIGNATURES[name]
    assert len(argtypes) == from_c[f"params {name}"]
    for index, argtype in enumerate(argtypes):
        assert ctypes.sizeof(argtype) == from_c[f"param {name}.{index}"], (name, index)
        pointee = from_c.get(f"pointee {name}.{index}")
        if pointee is not None:
            assert hasattr(argtype, "_type_") and issubclass(argtype, ctypes._Pointer), \
                (name, index, "cuda.h takes a pointer here")
            assert ctypes.sizeof(argtype._type_) == pointee, (name, index)
        else:
            assert not issubclass(argtype, ctypes._Pointer), (name, index)


def test_constants_match_cuda_h(from_c) -> None:
    for name, value in CONSTANTS.items():
        assert value == from_c[f"const {name}"], name


def test_the_checked_module_is_the_one_the_validator_uses() -> None:
    assert cuda_device.CudaVMM is CudaVMM
