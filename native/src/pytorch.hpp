// PyTorch's CUDA caching allocator with its default settings: policies/pytorch_caching.py
// (malloc, free), pytorch_oom.py (the miss path: alloc_block, release_cached_blocks, the retry)
// and pytorch_settings.py (round_size, get_allocation_size), for no expandable segments, no
// roundup_power2_divisions, no garbage collection and max_split_size unlimited; a
// per_process_memory_fraction is kept (alloc_block's limit). Other settings replay in Python
// (sim/kernel/native.py says which).
//
// The Python modules are the specification (they cite CUDACachingAllocator.cpp); this is
// their twin, held to them by tests/test_native_differential.py. Constants (the 512-byte
// block, the 1 MiB small limit, the 2 and 20 MiB segments, the 10 MiB large-allocation
// threshold and the 2 MiB rounding of large segments, the allowed maximum) come from Python.
//
// Invariants (pytorch_blocks.py's): a segment's blocks tile it, linked by address; a block is
// free exactly when its request is 0, and then it is in its pool's free list — one list per
// (stream, small) pool, sorted by (size, address); no two neighbours are both free. An
// allocated block's record never moves: its index is the engine's handle.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "device.hpp"

namespace allocsim {

struct PyTorchConfig {
  int64_t min_block_size, small_size, small_buffer, large_buffer, min_large_alloc, round_large;
  bool set_fraction;
  int64_t allowed_memory_maximum;
  std::vector<int64_t> divisions;  // roundup_power2_divisions per interval; empty: none > 1
  int64_t max_split_size;          // no_limit when unset
  int64_t no_limit;                // pytorch_settings.NO_LIMIT (SIZE_MAX in PyTorch)
  int64_t max_non_split_rounding;
  bool gc_on;                      // set_fraction and garbage_collection_threshold > 0
  double gc_threshold;             // garbage_collection_threshold
};

class PyTorchPolicy {
 public:
  PyTorchPolicy(PyTorchConfig config, Device& device) : c_(config), device_(device) {}

  int64_t malloc(int64_t size, int64_t stream, int64_t* handle) {
    int64_t rounded = round_size(size);
    bool small = rounded <= c_.small_size;
    int64_t pool_key = static_cast<int64_t>(static_cast<uint64_t>(stream) << 1) | (small ? 1 : 0);
    std::vector<Key>& keys = pool(pool_key);
    if (c_.gc_on) ++gc_calls_[small ? 1 : 0];
    // get_free_block: the smallest block of this stream and pool that fits, or none; no
    // search beyond it, and it is refused when max_split_size says so.
    int32_t at = -1;
    auto it = std::lower_bound(keys.begin(), keys.end(), Key{rounded, INT64_MIN, 0});
    if (it != keys.end()) {
      int64_t block_size = it->size;
      bool take = rounded < c_.max_split_size
                      ? block_size < c_.max_split_size
                      : block_size < rounded + c_.max_non_split_rounding;
      if (take) {
        at = it->block;
        keys.erase(it);
        --free_count_;
      }
    }
    if (at < 0) {
      at = malloc_miss(rounded, small, stream, pool_key);
      if (at < 0) return -1;
    }
    int64_t block_size = blocks_[at].size;
    int64_t remaining = block_size - rounded;
    // should_split, then alloc_found_block: the caller keeps the low end.
    if (small ? remaining >= c_.min_block_size
              : rounded < c_.max_split_size && remaining > c_.small_size) {
      int32_t rest = new_block(blocks_[at].address + rounded, remaining, pool_key);
      Block& block = blocks_[at];
      Block& piece = blocks_[rest];
      piece.prev = at;
      piece.next = block.next;
      if (block.next >= 0) blocks_[block.next].prev = rest;
      block.next = rest;
      block.size = rounded;
      insert_free(rest);
      if (c_.gc_on) piece.gc_base = gc_calls_[small ? 1 : 0];
      block_size = rounded;
    }
    blocks_[at].req = size;
    bytes_in_use += block_size;
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    requested += size;
    ++num_allocs;
    *handle = at;
    return blocks_[at].address;
  }

  // free_block: merge with the previous block, then the next one, each when free.
  void free(int64_t handle) {
    int32_t at = static_cast<int32_t>(handle);
    Block* block = &blocks_[at];
    int64_t size = block->size;
    bytes_in_use -= size;
    requested -= block->req;
    ++num_frees;
    block->req = 0;
    int32_t before = block->prev, after = block->next;
    if (before >= 0 && blocks_[before].req == 0) {
      remove_free(before);
      blocks_[before].next = after;
      if (after >= 0) blocks_[after].prev = before;
      spare_.push_back(at);
      size += blocks_[before].size;
      at = before;
      block = &blocks_[at];
    }
    if (after >= 0 && blocks_[after].req == 0) {
      remove_free(after);
      int32_t beyond = blocks_[after].next;
      block->next = beyond;
      if (beyond >= 0) blocks_[beyond].prev = at;
      spare_.push_back(after);
      size += blocks_[after].size;
    }
    block->size = size;
    insert_free(at);
    if (c_.gc_on) block->gc_base = gc_calls_[block->pool_key & 1];
  }

