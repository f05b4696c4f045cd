"""Safe unpickling of PyTorch memory snapshots: plain data in, never code.

A snapshot (``torch.cuda.memory._dump_snapshot``) holds only dicts, lists, tuples, str, int,
float, bool and None, so :func:`load_pickle` refuses every class (``collections.OrderedDict``
excepted, which old files use) and every persistent id: a crafted pickle cannot run code, it
gets a one-line :class:`~allocsim.traces.model.TraceError`.
"""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
from typing import Any

from allocsim.traces.model import TraceError

__all__ = ["load_pickle"]


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds plain data only: every class lookup is refused, so no
    ``__reduce__`` payload (``os.system``, ``eval``, ...) can be reached."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict  # old snapshots; a dict subclass, harmless
        raise TraceError(f"refuses to load class {module}.{name}: a snapshot holds only "
                         "plain data")

    def persistent_load(self, pid: Any) -> Any:
        raise TraceError("refuses a persistent id: a snapshot holds only plain data")


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


# BYTEARRAY8 (protocol 5): CPython's C unpickler allocates the length it claims before reading,
# and on a MemoryError prints "SystemError: deallocated bytearray object has exported buffers"
# to stderr itself (a second line no caller can catch). No snapshot uses it (they are protocol
# 2-4), so a stream holding the byte is first read op by op by pickletools, which checks each
# length against the bytes that remain without allocating it.
_BYTEARRAY8 = b"\x96"


def load_pickle(data: bytes, source: str = "<snapshot>") -> Any:
    """Unpickle ``data`` refusing every class (see :class:`_SafeUnpickler`); one-line
    :class:`TraceError` naming ``source`` for anything that is not a readable plain pickle."""
    try:
        if _BYTEARRAY8 in data:
            for _ in pickletools.genops(data):
                pass
        return _SafeUnpickler(io.BytesIO(data)).load()
    except TraceError as err:
        raise err.located(source) from None
    except RecursionError:
        raise TraceError("not a readable pickle: nested too deeply", source=source) from None
    except Exception as err:
        raise TraceError(f"not a readable pickle: {_one_line(err)}", source=source) from None
