"""What this machine's processor can do: the CPU's feature flags and whether bfloat16 runs
natively (the ``auto`` precision of the trainer and of the vLLM engine)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_flags() -> str | None:
    """The CPU's feature flags as ``/proc/cpuinfo`` lists them (x86_64 Linux), else None."""
    if platform.machine() != "x86_64":
        return None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1] + " " for line in text.splitlines() if line.startswith("flags")), "")


VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd"}
"""Short names of the x86 vendors (``vendor_id`` in ``/proc/cpuinfo``)."""


def cpuinfo(field: str) -> str | None:
    """The first ``field`` line of ``/proc/cpuinfo`` (``model name``, ``vendor_id``), its value
    stripped; None where the file or the field is absent."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(field)), None)


def cpu_vendor() -> str:
    """The CPU's maker: ``intel``, ``amd``, another x86 ``vendor_id`` lowercased, or the machine
    type (``aarch64``) where ``/proc/cpuinfo`` names none. Math libraries pick kernels by maker
    as well as by instruction set (MKL's sgemm rounds differently on an AMD EPYC than on an Intel
    Xeon at the same AVX2 level: docs/reliability.md)."""
    vendor = cpuinfo("vendor_id") or ""
    return VENDORS.get(vendor, vendor.lower()) or platform.machine().lower()


def native_bf16(*, cuda: bool | None = None, flags: str | None = None) -> bool:
    """Whether bfloat16 matrix products run natively here: on CUDA, a GPU that supports
    bfloat16; on an x86_64 CPU, the AVX512_BF16 or AMX_BF16 instructions (``flags``:
    :func:`cpu_flags` by default, and then only where torch dispatches AVX-512 kernels: a CPU
    forced to AVX2 kernels, as the tests force one to stand in for an AVX2-only machine, takes
    float32 like that machine). Without them bfloat16 is emulated and slower than float32.
    Measured on 2 cores with AVX512_BF16 (docs/benchmarks.md): the vLLM engine plays an easy
    task 1.7x faster and the update's forward and backward run 3x faster than in float32."""
    if cuda is None:
        cuda = torch.cuda.is_available()
    if cuda:
        return torch.cuda.is_bf16_supported()
    if flags is None:  # this machine: its flags, and torch's kernels at the level that uses them
        if not torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512"):
            return False  # ATEN_CPU_CAPABILITY=avx2 (with oneDNN's and MKL's caps) runs an AVX-512 CPU as an AVX2-only one
        flags = cpu_flags()
    return bool(flags) and (" avx512_bf16 " in f" {flags} " or " amx_bf16 " in f" {flags} ")


def make_accelerator(precision: str, **kwargs):
    """An ``accelerate.Accelerator`` with mixed precision ``precision`` (``no`` or ``bf16``).
    Accelerate keeps the first precision a process asked for and refuses another; one process
    that trains twice at different precisions (a notebook, the tests: ``mixed_precision:
    auto`` next to ``no``) has its accelerator state dropped first. The process-group state
    (``PartialState``) is kept, and a process of a multi-process launch is left alone (its
    precision is the launch's)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState

    state = AcceleratorState._shared_state
    if state and state.get("_mixed_precision") != precision and PartialState().num_processes == 1:
        AcceleratorState._reset_state()  # as Accelerate's own test utilities and notebook launcher do
    return Accelerator(mixed_precision=precision, **kwargs)


FLAGS_THAT_MATTER = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16")
"""The CPU flags that choose the kernels and the precision of the workbook's runs."""


def describe() -> dict:
    """This machine as the workbook's numbers depend on it: the CPU model and maker, which of
    :data:`FLAGS_THAT_MATTER` it has, torch's kernel level (``torch.backends.cpu.get_cpu_capability``),
    cores, and the precision ``auto`` chooses (bf16 where :func:`native_bf16`, else float32)."""
    flags = (cpu_flags() or "").split()
    model = cpuinfo("model name") or platform.processor()
    bf16 = native_bf16()
    return {"cpu": model, "vendor": cpu_vendor(), "cores": os.cpu_count(), "flags": {f: f in flags for f in FLAGS_THAT_MATTER},
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "cuda": torch.cuda.is_available(),
            "native_bf16": bf16, "auto_precision": "bf16" if bf16 else "float32"}


if __name__ == "__main__":  # python -m sera_core.utils.hardware: one JSON line (CI prints it before the tests)
    import json

    print(json.dumps(describe()))
