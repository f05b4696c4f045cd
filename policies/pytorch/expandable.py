"""PyTorch caching allocator: expandable segments (CUDA virtual memory).

With ``expandable_segments`` each (stream, pool) grows one virtual range instead of taking
new segments: pages (2 MiB small pool, 20 MiB large pool) are mapped behind free space on a
miss and unmapped by release_cached_blocks. Unmapped space is held as blocks too (their
``requested`` is UNMAPPED, and per pool an address-sorted list holds them).
:class:`ExpandableSegments` is that part of DeviceCachingAllocator, held by the allocator as
a field when the setting is on: it owns the unmapped lists and the bases of the virtual ranges,
works on the allocator's :class:`~allocsim.policies.pytorch.blocks.BlockPools` and counts its
device calls into its :class:`~allocsim.policies.pytorch.stats.DeviceStats`. A recorded start
state is laid out in the same terms by pytorch/snapshot.py (mapped ranges and the unmapped
space around them in one virtual range of :meth:`ExpandableSegments.range_size` bytes).
Costs: find_expandable_block walks this pool's unmapped blocks in address order,
O(u · blocks walked); map_block and unmap_block are O(1) link updates plus O(log k + k)
free-list and unmapped-list updates and one device call; get_free_block's walk over growable
blocks is O(blocks passed).
"""

from __future__ import annotations

from bisect import bisect_left, insort

from allocsim.policies.base import DeviceMemory, fail, require
from allocsim.policies.pytorch.blocks import MASK, BlockPools, Segment
from allocsim.policies.pytorch.records import UNMAPPED, Block
from allocsim.policies.pytorch.settings import K_LARGE_BUFFER, K_SMALL_BUFFER
from allocsim.policies.pytorch.stats import DeviceStats