  // stats(): the largest free block of any pool.
  int64_t largest_free() const {
    int64_t largest = 0;
    for (const auto& [key, keys] : free_) {
      if (!keys.empty()) largest = std::max(largest, keys.back().size);
    }
    return largest;
  }
  int64_t free_blocks() const { return free_count_; }
  int64_t pool_bytes() const { return pool_bytes_; }
  int64_t peak_pool_bytes() const { return peak_pool_bytes_; }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0, requested = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
  int64_t bytes_requested() const { return requested; }

 private:
  struct Block {
    int64_t size, address, req;  // req: the caller's request while allocated, 0 while free
    int64_t pool_key;
    int32_t prev, next;          // neighbours in the segment; -1 at its ends
    int64_t gc_base;             // the pool's search count when it became free (GC's age)
  };
  struct Key {
    int64_t size, address;
    int32_t block;
    bool operator<(const Key& o) const {
      return size < o.size || (size == o.size && address < o.address);
    }
  };

  int32_t new_block(int64_t address, int64_t size, int64_t pool_key) {
    int32_t at;
    if (!spare_.empty()) {
      at = spare_.back();
      spare_.pop_back();
    } else {
      at = static_cast<int32_t>(blocks_.size());
      blocks_.push_back(Block{});
    }
    blocks_[at] = Block{size, address, 0, pool_key, -1, -1, 0};
    return at;
  }

  void insert_free(int32_t at) {
    const Block& block = blocks_[at];
    std::vector<Key>& keys = pool(block.pool_key);
    Key key{block.size, block.address, at};
    keys.insert(std::upper_bound(keys.begin(), keys.end(), key), key);
    ++free_count_;
  }

  void remove_free(int32_t at) {
    const Block& block = blocks_[at];
    std::vector<Key>& keys = free_[block.pool_key];
    keys.erase(std::lower_bound(keys.begin(), keys.end(), Key{block.size, block.address, 0}));
    --free_count_;
  }

  // round_size (pytorch_settings.py): 512 B at least; with a division count d > 1 for the
  // size's interval and size > 512·d, up to the next of d steps between powers of two; else up
  // to a multiple of 512.
  int64_t round_size(int64_t size) const {
    if (size < c_.min_block_size) return c_.min_block_size;
    if (!c_.divisions.empty()) {
      int bits = 64 - __builtin_clzll(static_cast<uint64_t>(size));
      int index = std::min(std::max(bits - 1 - 20, 0), static_cast<int>(c_.divisions.size()) - 1);
      int64_t d = c_.divisions[index];
      if (d > 1 && size > c_.min_block_size * d) return roundup_power2_next_division(size, d);
    }
    return (size + c_.min_block_size - 1) / c_.min_block_size * c_.min_block_size;
  }

  static int64_t roundup_power2_next_division(int64_t size, int64_t divisions) {
    if ((size & (size - 1)) == 0) return size;
    int bits = 64 - __builtin_clzll(static_cast<uint64_t>(size));
    int64_t power2_floor = int64_t{1} << (bits - 1);
    int division_bits = 64 - __builtin_clzll(static_cast<uint64_t>(divisions));
    int64_t step = power2_floor >> (division_bits - 1);
    if (step == 0) return power2_floor << 1;
    int64_t floor = size & ~(step - 1);
    return floor == size ? size : floor + step;
  }

  int64_t allocation_size(int64_t rounded) const {  // get_allocation_size
    if (rounded <= c_.small_size) return c_.small_buffer;
    if (rounded < c_.min_large_alloc) return c_.large_buffer;
    return (rounded + c_.round_large - 1) / c_.round_large * c_.round_large;
  }

  // ReleasePath._malloc_miss without garbage collection: alloc_block;
  // release_available_cached_blocks (with max_split_size) and alloc_block again;
  // release_cached_blocks and alloc_block again; else an OOM. The block found is in no free
  // list.
  int32_t malloc_miss(int64_t rounded, bool small, int64_t stream, int64_t pool_key) {
    int64_t alloc_size = allocation_size(rounded);
    if (c_.gc_on) garbage_collect_cached_blocks();
    int32_t found = alloc_block(alloc_size, pool_key);
    if (found < 0 && release_available_cached_blocks(rounded, pool_key)) {
      found = alloc_block(alloc_size, pool_key);
    }
    if (found < 0) {
      release_cached_blocks();
      found = alloc_block(alloc_size, pool_key);
    }
    if (found < 0) ++num_ooms;
    (void)small;
    (void)stream;
    return found;
  }

  int32_t alloc_block(int64_t alloc_size, int64_t pool_key) {
    if (c_.set_fraction && pool_bytes_ + alloc_size > c_.allowed_memory_maximum) return -1;
    int64_t base = device_.reserve(alloc_size);
    if (base < 0) return -1;
    int32_t at = new_block(base, alloc_size, pool_key);
    pool_bytes_ += alloc_size;
    if (pool_bytes_ > peak_pool_bytes_) peak_pool_bytes_ = pool_bytes_;
    return at;
  }

