"""PyTorch caching allocator: expandable segments (CUDA virtual memory).

With ``expandable_segments`` each (stream, pool) grows one virtual range instead of taking
new segments: pages (2 MiB small pool, 20 MiB large pool) are mapped behind free space on a
miss and unmapped by release_cached_blocks. Unmapped space is held as blocks too (in
``_unmapped``, and per pool in an address-sorted list). A recorded start state is laid out in
the same terms by ``Snapshots.seed`` (pytorch_snapshot.py): mapped ranges and the unmapped
space around them in one virtual range of :meth:`ExpandableSegments._range_size` bytes.
Costs: find_expandable_block walks this pool's unmapped blocks in address order, O(u · blocks
walked); map_block and unmap_block are O(1) link updates plus O(log k + k) free-list and
unmapped-list updates and one device call; the get_free_block walk over growable blocks is
O(blocks passed).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from allocsim.policies.base import fail, require
from allocsim.policies.pytorch_blocks import MASK, BlockPools, Segment
from allocsim.policies.pytorch_settings import K_LARGE_BUFFER, K_SMALL_BUFFER


class ExpandableSegments(BlockPools):
    """The expandable-segments steps of DeviceCachingAllocator (find_expandable_block,
    try_allocate_expandable_block, map_block, unmap_block, release_expandable_segment)."""

    def _segment_of(self, address: int) -> Segment:
        """The expandable segment whose virtual range holds ``address``."""
        bases = self._es_bases
        return self.segment_map[bases[bisect_left(bases, address + 1) - 1]]

    def _expandable_best_fit(self, keys: list[int], position: int) -> int:
        """get_free_block's walk: from the first fitting block, move on to bigger blocks while
        their size plus the unmapped space right behind them is smaller."""
        size_of, next_of, unmapped = self._size, self._next, self._unmapped
        # A block's expandable size: its own plus the unmapped block right behind it (written
        # out twice rather than as a helper: this runs on every expandable malloc).
        address = keys[position] & MASK
        after = next_of[address]
        current = size_of[address] + (size_of[after] if after in unmapped else 0)
        last = len(keys) - 1
        while position < last:
            address = keys[position + 1] & MASK
            after = next_of[address]
            following = size_of[address] + (size_of[after] if after in unmapped else 0)
            if following >= current:
                break
            position += 1
            current = following
        return position

    def _find_expandable_block(self, stream: int, small: bool, size: int) -> int:
        """find_expandable_block: over this stream's unmapped blocks of this pool in address
        order, the first where a free block just before it plus the free and unmapped space
        from there holds ``size``; else a new virtual range of ceil(1.125 × capacity) pages."""
        pool_key = stream << 1 | small
        req, size_of, next_of = self._req, self._size, self._next
        for candidate in self._unmapped_lists.get(pool_key, ()):
            before = self._prev[candidate]
            if before and before not in req:
                candidate = before
            nbytes = 0
            address = candidate
            while nbytes < size and address and address not in req:
                nbytes += size_of[address]
                address = next_of[address]
            if nbytes >= size:
                return candidate
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        nbytes = self._range_size(page)
        base = self.device.address_range(nbytes)
        self._new_segment(Segment(base, nbytes, stream, small, True, page))
        insort(self._es_bases, base)
        self._add_unmapped(base)
        return base

    def _range_size(self, page: int) -> int:
        """The bytes of a new virtual range with pages of ``page`` bytes: ceil(1.125 ×
        capacity / page) pages (ExpandableSegment's constructor: ``max_handles_ =
        numSegments(prop.totalGlobalMem + prop.totalGlobalMem / 8)``, reserved as
        ``segment_size_ * max_handles_``)."""
        capacity = self.device.capacity
        return -(-(capacity + capacity // 8) // page) * page

    def _add_unmapped(self, address: int) -> None:
        self._unmapped.add(address)
        insort(self._unmapped_lists.setdefault(self._home[address], []), address)

    def _drop_unmapped(self, address: int) -> None:
        self._unmapped.remove(address)
        addresses = self._unmapped_lists[self._home[address]]
        del addresses[bisect_left(addresses, address)]

    def _try_merge(self, dst: int, src: int, dst_mapped: bool) -> int:
        """try_merge_blocks: join ``dst`` (in no index) with its neighbour ``src`` if that is
        not allocated and equally mapped; ``src`` leaves its index. Returns the joined block's
        address (the lower of the two), or ``dst`` when they do not join."""
        if not src or src in self._req or (src not in self._unmapped) != dst_mapped:
            return dst
        if dst_mapped:
            self._remove_free(src)
        else:
            self._drop_unmapped(src)
        low, high = (src, dst) if src < dst else (dst, src)
        size_of, prev_of, next_of = self._size, self._prev, self._next
        beyond = next_of[high]
        size_of[low] += size_of[high]
        next_of[low] = beyond
        if beyond:
            prev_of[beyond] = low
        self._forget(high)
        return low

    def _map_block(self, address: int, size: int) -> int | None:
        """map_block: map the whole pages covering [address, address + size) of unmapped block
        ``address`` (one device call); what is left stays unmapped; the mapped block joins its
        free neighbours and the free list. Returns its address, or None if the device refused."""
        page = self._segment_of(address).page
        nbytes = -(-size // page) * page
        if not self.device.map(address, nbytes):
            return None
        self._drop_unmapped(address)
        size_of, next_of = self._size, self._next
        if nbytes < size_of[address]:
            rest = address + nbytes
            after = next_of[address]
            size_of[rest] = size_of[address] - nbytes
            self._prev[rest] = address
            next_of[rest] = after
            if after:
                self._prev[after] = rest
            next_of[address] = rest
            self._home[rest] = self._home[address]
            self._add_unmapped(rest)
            size_of[address] = nbytes
        address = self._try_merge(address, self._prev[address], True)
        address = self._try_merge(address, next_of[address], True)
        self._insert_free(address)
        self._reserved_change(nbytes)
        self.num_device_alloc += 1
        return address

    def _try_allocate_expandable_block(self, stream: int, small: bool,
                                       size: int) -> tuple[int, int] | None:
        """try_allocate_expandable_block: map pages from the block find_expandable_block chose
        until it holds ``size``. Pages mapped before a refusal stay mapped, as free blocks."""
        candidate = self._find_expandable_block(stream, small, size)
        if candidate in self._unmapped:
            mapped = self._map_block(candidate, min(self._size[candidate], size))
            if mapped is None:
                return None
            candidate = mapped
        while self._size[candidate] < size:
            following = self._next[candidate]
            mapped = self._map_block(following,
                                     min(size - self._size[candidate], self._size[following]))
            if mapped is None:
                return None
            candidate = mapped
        self._remove_free(candidate)
        return candidate, self._size[candidate]

    def _unmap_block(self, address: int) -> int | None:
        """unmap_block: unmap the whole pages inside free block ``address`` (one device call);
        the parts before and after them stay free; the unmapped range joins unmapped
        neighbours. Returns the unmapped block, or None when no whole page lies inside."""
        segment = self._segment_of(address)
        page, base = segment.page, segment.base
        size_of, prev_of, next_of, home = self._size, self._prev, self._next, self._home
        size = size_of[address]
        begin = -(-(address - base) // page)
        end = (address + size - base) // page
        if begin >= end:
            return None
        self._remove_free(address)
        self._gc_base.pop(address, None)
        start = base + begin * page
        length = (end - begin) * page
        before_size = start - address
        after_size = size - before_size - length
        pool_key = home[address]
        pieces = [(start, length)]
        if before_size:
            pieces.insert(0, (address, before_size))
        if after_size:
            pieces.append((start + length, after_size))
        previous, following = prev_of[address], next_of[address]
        for piece, piece_size in pieces:
            size_of[piece] = piece_size
            prev_of[piece] = previous
            home[piece] = pool_key
            if previous:
                next_of[previous] = piece
            previous = piece
        next_of[previous] = following
        if following:
            prev_of[following] = previous
        if before_size:
            self._insert_free(address)
        if after_size:
            self._insert_free(start + length)
        unmapped = self._try_merge(start, prev_of[start], False)
        unmapped = self._try_merge(unmapped, next_of[unmapped], False)
        self._add_unmapped(unmapped)
        self.device.unmap(start, length)
        self._reserved_change(-length)
        self.num_device_free += 1
        return unmapped

    def _release_expandable_segment(self, address: int) -> None:
        """release_expandable_segment: forget a virtual range that is one unmapped block."""
        segment = self.segment_map.pop(address)
        if self._size[address] != segment.size or address not in self._unmapped:
            raise AssertionError(f"expandable segment {address:#x} is not wholly unmapped")
        self._drop_unmapped(address)
        self._forget(address)
        del self._es_bases[bisect_left(self._es_bases, address)]

    def check(self) -> None:
        """BlockPools' invariants, and those of unmapped space: ``_es_bases`` lists exactly the
        expandable segments, and all segments are of the configured kind; only expandable
        segments hold unmapped blocks, never allocated, each starting and ending on a page
        boundary of its segment; no two neighbouring blocks are both unmapped; each pool's
        unmapped list is the address-sorted unmapped blocks of that pool."""
        super().check()
        expected = sorted(b for b, s in self.segment_map.items() if s.expandable)
        require(self._es_bases == expected, "pytorch: _es_bases is not the expandable segments")
        unmapped, size_of, next_of = self._unmapped, self._size, self._next
        by_pool: dict[int, list[int]] = {}
        for segment in self.segment_map.values():
            if segment.expandable != self.expandable:
                fail(f"pytorch: segment {segment.base:#x} of the other kind")
            for address in self._chain(segment.base):
                if address not in unmapped:
                    continue
                if not segment.expandable or address in self._req:
                    fail(f"pytorch: unmapped block {address:#x} is allocated or in a segment "
                         "that is not expandable")
                offset = address - segment.base
                if offset % segment.page or size_of[address] % segment.page:
                    fail(f"pytorch: unmapped block {address:#x} is not whole pages")
                if next_of[address] in unmapped:
                    fail(f"pytorch: neighbouring unmapped blocks at {address:#x} not merged")
                by_pool.setdefault(segment.pool_key, []).append(address)
        require(sum(map(len, by_pool.values())) == len(unmapped),
                "pytorch: unmapped blocks that are in no segment")
        for pool_key, addresses in self._unmapped_lists.items():
            if addresses != sorted(by_pool.pop(pool_key, [])):
                fail(f"pytorch: unmapped list of pool {pool_key} is not its unmapped blocks")
        require(not by_pool, "pytorch: unmapped blocks of a pool with no unmapped list")