class ExpandableSegments:
    """The expandable-segments steps of DeviceCachingAllocator (get_free_block's walk,
    find_expandable_block, try_allocate_expandable_block, map_block, unmap_block,
    release_expandable_segment) over the allocator's blocks."""

    def __init__(self, pools: BlockPools, stats: DeviceStats, device: DeviceMemory) -> None:
        self.pools = pools
        self.stats = stats
        self.device = device
        self.unmapped_lists: dict[int, list[int]] = {}   # pool key -> sorted unmapped addresses
        self.bases: list[int] = []                       # sorted bases of the virtual ranges

    def segment_of(self, address: int) -> Segment:
        """The expandable segment whose virtual range holds ``address``."""
        bases = self.bases
        return self.pools.segment_map[bases[bisect_left(bases, address + 1) - 1]]

    def best_fit(self, keys: list[int], position: int) -> int:
        """get_free_block's walk with expandable segments: from the first fitting block (at
        ``position`` of the free list ``keys``), move on to the next bigger block while its
        expandable size is smaller (a tie stays). Returns the position chosen."""
        record = self.pools.record
        block = record[keys[position] & MASK]
        after = block.next
        if after is None or after.requested != UNMAPPED:
            # Its expandable size is its own size, and every block after it in the list is at
            # least that big: the walk stops here (without reading them).
            return position
        current = expandable_size(block)
        last = len(keys) - 1
        while position < last:
            following = expandable_size(record[keys[position + 1] & MASK])
            if following >= current:
                break
            position += 1
            current = following
        return position

    def find_block(self, stream: int, small: bool, size: int) -> Block:
        """find_expandable_block: over this stream's unmapped blocks of this pool in address
        order, the first where a free block just before it plus the free and unmapped space
        from there holds ``size``; else a new virtual range of ceil(1.125 × capacity) pages."""
        pool_key = stream << 1 | small
        record = self.pools.record
        for address in self.unmapped_lists.get(pool_key, ()):
            candidate = record[address]
            before = candidate.prev
            if before is not None and before.requested <= 0:
                candidate = before
            nbytes = 0
            block: Block | None = candidate
            while nbytes < size and block is not None and block.requested <= 0:
                nbytes += block.size
                block = block.next
            if nbytes >= size:
                return candidate
        page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
        nbytes = self.range_size(page)
        base = self.device.address_range(nbytes)
        new = self.add_range(Segment(base, nbytes, stream, small, True, page))
        self.add_unmapped(new)
        return new

    def range_size(self, page: int) -> int:
        """The bytes of a new virtual range with pages of ``page`` bytes: ceil(1.125 ×
        capacity / page) pages (ExpandableSegment's constructor: ``max_handles_ =
        numSegments(prop.totalGlobalMem + prop.totalGlobalMem / 8)``, reserved as
        ``segment_size_ * max_handles_``)."""
        capacity = self.device.capacity
        # At least one page: a device smaller than a page (a capacity search's probe floored
        # to a coarse granularity) gets a range whose first map it refuses, not an empty
        # range a request would walk off (real devices always hold many pages).
        return max(1, -(-(capacity + capacity // 8) // page)) * page

    def add_range(self, segment: Segment) -> Block:
        """A new virtual range: its one block, free and mapped as far as the pools know."""
        insort(self.bases, segment.base)
        return self.pools.new_segment(segment)

    def add_unmapped(self, block: Block) -> None:
        block.requested = UNMAPPED
        insort(self.unmapped_lists.setdefault(block.pool_key, []), block.address)

    def drop_unmapped(self, block: Block) -> None:
        if block.requested != UNMAPPED:
            raise KeyError(f"block {block.address:#x} is not unmapped")
        block.requested = 0
        addresses = self.unmapped_lists[block.pool_key]
        del addresses[bisect_left(addresses, block.address)]

    def try_merge(self, dst: Block, src: Block | None, dst_mapped: bool) -> Block:
        """try_merge_blocks: join ``dst`` (in no index) with its neighbour ``src`` if that is
        not allocated and equally mapped; ``src`` leaves its index. Returns the joined block
        (the lower of the two), or ``dst`` when they do not join."""
        if src is None or src.requested > 0 or (src.requested != UNMAPPED) != dst_mapped:
            return dst
        if dst_mapped:
            self.pools.remove_free(src)
        else:
            self.drop_unmapped(src)
        low, high = (src, dst) if src.address < dst.address else (dst, src)
        beyond = high.next
        low.size += high.size
        low.next = beyond
        if beyond is not None:
            beyond.prev = low
        self.pools.forget(high)
        return low

    def map_block(self, block: Block, size: int) -> Block | None:
        """map_block: map the whole pages covering [address, address + size) of unmapped
        ``block`` (one device call); what is left stays unmapped; the mapped block joins its
        free neighbours and the free list. Returns it, or None if the device refused."""
        address = block.address
        page = self.segment_of(address).page
        nbytes = -(-size // page) * page
        if not self.device.map(address, nbytes):
            return None
        self.drop_unmapped(block)
        if nbytes < block.size:
            rest = address + nbytes
            after = block.next
            piece = Block(block.size - nbytes, block, after, block.pool_key, 0, rest)
            self.pools.record[rest] = block.next = piece
            if after is not None:
                after.prev = piece
            self.add_unmapped(piece)
            block.size = nbytes
        block = self.try_merge(block, block.prev, True)
        block = self.try_merge(block, block.next, True)
        self.pools.insert_free(block)
        self.stats.reserved_change(nbytes)
        self.stats.num_device_alloc += 1
        return block

    def try_allocate(self, stream: int, small: bool, size: int) -> Block | None:
        """try_allocate_expandable_block: map pages from the block find_expandable_block chose
        until it holds ``size``. Pages mapped before a refusal stay mapped, as free blocks.
        Returns the block, in no free list."""
        block = self.find_block(stream, small, size)
        if block.requested == UNMAPPED:
            mapped = self.map_block(block, min(block.size, size))
            if mapped is None:
                return None
            block = mapped
        while block.size < size:
            following: Block = block.next                            # type: ignore[assignment]
            mapped = self.map_block(following, min(size - block.size, following.size))
            if mapped is None:
                return None
            block = mapped
        self.pools.remove_free(block)
        return block

    def unmap_block(self, block: Block) -> Block | None:
        """unmap_block: unmap the whole pages inside free ``block`` (one device call); the
        parts before and after them stay free; the unmapped range joins unmapped neighbours.
        Returns the unmapped block, or None when no whole page lies inside."""
        pools = self.pools
        address = block.address
        segment = self.segment_of(address)
        page, base = segment.page, segment.base
        size = block.size
        begin = -(-(address - base) // page)
        end = (address + size - base) // page
        if begin >= end:
            return None
        pools.remove_free(block)
        pools.gc_stamps.pop(address, None)
        start = base + begin * page
        length = (end - begin) * page
        before_size = start - address
        after_size = size - before_size - length
        pieces = [(start, length)]
        if before_size:
            pieces.insert(0, (address, before_size))
        if after_size:
            pieces.append((start + length, after_size))
        # The first piece starts at ``address``: it keeps the block.
        record = pools.record
        following = block.next
        previous = block.prev
        for piece, piece_size in pieces:
            if piece == address:
                current = block
                current.size = piece_size
            else:
                current = record[piece] = Block(piece_size, previous, None, block.pool_key, 0,
                                                piece)
            if previous is not None:
                previous.next = current
            previous = current
        current.next = following
        if following is not None:
            following.prev = current
        if before_size:
            pools.insert_free(block)
        if after_size:
            pools.insert_free(current)
        unmapped = record[start]
        unmapped = self.try_merge(unmapped, unmapped.prev, False)
        unmapped = self.try_merge(unmapped, unmapped.next, False)
        self.add_unmapped(unmapped)
        self.device.unmap(start, length)
        self.stats.reserved_change(-length)
        self.stats.num_device_free += 1
        return unmapped

    def release_range(self, block: Block) -> None:
        """release_expandable_segment: forget a virtual range that is one unmapped block."""
        address = block.address
        segment = self.pools.segment_map.pop(address)
        if block.size != segment.size or block.requested != UNMAPPED:
            raise AssertionError(f"expandable segment {address:#x} is not wholly unmapped")
        self.drop_unmapped(block)
        self.pools.forget(block)
        del self.bases[bisect_left(self.bases, address)]

    def release_cached(self, pool_keys: list[int]) -> None:
        """release_cached_blocks with expandable segments: unmap the whole pages of every free
        block (pools in ``pool_keys``' order), and forget a virtual range left wholly
        unmapped."""
        free_lists = self.pools.free_lists
        record = self.pools.record
        to_unmap = [key & MASK for pool_key in pool_keys for key in free_lists[pool_key]]
        for address in to_unmap:
            unmapped = self.unmap_block(record[address])
            if unmapped is not None and unmapped.prev is None and unmapped.next is None:
                self.release_range(unmapped)

    def check(self) -> None:
        """The invariants of unmapped space: ``bases`` lists exactly the expandable segments,
        and all segments are expandable; only they hold unmapped blocks (never allocated ones:
        a block is one or the other, and BlockPools.check names a request written for
        unmapped space), each starting and ending on a page boundary of its segment; no two
        neighbouring blocks are both unmapped; each pool's unmapped list is the
        address-sorted unmapped blocks of that pool."""
        pools = self.pools
        expected = sorted(b for b, s in pools.segment_map.items() if s.expandable)
        require(self.bases == expected, "pytorch: the expandable bases are not the expandable "
                                        "segments")
        by_pool: dict[int, list[int]] = {}
        for segment in pools.segment_map.values():
            if not segment.expandable:
                fail(f"pytorch: segment {segment.base:#x} of the other kind")
            for block in pools.block_map.chain(segment.base):
                if block.requested != UNMAPPED:
                    continue
                address = block.address
                offset = address - segment.base
                if offset % segment.page or block.size % segment.page:
                    fail(f"pytorch: unmapped block {address:#x} is not whole pages")
                after = block.next
                if after is not None and after.requested == UNMAPPED:
                    fail(f"pytorch: neighbouring unmapped blocks at {address:#x} not merged")
                by_pool.setdefault(segment.pool_key, []).append(address)
        require(sum(map(len, by_pool.values())) == len(pools.unmapped),
                "pytorch: unmapped blocks that are in no segment")
        for pool_key, addresses in self.unmapped_lists.items():
            if addresses != sorted(by_pool.pop(pool_key, [])):
                fail(f"pytorch: unmapped list of pool {pool_key} is not its unmapped blocks")
        require(not by_pool, "pytorch: unmapped blocks of a pool with no unmapped list")


def expandable_size(block: Block) -> int:
    """A block's expandable size: its own plus the unmapped block right behind it."""
    after = block.next
    if after is not None and after.requested == UNMAPPED:
        return int(block.size + after.size)
    return int(block.size)


def check_no_unmapped(pools: BlockPools) -> None:
    """Without expandable segments: every segment is an ordinary one, mapped whole."""
    for segment in pools.segment_map.values():
        if segment.expandable:
            fail(f"pytorch: segment {segment.base:#x} of the other kind")
        for block in pools.block_map.chain(segment.base):
            if block.requested == UNMAPPED:
                fail(f"pytorch: unmapped block {block.address:#x} is in a segment that is not "
                     "expandable")
    require(not pools.unmapped, "pytorch: unmapped blocks that are in no segment")
