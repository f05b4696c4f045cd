"""PyTorch caching allocator: expandable segments (CUDA virtual memory).

With ``expandable_segments`` each (stream, pool) grows one virtual range instead of taking
new segments: pages (2 MiB small pool, 20 MiB large pool) are mapped behind free space on a
miss and unmapped by release_cached_blocks. Unmapped space is held as blocks too (their
records' requested bytes are UNMAPPED, and per pool an address-sorted list holds them). A
recorded start state is laid out in the same terms by ``Snapshots.seed``
(pytorch_snapshot.py): mapped ranges and the unmapped space around them in one virtual range
of :meth:`ExpandableSegments._range_size` bytes. The steps here take and return block records
(pytorch_records.py). Costs: find_expandable_block walks this pool's unmapped blocks in
address order, O(u · blocks walked); map_block and unmap_block are O(1) link updates plus
O(log k + k) free-list and unmapped-list updates and one device call; the get_free_block walk
over growable blocks is O(blocks passed).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from allocsim.policies.base import fail, require
from allocsim.policies.pytorch_blocks import MASK, BlockPools, Segment
from allocsim.policies.pytorch_records import ADDRESS, HOME, NEXT, PREV, REQ, SIZE, UNMAPPED
from allocsim.policies.pytorch_settings import K_LARGE_BUFFER, K_SMALL_BUFFER


class ExpandableSegments(BlockPools):
    """The expandable-segments steps of DeviceCachingAllocator (find_expandable_block,
    try_allocate_expandable_block, map_block, unmap_block, release_expandable_segment)."""

    def _segment_of(self, address: int) -> Segment:
        """The expandable segment whose virtual range holds ``address``."""
        bases = self._es_bases
        return self.segment_map[bases[bisect_left(bases, address + 1) - 1]]

    def _expandable_best_fit(self, keys: list[int], position: int) -> int:
        """get_free_block's walk with expandable segments: from the first fitting block, move
        on to the next bigger block while its expandable size is smaller (a tie stays)."""
        record = self.block_map.record
        block = record[keys[position] & MASK]
        after = block[NEXT]
        if after is None or after[REQ] != UNMAPPED:
            # Its expandable size is its own size, and every block after it in the list is at
            # least that big: the walk stops here (without reading them).
            return position
        current = self._expandable_size(block)
        last = len(keys) - 1
        while position < last:
            following = self._expandable_size(record[keys[position + 1] & MASK])
            if following >= current:
                break
            position += 1
            current = following
        return position

    @staticmethod
    def _expandable_size(block: list) -> int:
        """A block's expandable size: its own plus the unmapped block right behind it."""
        after = block[NEXT]
        if after is not None and after[REQ] == UNMAPPED:
            return int(block[SIZE] + after[SIZE])
        return int(block[SIZE])

    def _find_expandable_block(self, stream: int, small: bool, size: int) -> list:
        """find_expandable_block: over this stream's unmapped blocks of this pool in address
        order, the first where a free block just before it plus the free and unmapped space
        from there holds ``size``; else a new virtual range of ceil(1.125 × capacity) pages."""
        pool_key = stream << 1 | small
        record = self.block_map.record
        for address in self._unmapped_lists.get(pool_key, ()):
            candidate = record[address]
            before = candidate[PREV]
            if before is not None and before[REQ] <= 0:
                candidate = before
            nbytes = 0
            block = candidate
            while nbytes < size and block is not None and block[REQ] <= 0:
                nbytes += block[SIZE]
                block = block[NEXT]
            if nbytes >= size:
                return candidate
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        nbytes = self._range_size(page)
        base = self.device.address_range(nbytes)
        block = self._new_segment(Segment(base, nbytes, stream, small, True, page))
        insort(self._es_bases, base)
        self._add_unmapped(block)
        return block

    def _range_size(self, page: int) -> int:
        """The bytes of a new virtual range with pages of ``page`` bytes: ceil(1.125 ×
        capacity / page) pages (ExpandableSegment's constructor: ``max_handles_ =
        numSegments(prop.totalGlobalMem + prop.totalGlobalMem / 8)``, reserved as
        ``segment_size_ * max_handles_``)."""
        capacity = self.device.capacity
        return -(-(capacity + capacity // 8) // page) * page

    def _add_unmapped(self, block: list) -> None:
        block[REQ] = UNMAPPED
        insort(self._unmapped_lists.setdefault(block[HOME], []), block[ADDRESS])

    def _drop_unmapped(self, block: list) -> None:
        if block[REQ] != UNMAPPED:
            raise KeyError(f"block {block[ADDRESS]:#x} is not unmapped")
        block[REQ] = 0
        addresses = self._unmapped_lists[block[HOME]]
        del addresses[bisect_left(addresses, block[ADDRESS])]

    def _try_merge(self, dst: list, src: list | None, dst_mapped: bool) -> list:
        """try_merge_blocks: join ``dst`` (in no index) with its neighbour ``src`` if that is
        not allocated and equally mapped; ``src`` leaves its index. Returns the joined block
        (the lower of the two), or ``dst`` when they do not join."""
        if src is None or src[REQ] > 0 or (src[REQ] != UNMAPPED) != dst_mapped:
            return dst
        if dst_mapped:
            self._remove_free(src)
        else:
            self._drop_unmapped(src)
        low, high = (src, dst) if src[ADDRESS] < dst[ADDRESS] else (dst, src)
        beyond = high[NEXT]
        low[SIZE] += high[SIZE]
        low[NEXT] = beyond
        if beyond is not None:
            beyond[PREV] = low
        self._forget(high)
        return low

    def _map_block(self, block: list, size: int) -> list | None:
        """map_block: map the whole pages covering [address, address + size) of unmapped
        ``block`` (one device call); what is left stays unmapped; the mapped block joins its
        free neighbours and the free list. Returns it, or None if the device refused."""
        address = block[ADDRESS]
        page = self._segment_of(address).page
        nbytes = -(-size // page) * page
        if not self.device.map(address, nbytes):
            return None
        self._drop_unmapped(block)
        if nbytes < block[SIZE]:
            rest = address + nbytes
            after = block[NEXT]
            piece = [block[SIZE] - nbytes, block, after, block[HOME], 0, rest]
            self.block_map.record[rest] = block[NEXT] = piece
            if after is not None:
                after[PREV] = piece
            self._add_unmapped(piece)
            block[SIZE] = nbytes
        block = self._try_merge(block, block[PREV], True)
        block = self._try_merge(block, block[NEXT], True)
        self._insert_free(block)
        self._reserved_change(nbytes)
        self.num_device_alloc += 1
        return block

    def _try_allocate_expandable_block(self, stream: int, small: bool,
                                       size: int) -> list | None:
        """try_allocate_expandable_block: map pages from the block find_expandable_block chose
        until it holds ``size``. Pages mapped before a refusal stay mapped, as free blocks.
        Returns the block, in no free list."""
        block = self._find_expandable_block(stream, small, size)
        if block[REQ] == UNMAPPED:
            mapped = self._map_block(block, min(block[SIZE], size))
            if mapped is None:
                return None
            block = mapped
        while block[SIZE] < size:
            following = block[NEXT]
            mapped = self._map_block(following, min(size - block[SIZE], following[SIZE]))
            if mapped is None:
                return None
            block = mapped
        self._remove_free(block)
        return block

    def _unmap_block(self, block: list) -> list | None:
        """unmap_block: unmap the whole pages inside free ``block`` (one device call); the
        parts before and after them stay free; the unmapped range joins unmapped neighbours.
        Returns the unmapped block, or None when no whole page lies inside."""
        address = block[ADDRESS]
        segment = self._segment_of(address)
        page, base = segment.page, segment.base
        size = block[SIZE]
        begin = -(-(address - base) // page)
        end = (address + size - base) // page
        if begin >= end:
            return None
        self._remove_free(block)
        self._gc_base.pop(address, None)
        start = base + begin * page
        length = (end - begin) * page
        before_size = start - address
        after_size = size - before_size - length
        pool_key = block[HOME]
        pieces = [(start, length)]
        if before_size:
            pieces.insert(0, (address, before_size))
        if after_size:
            pieces.append((start + length, after_size))
        # The first piece starts at ``address``: it keeps the block's record.
        record = self.block_map.record
        following = block[NEXT]
        previous = block[PREV]
        for piece, piece_size in pieces:
            if piece == address:
                current = block
                current[SIZE] = piece_size
            else:
                current = record[piece] = [piece_size, previous, None, pool_key, 0, piece]
            if previous is not None:
                previous[NEXT] = current
            previous = current
        current[NEXT] = following
        if following is not None:
            following[PREV] = current
        if before_size:
            self._insert_free(block)
        if after_size:
            self._insert_free(current)
        unmapped = record[start]
        unmapped = self._try_merge(unmapped, unmapped[PREV], False)
        unmapped = self._try_merge(unmapped, unmapped[NEXT], False)
        self._add_unmapped(unmapped)
        self.device.unmap(start, length)
        self._reserved_change(-length)
        self.num_device_free += 1
        return unmapped

    def _release_expandable_segment(self, block: list) -> None:
        """release_expandable_segment: forget a virtual range that is one unmapped block."""
        address = block[ADDRESS]
        segment = self.segment_map.pop(address)
        if block[SIZE] != segment.size or block[REQ] != UNMAPPED:
            raise AssertionError(f"expandable segment {address:#x} is not wholly unmapped")
        self._drop_unmapped(block)
        self._forget(block)
        del self._es_bases[bisect_left(self._es_bases, address)]

    def check(self) -> None:
        """BlockPools' invariants, and those of unmapped space: ``_es_bases`` lists exactly the
        expandable segments, and all segments are of the configured kind; only expandable
        segments hold unmapped blocks (never allocated ones: a record is one or the other,
        and BlockPools.check names a request written for unmapped space), each starting and
        ending on a page boundary of its segment; no two neighbouring blocks are both
        unmapped; each pool's unmapped list is the address-sorted unmapped blocks of that
        pool."""
        super().check()
        expected = sorted(b for b, s in self.segment_map.items() if s.expandable)
        require(self._es_bases == expected, "pytorch: _es_bases is not the expandable segments")
        by_pool: dict[int, list[int]] = {}
        for segment in self.segment_map.values():
            if segment.expandable != self.expandable:
                fail(f"pytorch: segment {segment.base:#x} of the other kind")
            for block in self.block_map.chain(segment.base):
                if block[REQ] != UNMAPPED:
                    continue
                address = block[ADDRESS]
                if not segment.expandable:
                    fail(f"pytorch: unmapped block {address:#x} is in a segment that is not "
                         "expandable")
                offset = address - segment.base
                if offset % segment.page or block[SIZE] % segment.page:
                    fail(f"pytorch: unmapped block {address:#x} is not whole pages")
                after = block[NEXT]
                if after is not None and after[REQ] == UNMAPPED:
                    fail(f"pytorch: neighbouring unmapped blocks at {address:#x} not merged")
                by_pool.setdefault(segment.pool_key, []).append(address)
        require(sum(map(len, by_pool.values())) == len(self._unmapped),
                "pytorch: unmapped blocks that are in no segment")
        for pool_key, addresses in self._unmapped_lists.items():
            if addresses != sorted(by_pool.pop(pool_key, [])):
                fail(f"pytorch: unmapped list of pool {pool_key} is not its unmapped blocks")
        require(not by_pool, "pytorch: unmapped blocks of a pool with no unmapped list")