  // release_block: cudaFree a free whole-segment block (in its free list).
  void release_block(int32_t at) {
    remove_free(at);
    const Block& block = blocks_[at];
    device_.release(block.address);
    pool_bytes_ -= block.size;
    spare_.push_back(at);
  }

  // garbage_collect_cached_blocks: above threshold × allowed bytes, release unsplit
  // large-pool free blocks whose age (large-pool searches since they became free) is at least
  // the mean age, again with the new mean, until the excess is reclaimed or a pass frees
  // nothing. Candidates in the order the Python model walks them: pools in the order they
  // were first used, each in (size, address) order.
  void garbage_collect_cached_blocks() {
    int64_t threshold = static_cast<int64_t>(c_.gc_threshold *
                                             static_cast<double>(c_.allowed_memory_maximum));
    if (pool_bytes_ <= threshold) return;
    int64_t target = pool_bytes_ - threshold;
    int64_t now = gc_calls_[0];
    std::vector<int32_t> candidates;
    for (int64_t pool_key : pool_order_) {
      if (pool_key & 1) continue;
      for (const Key& key : free_[pool_key]) {
        const Block& block = blocks_[key.block];
        if (block.prev < 0 && block.next < 0) candidates.push_back(key.block);
      }
    }
    int64_t total_age = 0;
    for (int32_t at : candidates) total_age += now - blocks_[at].gc_base;
    int64_t count = static_cast<int64_t>(candidates.size());
    int64_t reclaimed = 0;
    bool freed = true;
    while (reclaimed < target && freed && count > 0) {
      double age_threshold = static_cast<double>(total_age) / static_cast<double>(count);
      freed = false;
      std::vector<int32_t> kept;
      for (int32_t at : candidates) {
        int64_t age = now - blocks_[at].gc_base;
        if (static_cast<double>(age) >= age_threshold) {
          freed = true;
          reclaimed += blocks_[at].size;
          total_age -= age;
          --count;
          release_block(at);
        } else {
          kept.push_back(at);
        }
      }
      candidates.swap(kept);
    }
  }

  // The free list of a pool, made on first use (the Python dict's insertion order kept).
  std::vector<Key>& pool(int64_t pool_key) {
    auto it = free_.find(pool_key);
    if (it != free_.end()) return it->second;
    pool_order_.push_back(pool_key);
    return free_[pool_key];
  }

  // release_available_cached_blocks (only with max_split_size): free the smallest block of
  // this pool >= max(rounded, max_split_size); else oversize blocks from the largest down
  // until that many bytes went.
  bool release_available_cached_blocks(int64_t rounded, int64_t pool_key) {
    if (c_.max_split_size == c_.no_limit) return false;
    std::vector<Key>& keys = free_[pool_key];
    int64_t target = std::max(rounded, c_.max_split_size);
    auto it = std::lower_bound(keys.begin(), keys.end(), Key{target, INT64_MIN, 0});
    if (it != keys.end()) {
      release_block(it->block);
      return true;
    }
    int64_t released = 0;
    int64_t index = static_cast<int64_t>(it - keys.begin()) - 1;
    while (released < target && index >= 0 && keys[index].size >= c_.max_split_size) {
      Key key = keys[index];
      release_block(key.block);
      released += key.size;
      --index;
    }
    return released >= target;
  }

  // release_cached_blocks: every unsplit free block, large pools first, then small, each
  // pool by stream and its blocks in (size, address) order (ReleasePath's order).
  void release_cached_blocks() {
    std::vector<int64_t> order;
    for (const auto& [key, keys] : free_) order.push_back(key);
    std::sort(order.begin(), order.end(), [](int64_t a, int64_t b) {
      return (a & 1) != (b & 1) ? (a & 1) < (b & 1) : a < b;
    });
    for (int64_t pool_key : order) {
      std::vector<Key>& keys = free_[pool_key];
      std::vector<Key> kept;
      kept.reserve(keys.size());
      for (const Key& key : keys) {
        const Block& block = blocks_[key.block];
        if (block.prev < 0 && block.next < 0) {
          device_.release(block.address);
          pool_bytes_ -= block.size;
          spare_.push_back(key.block);
          --free_count_;
        } else {
          kept.push_back(key);
        }
      }
      keys.swap(kept);
    }
  }

  PyTorchConfig c_;
  Device& device_;
  std::vector<Block> blocks_;
  std::vector<int32_t> spare_;
  std::map<int64_t, std::vector<Key>> free_;  // pool key (stream << 1 | small) -> free list
  std::vector<int64_t> pool_order_;           // pool keys in the order first used
  int64_t gc_calls_[2] = {0, 0};              // searches per pool kind (large, small)
  int64_t free_count_ = 0;
  int64_t pool_bytes_ = 0, peak_pool_bytes_ = 0;
};

}  // namespace allocsim
