// The TPU runtime's HBM allocator: policies/tpu.py's TpuRuntimeAllocator, rule for rule and by
// name (round_to_granule, best_fit, place, coalesce, compact, compaction_seconds, the oom
// test free_total_short).
//
// The Python module is the specification; this is its twin, held to it by
// tests/test_native_differential.py (every RunResult field, the policy's stats, its compaction
// counters and the layout of HBM after every event) and to the chip's own records by
// tests/test_tpu_policy.py. From Python (TpuConfig): the granule, the runtime's own bytes at
// the top of HBM, the scratch at its bottom and the compaction cost line
// (tpu.COMPACTION_BASE_S, COMPACTION_PER_GB_S).
//
// The heap is an address range of capacity - runtime_bytes, taken at the first malloc with
// the scratch's reservation; each buffer reserves its bytes from the device as it is placed
// and releases them as it is freed; a compaction is charged to the device (busy). Offsets
// are relative to the heap. Its blocks above the scratch (live buffers and free holes) tile
// it, linked by address
// (-1 at its ends); no two free blocks touch; a block is in the free index exactly while
// free, keyed (size, -offset), so the index's lower bound of (size, minimum) is the smallest
// block that holds the request, the highest among equals — the Python's bisect over the same
// keys. The free index is SortedBins (sorted_bins.hpp): a best fit
// is O(log k) plus a jump, add and remove O(log k + k) for k keys in a bin, no allocation
// once the bins have grown. A live buffer's record never changes index while it lives
// (compaction moves its offset, not its record), so the index is the engine's handle; malloc
// answers the Python model's handle (1, 2, 3, ... in the order handed out), which is what the
// engine records as the "address".
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "device.hpp"
#include "records.hpp"
#include "sorted_bins.hpp"

namespace allocsim {

struct TpuConfig {
  int64_t granule;           // TpuRuntimeAllocator.granule (tpu.GRANULE: 512)
  int64_t runtime_bytes;     // TpuRuntimeAllocator.runtime_bytes (v5e: 26,624)
  double compaction_base_s;  // tpu.COMPACTION_BASE_S
  double compaction_per_gb_s;  // tpu.COMPACTION_PER_GB_S
  int64_t scratch_bytes;     // TpuRuntimeAllocator.floor: the scratch, whole granules
};

class TpuPolicy {
 public:
  TpuPolicy(TpuConfig config, Device& device)
      : c_(config), device_(&device), hbm_bytes_(device.capacity) {
    if (c_.granule < 1) throw std::invalid_argument("granule must be at least 1 byte");
  }

  // The buffer's handle (the Python model's, 1 up) and its record (*record, the engine's
  // handle); -1 on OOM.
  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const TpuConfig& config) { device_ = &device; c_ = config; }

  int64_t malloc(int64_t size, int64_t /*stream*/, int64_t* record) {
    if (size <= 0) return -1;
    if (!started_ && !start_heap()) {
      ++num_ooms;
      return -1;
    }
    size = round_to_granule(size);
    int32_t hole = best_fit(size);
    if (hole < 0) {
      // The runtime compacts on every miss, also for a request it then refuses (the Python's
      // malloc says what showed it).
      compact();
      if (free_total_short(size)) {
        ++num_ooms;
        return -1;
      }
      hole = best_fit(size);
      if (hole < 0) {
        throw std::logic_error("tpu: compaction left no block for a request the free total holds");
      }
    }
    int64_t held = device_->reserve(size);
    if (held < 0) {  // the device is out (a context larger than the runtime's bytes)
      ++num_ooms;
      return -1;
    }
    int32_t at = place(hole, size);
    Block& block = blocks_[at];
    block.handle = next_handle_++;
    block.held = held;
    bytes_in_use += size;
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    ++num_allocs;
    *record = at;
    return block.handle;
  }

  void free(int64_t record) {
    int32_t at = static_cast<int32_t>(record);
    int64_t size = blocks_[at].size;
    device_->release(blocks_[at].held);
    blocks_[at].handle = 0;
    coalesce(at);
    bytes_in_use -= size;
    ++num_frees;
  }

  // A buffer's bytes: a whole number of granules.
  int64_t round_to_granule(int64_t size) const {
    return (size + c_.granule - 1) / c_.granule * c_.granule;
  }

  // Modelled time of one compaction that moves moved_bytes (the Python's arithmetic, in its
  // order: base + per_gb * moved / 1e9).
  double compaction_seconds(int64_t moved_bytes) const {
    return c_.compaction_base_s + c_.compaction_per_gb_s * static_cast<double>(moved_bytes) / 1e9;
  }

  int64_t largest_free() const { return free_.largest(); }
  int64_t free_blocks() const { return free_.size(); }
  int64_t bytes_requested() const { return bytes_in_use; }
  int64_t pool_bytes() const { return heap_size_; }
  int64_t peak_pool_bytes() const { return heap_size_; }

  // The heap's blocks in address order, as TpuRuntimeAllocator.blocks() lists them
  // (heap base + offset, size, in use), with each live buffer's handle (0 for a hole): what
  // the differential tests compare after every event, and the chip's offsets are read from.
  template <class Visit>
  void each_block(Visit&& visit) const {
    for (int32_t at = first_; at >= 0; at = blocks_[at].next) {
      const Block& b = blocks_[at];
      visit(heap_base_ + b.offset, b.size, !b.free, b.handle);
    }
  }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
  int64_t num_compactions = 0, compaction_moved_bytes = 0;
  double compaction_s = 0.0;

