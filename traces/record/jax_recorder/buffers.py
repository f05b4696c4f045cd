"""The JAX recorder's buffer bookkeeping: which device buffers are alive, which Arrays hold them.

:class:`~allocsim.traces.record.jax_recorder.recorder.JaxRecorder` hooks JAX's dispatch and asks
this module what each event means for the buffers it follows; nothing here knows the hooks.

- :class:`DevicePlacement` says where an array's bytes are on the recorded device: how many,
  and at which device pointer (a sharded array's shard there).
- :class:`BufferBook` follows the buffers. Each tracked Array is a weak reference (:class:`Ref`)
  carrying the buffer id and size its free will carry. Buffers, not Arrays, are counted: the
  Arrays on one device pointer (``holders``) are one buffer, freed when the last of them goes,
  or at once when one is deleted or donated (JAX deletes the shared buffer under all of its
  Arrays). A pointer whose Arrays are all deleted is stale (a deletion the hooks did not see)
  and is freed before a new buffer takes its address.

Events are kept as one ``array('q')`` of ``(time, op, buffer id, size, tag)`` rows, appended
in one call each, so a weak-reference callback that fires in the middle of a hook (CPython
runs them whenever an array's last reference goes) cannot tear a row.
"""

from __future__ import annotations

import itertools
import math
import time
import weakref
from array import array
from typing import Any

import numpy as np

from allocsim.traces.model import OP_ALLOC, OP_FREE

__all__ = ["FIELDS", "BufferBook", "DevicePlacement", "Ref"]

FIELDS = 5  # time, op, buffer id, size, tag


class Ref(weakref.ref):
    """A tracked array: the buffer id and size its free will carry, and the device pointer
    of that buffer on the recorded device (-1: unknown; the buffer is then its own)."""

    __slots__ = ("bid", "key", "pointer", "size", "tag")
    bid: int
    key: int
    pointer: int
    size: int
    tag: int


