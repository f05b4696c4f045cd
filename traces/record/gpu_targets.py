"""The GPUs XLA:GPU can compile for without one: a ``GpuTargetConfigProto`` per device profile.

``gpu_targets/NAME.txtpb`` holds, for each device profile of ``allocsim devices`` (``h100-80g``,
``a100-40g``, ``l4-24g``, ...), the target config XLA:GPU compiles against when no GPU is
present (``jax.experimental.topologies.get_topology_desc(platform="cuda",
target_config=TEXT)``; the text format of openxla/xla ``xla/tools/hlo_opt/gpu_specs/a100.txtpb``).
Its ``device_memory_size`` is the profile's capacity, so the compiler (whose schedulers read
it) and the simulated device agree; tests/test_gpu_targets.py holds them to it.

:func:`target_config` takes a profile name or the path of a ``.txtpb`` file and checks the
fields the compile and the simulation need; a name it does not know or a damaged file is a
:class:`~allocsim.errors.UserInputError` in one line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from allocsim.ascii_numbers import is_whole_number
from allocsim.errors import UserInputError

__all__ = ["TARGETS_DIR", "TargetConfig", "target_config", "target_names"]

TARGETS_DIR = Path(__file__).resolve().parent / "gpu_targets"
_MAX_BYTES = 1 << 20  # a target config is a few hundred bytes
_FIELD = {name: re.compile(rf"^\s*{name}:\s*(\S+)\s*$", re.M)
          for name in ("device_memory_size", "core_count", "threads_per_warp")}
_CAPABILITY = re.compile(r"cuda_compute_capability\s*\{([^}]*)\}")
_DESCRIPTION = re.compile(r'^device_description_str:\s*"([^"\n]*)"\s*$', re.M)


@dataclass(frozen=True)
class TargetConfig:
    """A GPU target: its name, the proto text and the facts allocsim reads from it."""

    name: str
    text: str
    device_memory_size: int
    compute_capability: str     # "9.0"
    description: str            # "NVIDIA H100 80GB HBM3"


def target_names() -> list[str]:
    """The built-in targets (one per device profile)."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.txtpb"))


def _integer(text: str, name: str, source: str) -> int:
    m = _FIELD[name].search(text)
    if m is None or not is_whole_number(m.group(1)) or int(m.group(1)) < 1:
        raise UserInputError(f"{source}: damaged GPU target config: no positive {name} in "
                             "gpu_device_info")
    return int(m.group(1))


def parse_target(text: str, name: str, source: str) -> TargetConfig:
    """Check the proto text enough to compile against and simulate it."""
    if "gpu_device_info" not in text or not re.search(r'platform_name:\s*"CUDA"', text):
        raise UserInputError(f"{source}: damaged GPU target config: a GpuTargetConfigProto "
                             'has gpu_device_info { ... } and platform_name: "CUDA"')
    if text.count("{") != text.count("}"):
        raise UserInputError(f"{source}: damaged GPU target config: unbalanced braces "
                             "(cut short?)")
    memory = _integer(text, "device_memory_size", source)
    _integer(text, "core_count", source)
    capability = _CAPABILITY.search(text)
    major = re.search(r"major:\s*(\d+)", capability.group(1)) if capability else None
    if major is None:
        raise UserInputError(f"{source}: damaged GPU target config: no "
                             "cuda_compute_capability { major: N }")
    minor = re.search(r"minor:\s*(\d+)", capability.group(1)) if capability else None
    description = _DESCRIPTION.search(text)
    return TargetConfig(name, text, memory, f"{major.group(1)}.{minor.group(1) if minor else 0}",
                        description.group(1) if description else name)


def target_config(target: str | Path) -> TargetConfig:
    """The target named ``target`` (a device profile name) or in the file ``target``."""
    text_name = str(target)
    if text_name in target_names():
        path = TARGETS_DIR / f"{text_name}.txtpb"
        return parse_target(path.read_text(), text_name, str(path))
    path = Path(text_name)
    if path.suffix in (".txtpb", ".pbtxt", ".txt") or path.is_file():
        try:
            if path.stat().st_size > _MAX_BYTES:
                raise UserInputError(f"{path}: a GPU target config is a few hundred bytes; "
                                     "this file is larger than 1 MiB")
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise UserInputError(f"{path}: cannot read the GPU target config: "
                                 f"{getattr(err, 'strerror', None) or err}") from None
        return parse_target(text, path.stem, str(path))
    raise UserInputError(f"unknown GPU target {text_name!r} (known: {', '.join(target_names())}; "
                         "or the path of a GpuTargetConfigProto .txtpb file)")
