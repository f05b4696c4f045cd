"""A small reader (and writer) of the protobuf wire format for the profiler's XSpace files.

``.xplane.pb`` is one serialized ``XSpace`` message (tsl/profiler/protobuf/xplane.proto, the
same in TensorFlow, JAX/XLA and the tensorboard-plugin-profile). The field numbers used here,
read off that file (and checked against the descriptor of the ``xplane_pb2`` module TensorFlow
ships, ``tensorflow/tsl/profiler/protobuf/xplane_pb2.py``):

==================  ====================================================================
message             fields
==================  ====================================================================
``XSpace``          1 planes (XPlane, repeated), 2 errors, 3 warnings, 4 hostnames
``XPlane``          1 id, 2 name, 3 lines (XLine), 4 event_metadata (map<int64,
                    XEventMetadata>), 5 stat_metadata (map<int64, XStatMetadata>), 6 stats
``XLine``           1 id, 10 display_id, 2 name, 11 display_name, 3 timestamp_ns,
                    9 duration_ps, 4 events (XEvent)
``XEvent``          1 metadata_id, 2 offset_ps | 5 num_occurrences (oneof), 3 duration_ps,
                    4 stats (XStat)
``XStat``           1 metadata_id, then one of 2 double_value (fixed64), 3 uint64_value,
                    4 int64_value, 5 str_value, 6 bytes_value, 7 ref_value (an XStatMetadata
                    id whose name is the string)
``XEventMetadata``  1 id, 2 name, 4 display_name, 3 metadata (bytes), 5 stats, 6 child_id
``XStatMetadata``   1 id, 2 name, 3 description
==================  ====================================================================

A map entry is a message with the key as field 1 and the value as field 2.

Why a reader of our own rather than the ``protobuf`` package: reading a profile must not need
TensorFlow (whose ``xplane_pb2`` is the only ready-made binding), and the ``protobuf`` package
alone would still need the message classes built from a descriptor; seven messages of plain
scalar, string and sub-message fields are ~150 lines of wire-format decoding with no
dependency, and a damaged file fails with our own one-line error (:class:`WireError`) at the
byte where it breaks. The reader also skips, without decoding them, the events whose metadata
is not asked for — most of a profile is op events, not memory records.

:func:`encode_xspace` writes the same messages (tests build synthetic profiles with it, e.g.
the JAX-on-GPU shape, which cannot be recorded on a CPU).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

__all__ = ["Plane", "RawEvent", "WireError", "encode_xspace", "read_xspace", "varint"]

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
StatValue = int | float | str | bytes


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (truncated, or not protobuf)."""


def varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise WireError(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise WireError(f"varint longer than 10 bytes at byte {pos}")


def fields(data: bytes, pos: int = 0, end: int | None = None
           ) -> Iterator[tuple[int, int, int, int]]:
    """Every field of the message in ``data[pos:end]`` as ``(number, wire type, a, b)``: for a
    varint or fixed field ``a`` is the value (fixed64 as raw bits) and ``b`` 0; for a
    length-delimited one ``[a, b)`` is its payload."""
    end = len(data) if end is None else end
    while pos < end:
        key, pos = varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = varint(data, pos, end)
            yield number, wire, value, 0
        elif wire == FIXED64:
            if pos + 8 > end:
                raise WireError(f"truncated fixed64 field at byte {pos}")
            yield number, wire, int.from_bytes(data[pos:pos + 8], "little"), 0
            pos += 8
        elif wire == LENGTH:
            length, pos = varint(data, pos, end)
            if pos + length > end:
                raise WireError(f"field {number} runs past the end ({pos + length} > {end})")
            yield number, wire, pos, pos + length
            pos += length
        elif wire == FIXED32:
            if pos + 4 > end:
                raise WireError(f"truncated fixed32 field at byte {pos}")
            yield number, wire, int.from_bytes(data[pos:pos + 4], "little"), 0
            pos += 4
        else:
            raise WireError(f"wire type {wire} (groups or garbage) at byte {pos}")


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _text(data: bytes, a: int, b: int) -> str:
    return data[a:b].decode("utf-8", errors="replace")


@dataclass
class RawEvent:
    """One XEvent of a line: metadata id, time in picoseconds from the line's start, stats as
    ``{stat metadata id: value}`` (a ref_value as ``("ref", id)``)."""

    metadata_id: int
    offset_ps: int
    duration_ps: int
    stats: list[tuple[int, StatValue | tuple[str, int]]]


@dataclass
class Plane:
    id: int
    name: str
    event_names: dict[int, str] = field(default_factory=dict)
    event_stats: dict[int, list[tuple[int, StatValue | tuple[str, int]]]] = \
        field(default_factory=dict)
    stat_names: dict[int, str] = field(default_factory=dict)
    # (line id, line name, line timestamp_ns, events of the wanted names, in file order)
    lines: list[tuple[int, str, int, list[RawEvent]]] = field(default_factory=list)


def _stat(data: bytes, a: int, b: int) -> tuple[int, StatValue | tuple[str, int]]:
    metadata_id = 0
    value: StatValue | tuple[str, int] = 0
    for number, wire, x, y in fields(data, a, b):
        if number == 1 and wire == VARINT:
            metadata_id = x
        elif number == 2 and wire == FIXED64:
            value = struct.unpack("<d", x.to_bytes(8, "little"))[0]
        elif number == 3 and wire == VARINT:
            value = x
        elif number == 4 and wire == VARINT:
            value = _signed(x)
        elif number == 5 and wire == LENGTH:
            value = _text(data, x, y)
        elif number == 6 and wire == LENGTH:
            value = bytes(data[x:y])
        elif number == 7 and wire == VARINT:
            value = ("ref", x)
    return metadata_id, value


def _map_entry(data: bytes, a: int, b: int) -> tuple[int, int, int]:
    key, start, stop = 0, b, b
    for number, wire, x, y in fields(data, a, b):
        if number == 1 and wire == VARINT:
            key = _signed(x)
        elif number == 2 and wire == LENGTH:
            start, stop = x, y
    return key, start, stop


def _plane(data: bytes, a: int, b: int, wanted: Callable[[str], bool]) -> Plane:
    plane = Plane(0, "")
    line_slices: list[tuple[int, int]] = []
    for number, wire, x, y in fields(data, a, b):
        if number == 1 and wire == VARINT:
            plane.id = _signed(x)
        elif number == 2 and wire == LENGTH:
            plane.name = _text(data, x, y)
        elif number == 3 and wire == LENGTH:
            line_slices.append((x, y))
        elif number == 4 and wire == LENGTH:
            key, start, stop = _map_entry(data, x, y)
            name, stats = "", []
            for n, w, p, q in fields(data, start, stop):
                if n == 2 and w == LENGTH:
                    name = _text(data, p, q)
                elif n == 5 and w == LENGTH:
                    stats.append(_stat(data, p, q))
            plane.event_names[key] = name
            if stats:
                plane.event_stats[key] = stats
        elif number == 5 and wire == LENGTH:
            key, start, stop = _map_entry(data, x, y)
            for n, w, p, q in fields(data, start, stop):
                if n == 2 and w == LENGTH:
                    plane.stat_names[key] = _text(data, p, q)
    keep = {k for k, name in plane.event_names.items() if wanted(name)}
    for x, y in line_slices:
        plane.lines.append(_line(data, x, y, keep))
    return plane


def _line(data: bytes, a: int, b: int, keep: set[int]) -> tuple[int, str, int, list[RawEvent]]:
    line_id, name, timestamp_ns = 0, "", 0
    events: list[RawEvent] = []
    for number, wire, x, y in fields(data, a, b):
        if number == 1 and wire == VARINT:
            line_id = _signed(x)
        elif number == 2 and wire == LENGTH:
            name = _text(data, x, y)
        elif number == 3 and wire == VARINT:
            timestamp_ns = _signed(x)
        elif number == 4 and wire == LENGTH:
            event = _event(data, x, y, keep)
            if event is not None:
                events.append(event)
    return line_id, name, timestamp_ns, events


def _event(data: bytes, a: int, b: int, keep: set[int]) -> RawEvent | None:
    event = RawEvent(0, 0, 0, [])
    for number, wire, x, y in fields(data, a, b):
        if number == 1 and wire == VARINT:
            if x not in keep:
                return None
            event.metadata_id = x
        elif number == 2 and wire == VARINT:
            event.offset_ps = _signed(x)
        elif number == 3 and wire == VARINT:
            event.duration_ps = _signed(x)
        elif number == 4 and wire == LENGTH:
            event.stats.append(_stat(data, x, y))
    return event if event.metadata_id in keep else None


def read_xspace(data: bytes, wanted: Callable[[str], bool]) -> list[Plane]:
    """The planes of a serialized XSpace, each with the events whose metadata name
    ``wanted`` accepts (others are skipped undecoded). Raises :class:`WireError`."""
    planes = []
    for number, wire, x, y in fields(data):
        if number == 1 and wire == LENGTH:
            planes.append(_plane(data, x, y, wanted))
    return planes


# -- writing (tests and synthetic profiles) ------------------------------------------------
def _put_varint(out: bytearray, value: int) -> None:
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _put_key(out: bytearray, number: int, wire: int) -> None:
    _put_varint(out, number << 3 | wire)


def _put_bytes(out: bytearray, number: int, payload: bytes) -> None:
    _put_key(out, number, LENGTH)
    _put_varint(out, len(payload))
    out += payload


def _put_int(out: bytearray, number: int, value: int) -> None:
    _put_key(out, number, VARINT)
    _put_varint(out, value)


def _put_metadata(plane: bytearray, field: int, ids: dict[str, int]) -> None:
    """A map<int64, {id, name}> field of an XPlane: one entry (key 1, value 2) per name."""
    for name, number in ids.items():
        meta = bytearray()
        _put_int(meta, 1, number)
        _put_bytes(meta, 2, name.encode())
        entry = bytearray()
        _put_int(entry, 1, number)
        _put_bytes(entry, 2, bytes(meta))
        _put_bytes(plane, field, bytes(entry))


def encode_xspace(planes: list[dict]) -> bytes:
    """Serialize planes given as ``{"id", "name", "lines": [{"id", "name", "timestamp_ns",
    "events": [{"name", "offset_ps", "stats": {name: value}}]}]}`` into an XSpace. Event and
    stat metadata are numbered in order of first use; a ``str`` stat value becomes a
    ``ref_value`` (as the profiler writes TraceMe strings), an ``int`` an ``int64_value``, a
    ``float`` a ``double_value``, ``bytes`` a ``bytes_value``."""
    space = bytearray()
    for spec in planes:
        event_ids: dict[str, int] = {}
        stat_ids: dict[str, int] = {}

        def stat_id(name: str, ids: dict[str, int] = stat_ids) -> int:
            return ids.setdefault(name, len(ids) + 1)

        plane = bytearray()
        _put_int(plane, 1, int(spec.get("id", 0)))
        _put_bytes(plane, 2, str(spec.get("name", "")).encode())
        for line_spec in spec.get("lines", []):
            line = bytearray()
            _put_int(line, 1, int(line_spec.get("id", 0)))
            _put_bytes(line, 2, str(line_spec.get("name", "")).encode())
            _put_int(line, 3, int(line_spec.get("timestamp_ns", 0)))
            for event_spec in line_spec.get("events", []):
                event = bytearray()
                event_id = event_ids.setdefault(event_spec["name"], len(event_ids) + 1)
                _put_int(event, 1, event_id)
                _put_int(event, 2, int(event_spec.get("offset_ps", 0)))
                for name, value in event_spec.get("stats", {}).items():
                    stat = bytearray()
                    _put_int(stat, 1, stat_id(name))
                    if isinstance(value, bool) or isinstance(value, int):
                        _put_int(stat, 4, int(value))
                    elif isinstance(value, float):
                        _put_key(stat, 2, FIXED64)
                        stat += struct.pack("<d", value)
                    elif isinstance(value, bytes):
                        _put_bytes(stat, 6, value)
                    else:
                        _put_int(stat, 7, stat_id(str(value)))
                    _put_bytes(event, 4, bytes(stat))
                _put_bytes(line, 4, bytes(event))
            _put_bytes(plane, 3, bytes(line))
        _put_metadata(plane, 4, event_ids)   # XPlane.event_metadata: map<int64, XEventMetadata>
        _put_metadata(plane, 5, stat_ids)    # XPlane.stat_metadata: map<int64, XStatMetadata>
        _put_bytes(space, 1, bytes(plane))
    return bytes(space)
