"""The spans of memory a device has handed out, for the host and CUDA devices (:class:`Spans`)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from typing import Any


class Spans:
    """Non-overlapping spans ``[start, start + length)`` the device has handed out, each with
    a payload (a host buffer, a GPU handle). Answers: which spans cover a block?

    A sorted list of starts beside a dict (start → (length, payload)): lookups are
    O(log n) by bisection; ``add`` and ``pop`` are O(n) list moves, which at the few thousand
    spans of a validation run cost less than a tree (and need no extra dependency)."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._spans: dict[int, tuple[int, Any]] = {}

    def __len__(self) -> int:
        return len(self._starts)

    def __contains__(self, start: int) -> bool:
        return start in self._spans

    def add(self, start: int, length: int, payload: Any) -> None:
        if start not in self._spans:
            insort(self._starts, start)
        self._spans[start] = (length, payload)

    def pop(self, start: int) -> tuple[int, Any] | None:
        span = self._spans.pop(start, None)
        if span is not None:
            del self._starts[bisect_left(self._starts, start)]
        return span

    def items(self) -> list[tuple[int, tuple[int, Any]]]:
        return [(start, self._spans[start]) for start in self._starts]

    def containing(self, address: int) -> tuple[int, int, Any] | None:
        index = bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        start = self._starts[index]
        length, payload = self._spans[start]
        return (start, length, payload) if address < start + length else None

    def pieces(self, address: int, size: int, *, span_across: bool
               ) -> list[tuple[int, int, Any]] | None:
        """``(offset in span, length, payload)`` pieces covering ``[address, address+size)``;
        None if any byte is not held (or, unless ``span_across``, if it takes two spans)."""
        index = bisect_right(self._starts, address) - 1
        if index < 0:
            return None
        out: list[tuple[int, int, Any]] = []
        cursor, end = address, address + size
        while cursor < end:
            if index >= len(self._starts):
                return None
            start = self._starts[index]
            length, payload = self._spans[start]
            if not start <= cursor < start + length:
                return None
            take = min(end, start + length) - cursor
            out.append((cursor - start, take, payload))
            cursor += take
            index += 1
            if cursor < end and not span_across:
                return None
        return out