class DevicePlacement:
    """Where an array's bytes are on ``device``, the recorded device (one answer per sharding,
    kept)."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self._modes: dict[Any, tuple[int, int]] = {}  # sharding -> (mode, shard index)

    def of(self, sharding: Any) -> tuple[int, int]:
        """``(mode, index)``: mode 0 the array has nothing on the recorded device, 1 it lives
        there alone, 2 it has a shard there, ``addressable_data(index)``."""
        placement = self._modes.get(sharding)
        if placement is None:
            devices = sharding.device_set
            if self.device not in devices:
                placement = (0, -1)
            elif len(devices) == 1:
                placement = (1, 0)
            else:
                order = list(sharding._addressable_device_assignment)
                placement = (2, order.index(self.device))
            self._modes[sharding] = placement
        return placement

    def device_bytes(self, array_: Any) -> int | None:
        """Bytes ``array_`` holds on the recorded device (None: it holds none there)."""
        mode = self.of(array_.sharding)[0]
        if mode == 1:
            return int(array_.nbytes)
        if mode == 0:
            return None
        shard = array_.sharding.shard_shape(array_.shape)
        return math.prod(shard) * array_.dtype.itemsize

    def pointer(self, array_: Any) -> int:
        """The device pointer of ``array_``'s buffer on the recorded device (-1: none known:
        deleted, or a backend without pointers)."""
        try:
            mode, index = self.of(array_.sharding)
            if mode == 1:
                return int(array_.unsafe_buffer_pointer())
            if mode == 2:
                shard = array_.addressable_data(index)
                return int(shard.unsafe_buffer_pointer())
        except Exception:  # deleted under us, or no pointers on this backend
            pass
        return -1


class BufferBook:
    """The buffers a recording follows and the event rows it has written.

    :meth:`start` hands it the recorded device's :class:`DevicePlacement` and sets time zero;
    :attr:`tags` are the tag names the rows' tag column indexes.
    """

    def __init__(self) -> None:
        self.events = array("q")
        self.tags: list[str] = []
        self.place: DevicePlacement | None = None  # set by start()
        self._tag_ids: dict[str, int] = {}
        self._live: dict[int, Ref] = {}                # id(array) -> its reference
        self._holders: dict[int, list[Ref]] = {}       # device pointer -> the Arrays on it
        self._ids = itertools.count()
        self._t0 = time.perf_counter_ns()

    def start(self, place: DevicePlacement) -> None:
        """Recording starts now, on the device ``place`` describes."""
        self.place = place
        self._t0 = time.perf_counter_ns()

    def stop(self) -> None:
        """Recording ended: the weak references go, their callbacks never run."""
        self._live.clear()

    # ------------------------------------------------------------------ rows
    def __len__(self) -> int:
        return len(self.events) // FIELDS

    def rows(self) -> np.ndarray:
        """The events so far, one ``(time, op, buffer id, size, tag)`` row each."""
        return np.array(self.events, dtype=np.int64).reshape(-1, FIELDS)

    def tag(self, name: str) -> int:
        """The tag id of ``name`` (a new one the first time)."""
        tag = self._tag_ids.get(name)
        if tag is None:
            tag = self._tag_ids[name] = len(self.tags)
            self.tags.append(name)
        return tag

    def emit(self, op: int, bid: int, size: int, tag: int) -> None:
        self.events.extend((time.perf_counter_ns() - self._t0, op, bid, size, tag))

    def alloc(self, size: int, tag: int) -> int:
        """Emit the alloc of a new buffer of ``size`` bytes; its buffer id."""
        bid = next(self._ids)
        self.emit(OP_ALLOC, bid, size, tag)
        return bid

    # ------------------------------------------------------------------ tracked Arrays
    def tracked(self, array_: Any) -> Ref | None:
        """The reference following ``array_``, or None."""
        ref = self._live.get(id(array_))
        return ref if ref is not None and ref() is array_ else None

    def _dead(self, ref: Ref) -> None:
        """Weak-reference callback: the program dropped a tracked array."""
        holders = self._holders.get(ref.pointer) if ref.pointer >= 0 else None
        if holders is not None and any(r is ref for r in holders):
            self._forget([ref])
            holders[:] = [r for r in holders if r is not ref]
            if any(_holds(r) for r in holders):
                return  # another Array still holds the buffer
            self._forget(holders)
            del self._holders[ref.pointer]
        elif self._live.get(ref.key) is ref:
            del self._live[ref.key]
        else:
            return  # released already (deleted, donated): freed then
        self.emit(OP_FREE, ref.bid, ref.size, ref.tag)

    def _held(self, pointer: int, size: int) -> Ref | None:
        """A live, undeleted Array holding the tracked buffer of ``size`` bytes at
        ``pointer``, or None."""
        holders = self._holders.get(pointer) if pointer >= 0 else None
        if holders:
            for ref in holders:
                if _holds(ref):
                    return ref if ref.size == size else None
        return None

    def track(self, array_: Any, tag: int, bid: int | None = None,
              size: int | None = None, view_of: Ref | bool | None = None) -> None:
        """Start following ``array_``; emits its alloc unless it takes over buffer ``bid``
        or views a tracked buffer: that of ``view_of`` (the Array it was made from) when it
        has its device pointer, any tracked buffer with its pointer when ``view_of`` is
        True (the arrays alive when recording starts, whose origin is unknown)."""
        place = self.place
        if place is None:
            raise RuntimeError("BufferBook.track before start()")
        if size is None:
            try:
                if array_.is_deleted():
                    return
                size = place.device_bytes(array_)
            except Exception:  # an array JAX cannot describe (deleted under us)
                return
            if size is None:
                return
        ref = Ref(array_, self._dead)
        ref.key, ref.size, ref.tag = id(array_), size, tag
        ref.pointer = pointer = place.pointer(array_)
        if bid is None:
            if view_of is True:
                source = self._held(pointer, size)
            elif isinstance(view_of, Ref) and view_of.pointer == pointer:
                source = self._held(pointer, size)
            else:
                source = None
            if source is not None:  # a second Array on a buffer already counted
                ref.bid, ref.tag = source.bid, source.tag
                self._holders[pointer].append(ref)
                self._live[ref.key] = ref
                return
            ref.bid = self.alloc(size, tag)
        else:
            ref.bid = bid
        self._live[ref.key] = ref
        if pointer < 0:
            return
        holders = self._holders.get(pointer)
        if holders and any(_holds(r) for r in holders):
            # Another buffer at this address, alive: XLA:CPU aliases a numpy array's memory
            # (device_put of one numpy array twice); on a GPU these are two buffers.
            ref.pointer = -1
            return
        if holders:  # all deleted, unseen by the hooks: that buffer went before this one
            first = holders[0]
            self._forget(holders)
            self.emit(OP_FREE, first.bid, first.size, first.tag)
        self._holders[pointer] = [ref]

    def _forget(self, refs: list[Ref]) -> None:
        for ref in refs:
            if self._live.get(ref.key) is ref:
                del self._live[ref.key]

    def release(self, ref: Ref) -> None:
        """A tracked array's buffer went (deleted, donated): free it now, for every Array on
        it (JAX deletes a shared buffer under all of its Arrays)."""
        holders = self._holders.get(ref.pointer) if ref.pointer >= 0 else None
        if holders is not None and any(r is ref for r in holders):
            self._forget(holders)
            del self._holders[ref.pointer]
        elif self._live.get(ref.key) is ref:
            del self._live[ref.key]
        else:
            return  # freed already (a stale pointer found, or a view released first)
        self.emit(OP_FREE, ref.bid, ref.size, ref.tag)

    def take_over(self, donated: Ref, array_: Any) -> None:
        """``array_`` holds the buffer of ``donated`` (donation: XLA's input-output alias,
        or a donating device_put): it keeps that buffer's id, nothing is allocated."""
        holders = self._holders.pop(donated.pointer, None) if donated.pointer >= 0 else None
        self._forget(holders if holders is not None else [donated])
        self.track(array_, donated.tag, bid=donated.bid, size=donated.size)


def _holds(ref: Ref) -> bool:
    """Whether the Array ``ref`` follows is alive and not deleted."""
    array_ = ref()
    if array_ is None:
        return False
    try:
        return not array_.is_deleted()
    except Exception:
        return False
