"""What the PyTorch snapshot tests share (tests/test_torch_snapshot.py,
test_torch_snapshot_export.py): the real snapshots' paths, an independent plain reading of a
pickle, builders of synthetic snapshot entries, and the one-line-error check. Facts about the
real snapshots are computed by a plain walk over the pickle's entries, never by calling the
module under test.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import allocsim.traces.formats.torch_snapshot as ts
from allocsim.traces.model import Trace, TraceError

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
EOR = SHARED / "torch-snapshot-eor.pickle"
LM = SHARED / "torch-snapshot-lm-inference.pickle"
REAL = [pytest.param(EOR, id="eor"), pytest.param(LM, id="lm-inference")]
ACTIVE = ("active_allocated", "active_pending_free", "active_awaiting_free")
REFERENCE = ("segment_alloc", "segment_free", "segment_map", "segment_unmap", "oom", "snapshot")
MiB = 1 << 20


def need(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"{path} is not here (shared traces are absent)")
    return path


# ---------------------------------------------------------------------- independent reading
class PlainUnpickler(pickle.Unpickler):
    """The test's own reader: plain data only (it must not share code with the module)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"class {module}.{name} in a test snapshot")


def raw_snapshot(path: Path) -> dict:
    with open(path, "rb") as f:
        return PlainUnpickler(f).load()


def active_requested_bytes(snapshot: dict, device: int = 0) -> int:
    return sum(b["requested_size"] for seg in snapshot["segments"]
               if seg.get("device", device) == device
               for b in seg["blocks"] if b["state"] in ACTIVE)


# ---------------------------------------------------------------------- synthetic snapshots
def entry(action: str, addr: int, size: int, stream: int = 0, t: float | None = None,
          frames: list | None = None, **extra: Any) -> dict:
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "frames": frames or []}
    if t is not None:
        e["time_us"] = t
    e.update(extra)
    return e


def block(address: int, size: int, requested: int, state: str) -> dict:
    return {"address": address, "size": size, "requested_size": requested, "state": state,
            "frames": []}


def segment(address: int, total: int, blocks: list[dict], stream: int = 0, device: int = 0,
            kind: str = "large", expandable: bool = False) -> dict:
    return {"device": device, "address": address, "total_size": total, "stream": stream,
            "segment_type": kind, "is_expandable": expandable, "frames": [], "blocks": blocks}


def read(obj: Any, **options: Any) -> Trace:
    return ts.read_snapshot(pickle.dumps(obj, protocol=2), "snap.pickle", "snap", **options)


def one_line_error(call, *args, **kwargs) -> TraceError:
    with pytest.raises(TraceError) as caught:
        call(*args, **kwargs)
    assert "\n" not in str(caught.value)
    return caught.value


def walk_plain(value: Any) -> None:
    """Fail unless ``value`` is made of dicts, lists, str, int, float, bool and None only."""
    if isinstance(value, dict):
        for k, v in value.items():
            assert type(k) is str
            walk_plain(v)
    elif isinstance(value, list):
        for v in value:
            walk_plain(v)
    else:
        assert value is None or type(value) in (str, int, float, bool), type(value)


def events_of(trace: Trace) -> list[tuple[int, int, int, int]]:
    return list(zip(trace.op.tolist(), trace.size.tolist(), trace.stream.tolist(),
                    trace.time_ns.tolist()))