 private:
  struct Block {
    int64_t offset, size;
    int64_t handle;      // the Python model's handle while live; 0 when free
    int64_t held;        // the device range its bytes were reserved as, while live
    int32_t prev, next;  // neighbours by address; -1 at the heap's ends
    bool free;
  };

  // _start_heap: the runtime owns HBM whole, everything below its bytes: an address range,
  // the device's memory taken as buffers are placed; the scratch first, at the bottom.
  bool start_heap() {
    heap_size_ = hbm_bytes_ - c_.runtime_bytes;
    if (heap_size_ <= 0 || c_.scratch_bytes >= heap_size_) return false;
    if (c_.scratch_bytes != 0 && device_->reserve(c_.scratch_bytes) < 0) return false;
    heap_base_ = device_->address_range(heap_size_);
    started_ = true;
    first_ = last_ = new_block(c_.scratch_bytes, heap_size_ - c_.scratch_bytes, -1, -1);
    add_free(first_);
    return true;
  }

  // oom: a request fails only when the free total (the scratch left out) is short.
  bool free_total_short(int64_t size) const {
    return heap_size_ - c_.scratch_bytes - bytes_in_use < size;
  }

  // best_fit: the smallest free block of at least size, the highest address among equals;
  // the block at the bottom of HBM (just above the scratch) only when no other holds the
  // request. Its record, or -1.
  int32_t best_fit(int64_t size) {
    SortedBins::Key key;
    if (!free_.lower_bound(size, false, &key)) return -1;
    if (blocks_[key.chunk].offset == c_.scratch_bytes) {  // the bottom block: the last resort
      SortedBins::Key next;
      if (free_.after(key, &next)) return next.chunk;
    }
    return key.chunk;
  }

  // place: the buffer of size at the top end of free block `hole`; its record. The rest of
  // the hole stays free below it.
  int32_t place(int32_t hole, int64_t size) {
    remove_free(hole);
    Block& block = blocks_[hole];
    if (block.size == size) {
      block.free = false;
      return hole;
    }
    block.size -= size;
    int64_t offset = block.offset + block.size;
    int32_t after = block.next;
    int32_t at = new_block(offset, size, hole, after);  // may move the records
    blocks_[at].free = false;
    blocks_[hole].next = at;
    if (after >= 0) blocks_[after].prev = at;
    else last_ = at;
    add_free(hole);
    return at;
  }

  // coalesce: the freed buffer merges with the free block below it and the one above.
  void coalesce(int32_t at) {
    int32_t before = blocks_[at].prev;
    if (before >= 0 && blocks_[before].free) {
      remove_free(before);
      blocks_[before].size += blocks_[at].size;
      unlink(at);
      at = before;
    }
    int32_t after = blocks_[at].next;
    if (after >= 0 && blocks_[after].free) {
      remove_free(after);
      blocks_[at].size += blocks_[after].size;
      unlink(after);
    }
    blocks_[at].free = true;
    add_free(at);
  }

  // compact: every live buffer slides to the top of the heap in address order (from the
  // top down), leaving one free block below them; O(blocks), no allocation.
  void compact() {
    free_.clear();
    int64_t top = heap_size_;
    int64_t moved = 0;
    int32_t above = -1;  // the live buffer placed last (just above `top`)
    for (int32_t at = last_; at >= 0;) {
      int32_t below = blocks_[at].prev;
      Block& block = blocks_[at];
      if (block.free) {
        blocks_.recycle(at);
      } else {
        top -= block.size;
        if (top != block.offset) {
          moved += block.size;
          block.offset = top;
        }
        block.next = above;
        if (above >= 0) blocks_[above].prev = at;
        else last_ = at;
        above = at;
      }
      at = below;
    }
    first_ = above;
    if (above < 0) last_ = -1;
    if (top > c_.scratch_bytes) {
      int32_t hole = new_block(c_.scratch_bytes, top - c_.scratch_bytes, -1, above);
      if (above >= 0) blocks_[above].prev = hole;
      else last_ = hole;
      first_ = hole;
      add_free(hole);
    } else if (above >= 0) {
      blocks_[above].prev = -1;
    }
    if (moved != 0) {  // memory already compact is left as it was: no compaction to count
      double seconds = compaction_seconds(moved);
      ++num_compactions;
      compaction_moved_bytes += moved;
      compaction_s += seconds;
      device_->busy(seconds);
    }
  }

  int32_t new_block(int64_t offset, int64_t size, int32_t prev, int32_t next) {
    return blocks_.make(Block{offset, size, 0, -1, prev, next, true});
  }

  // Take block `at` out of the address links (merged into a neighbour); its record recycled.
  void unlink(int32_t at) {
    const Block& gone = blocks_[at];
    if (gone.prev >= 0) blocks_[gone.prev].next = gone.next;
    else first_ = gone.next;
    if (gone.next >= 0) blocks_[gone.next].prev = gone.prev;
    else last_ = gone.prev;
    blocks_.recycle(at);
  }

  void add_free(int32_t at) { free_.add(blocks_[at].size, -blocks_[at].offset, at); }
  void remove_free(int32_t at) { free_.remove(blocks_[at].size, -blocks_[at].offset); }

  TpuConfig c_;
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  // HBM's size, read as the runtime starts (TpuRuntimeAllocator's); not const only so that a
  // saved state copies (a TPU run never resumes at another capacity: shared_runs.py).
  int64_t hbm_bytes_;
  Records<Block> blocks_;
  SortedBins free_;
  int32_t first_ = -1, last_ = -1;  // the heap's lowest and highest blocks
  bool started_ = false;
  int64_t heap_base_ = 0, heap_size_ = 0;
  int64_t next_handle_ = 1;
};

}  // namespace allocsim
