// PyTorch's CUDA caching allocator, every setting: policies/pytorch/caching.py (malloc, free),
// pytorch/oom.py (the miss path: garbage collection, alloc_block, the two releases and the
// retry), pytorch/settings.py (round_size, get_allocation_size) and pytorch/expandable.py
// (expandable segments), which follow c10/cuda/CUDACachingAllocator.cpp: get_free_block's
// walk, find_expandable_block, map_block, unmap_block, release_expandable_segment and
// ExpandableSegment::map/unmap (a range mapped rounds up to whole pages; an unmap takes the
// whole pages inside a free block, the parts around them staying free blocks).
//
// The Python modules are the specification; this is their twin, held to them by
// tests/test_native_differential.py. Constants (512 B blocks, the 1 MiB small limit, 2 and
// 20 MiB segments and pages, the 10 MiB large threshold, 2 MiB rounding of large segments,
// the allowed maximum, the virtual ranges' sizes) come from Python.
//
// Invariants (pytorch/blocks.py's): a segment's blocks tile it, linked by address; a block is
// free and mapped exactly when its request is 0, and then it is in its pool's free list — one
// list per (stream, small) pool, a SortedBins by (size, address); unmapped space of an expandable
// segment is a block whose request is kUnmapped, in its pool's unmapped list (by address); no
// two neighbours are both free and mapped, nor both unmapped. An allocated block's record
// never moves: its index is the engine's handle.
#pragma once

#include <algorithm>
#include <cstdint>
#include <climits>
#include <map>
#include <utility>
#include <stdexcept>
#include <vector>

#include "hot_path.hpp"

#include "device.hpp"
#include "limit_window.hpp"
#include "records.hpp"
#include "sorted_bins.hpp"

// A function kept out of the engine's loop (see malloc_in_any_pool).
#if defined(__GNUC__) || defined(__clang__)
#define ALLOCSIM_PYTORCH_OUT_OF_LINE __attribute__((noinline))
#else
#define ALLOCSIM_PYTORCH_OUT_OF_LINE
#endif

namespace allocsim {

struct PyTorchConfig {
  int64_t min_block_size, small_size, small_buffer, large_buffer, min_large_alloc, round_large;
  bool set_fraction;
  int64_t allowed_memory_maximum;
  std::vector<int64_t> divisions;  // roundup_power2_divisions per interval; empty: none > 1
  int64_t max_split_size;          // no_limit when unset
  int64_t no_limit;                // pytorch/settings.py's NO_LIMIT (SIZE_MAX in PyTorch)
  int64_t max_non_split_rounding;
  bool gc_on;                      // set_fraction and garbage_collection_threshold > 0
  double gc_threshold;             // garbage_collection_threshold
  bool expandable = false;         // expandable_segments
  // A new virtual range's bytes, small and large pool (ExpandableSegments._range_size).
  int64_t range_small = 0, range_large = 0;
};

class PyTorchPolicy {
 public:
  PyTorchPolicy(PyTorchConfig config, Device& device) : c_(config), device_(&device) {
    // round_size rounds to min_block_size by mask (kMinBlockSize, 512: a power of two).
    require_power_of_two(c_.min_block_size, "pytorch: min_block_size must be a power of two");
    settings_ = settings_of(c_);
  }

  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const PyTorchConfig& config) {
    device_ = &device;
    c_ = config;
    settings_ = settings_of(c_);
  }

  // malloc's settings are resolved once, at open: the rest of it (malloc_in_pool) is compiled
  // for each usual mix with that mix's settings constant, so their branches fold away (each
  // tested on every malloc cost ~17 instructions at the defaults), and for any other mix
  // reads them from the config.
  ALLOCSIM_HOT
  int64_t malloc(int64_t size, int64_t stream, int64_t* handle) {
    int64_t rounded = round_size(size);
    bool small = rounded <= c_.small_size;
    // Tests rather than a switch: its jump table cost six instructions per malloc.
    if (settings_ == Settings::kDefaults) {
      return malloc_in_pool<Fixed<false, false, false>>(size, rounded, small, stream, handle);
    }
    if (settings_ == Settings::kExpandable) {
      return malloc_in_pool<Fixed<true, false, false>>(size, rounded, small, stream, handle);
    }
    if (settings_ == Settings::kMaxSplitSize) {
      return malloc_in_pool<Fixed<false, false, true>>(size, rounded, small, stream, handle);
    }
    if (settings_ == Settings::kGarbageCollection) {
      return malloc_in_pool<Fixed<false, true, false>>(size, rounded, small, stream, handle);
    }
    return malloc_in_any_pool(size, rounded, small, stream, handle);
  }

  // free_block: merge with the previous block, then the next one, each when free.
  ALLOCSIM_HOT
  void free(int64_t handle) {
    int32_t at = static_cast<int32_t>(handle);
    Block* block = &blocks_[at];
    int64_t size = block->size;
    bytes_in_use -= size;
    requested -= block->req;
    ++num_frees;
    block->req = 0;
    int32_t before = block->prev, after = block->next;
    // remove_free and insert_free, the pool looked up once: a segment's blocks share it.
    SortedBins& keys = pools_[block->pool];
    if (before >= 0 && blocks_[before].req == 0) {
      keys.remove(blocks_[before].size, blocks_[before].address);
      blocks_[before].next = after;
      if (after >= 0) blocks_[after].prev = before;
      blocks_.recycle(at);
      size += blocks_[before].size;
      at = before;
      block = &blocks_[at];
    }
    if (after >= 0 && blocks_[after].req == 0) {
      keys.remove(blocks_[after].size, blocks_[after].address);
      int32_t beyond = blocks_[after].next;
      block->next = beyond;
      if (beyond >= 0) blocks_[beyond].prev = at;
      blocks_.recycle(after);
      size += blocks_[after].size;
    }
    block->size = size;
    keys.add(size, block->address, at);
    if (c_.gc_on) block->gc_base = gc_calls_[pool_keys_[block->pool] & 1];
  }

  // stats(): the largest free block of any pool.
  int64_t largest_free() const {
    int64_t largest = 0;
    for (const SortedBins& keys : pools_) largest = std::max(largest, keys.largest());
    return largest;
  }
  int64_t free_blocks() const {
    int64_t count = 0;
    for (const SortedBins& keys : pools_) count += keys.size();
    return count;
  }
  int64_t pool_bytes() const { return pool_bytes_; }
  int64_t peak_pool_bytes() const { return peak_pool_bytes_; }

  // decision_rows (sim/questions/run_repeats.py's pytorch_rows, its twin): a row of
  // kRowWidth per block — address, size, allocated (1), free (0) or unmapped (-1), its pool
  // key, and with garbage collection on a free block's age (its pool kind's searches since it
  // became free; else 0) — the free blocks from the pools, the unmapped ones from their
  // lists, the allocated ones from the live buffers' handles. What a stretch with no device
  // call can change of _pytorch_state (segments, reserved bytes and the pools change only
  // with one).
  void decision_rows(const std::vector<int64_t>& live, std::vector<int64_t>& rows) const {
    for (const SortedBins& keys : pools_) {
      for (const SortedBins::Key& key : keys.ascending()) {
        const Block& block = blocks_[key.chunk];
        int64_t pool_key = pool_keys_[block.pool];
        int64_t age = c_.gc_on ? gc_calls_[pool_key & 1] - block.gc_base : 0;
        rows.insert(rows.end(), {block.address, block.size, 0, pool_key, age});
      }
    }
    for (const auto& [pool_key, list] : unmapped_) {
      for (const auto& [address, at] : list) {
        rows.insert(rows.end(), {address, blocks_[at].size, -1, pool_key, 0});
      }
    }
    for (int64_t handle : live) {
      const Block& block = blocks_[static_cast<int32_t>(handle)];
      rows.insert(rows.end(), {block.address, block.size, 1, pool_keys_[block.pool], 0});
    }
  }
  int64_t address_of(int64_t handle) const { return blocks_[static_cast<int32_t>(handle)].address; }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0, requested = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
  int64_t bytes_requested() const { return requested; }
  // The memory fraction's decisions (pytorch/oom.py's ReleasePath.limit_window).
  LimitWindow limit_window;

 private:
  // The settings malloc_in_pool tests, as a type: expandable segments, garbage collection
  // (its age counts), and whether max_split_size is set (unset it is no_limit, which no block
  // reaches: get_free_block has nothing to reject).
  template <bool kExpandable, bool kGarbageCollection, bool kMaxSplitSize>
  struct Fixed {
    static constexpr bool expandable(const PyTorchConfig&) { return kExpandable; }
    static constexpr bool gc_on(const PyTorchConfig&) { return kGarbageCollection; }
    static constexpr bool max_split_set(const PyTorchConfig&) { return kMaxSplitSize; }
  };
  struct FromConfig {  // any other mix: read from the config on every malloc
    static bool expandable(const PyTorchConfig& c) { return c.expandable; }
    static bool gc_on(const PyTorchConfig& c) { return c.gc_on; }
    static bool max_split_set(const PyTorchConfig&) { return true; }  // its tests still hold
  };
  enum class Settings { kDefaults, kExpandable, kMaxSplitSize, kGarbageCollection, kOther };
  static Settings settings_of(const PyTorchConfig& c) {
    bool max_split_set = c.max_split_size != c.no_limit;
    int set = int{c.expandable} + int{c.gc_on} + int{max_split_set};
    if (set == 0) return Settings::kDefaults;
    if (set > 1) return Settings::kOther;
    if (c.expandable) return Settings::kExpandable;
    return max_split_set ? Settings::kMaxSplitSize : Settings::kGarbageCollection;
  }

  // Any other mix, out of the engine's loop: a fifth copy inlined there pushed the compiler's
  // inliner past its limits, which then left the bins' own steps out of line for every mix.
  ALLOCSIM_PYTORCH_OUT_OF_LINE
  int64_t malloc_in_any_pool(int64_t size, int64_t rounded, bool small, int64_t stream,
                             int64_t* handle) {
    return malloc_in_pool<FromConfig>(size, rounded, small, stream, handle);
  }

  // malloc past the rounding and the pool's kind: get_free_block, else the miss path; the
  // split (should_split, alloc_found_block: the caller keeps the low end); the counts.
  template <class S>
  ALLOCSIM_HOT
  int64_t malloc_in_pool(int64_t size, int64_t rounded, bool small, int64_t stream,
                         int64_t* handle) {
    int64_t pool_key = static_cast<int64_t>(static_cast<uint64_t>(stream) << 1) | (small ? 1 : 0);
    SortedBins* keys = &pools_[stream_pool(stream, pool_key)];
    if (S::gc_on(c_)) ++gc_calls_[small ? 1 : 0];
    int32_t at = get_free_block<S>(*keys, rounded);
    if (at < 0) {
      at = malloc_miss(rounded, small, stream, pool_key);
      if (at < 0) return -1;
      keys = &pools_[blocks_[at].pool];  // the miss may have made a pool (pools_ moved)
    }
    int64_t block_size = blocks_[at].size;
    int64_t remaining = block_size - rounded;
    if (should_split(remaining, rounded, small || S::expandable(c_))) {
      int64_t address = blocks_[at].address + rounded;
      int32_t rest = new_block(address, remaining, blocks_[at].pool);
      Block& block = blocks_[at];
      Block& piece = blocks_[rest];
      piece.prev = at;
      piece.next = block.next;
      if (block.next >= 0) blocks_[block.next].prev = rest;
      block.next = rest;
      block.size = rounded;
      keys->add(remaining, address, rest);  // insert_free: the block's own pool
      if (S::gc_on(c_)) piece.gc_base = gc_calls_[small ? 1 : 0];
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

  // A record is one cache line: its index becomes its offset by a shift (at 48 bytes, a
  // multiply on every access: 0.7% of a replay's instructions) and no record straddles two lines.
  struct alignas(64) Block {
    int64_t size, address, req;  // req: the caller's request while allocated, 0 while free
    int32_t prev, next;          // neighbours in the segment; -1 at its ends (a spare record's
                                 // next: the next spare, Records::recycle)
    int32_t pool;                // its pool's number: pools_ and pool_keys_ (looked up once)
    int64_t gc_base;             // the pool's search count when it became free (GC's age)
  };
  using Key = SortedBins::Key;  // (size, tie = address, chunk = the block)

  ALLOCSIM_HOT
  // A free block of pool number `pool`, its fields written one by one (hot_path.hpp).
  int32_t new_block(int64_t address, int64_t size, int32_t pool) {
    int32_t at = blocks_.make();
    Block& block = blocks_[at];
    block.size = size;
    block.address = address;
    block.req = 0;
    block.prev = -1;
    block.next = -1;
    block.pool = pool;
    block.gc_base = 0;
    return at;
  }

  ALLOCSIM_HOT
  void insert_free(int32_t at) {
    const Block& block = blocks_[at];
    pools_[block.pool].add(block.size, block.address, at);
  }

  ALLOCSIM_HOT
  void remove_free(int32_t at) {
    const Block& block = blocks_[at];
    pools_[block.pool].remove(block.size, block.address);
  }

  // round_size (pytorch/settings.py): 512 B at least; with a division count d > 1 for the
  // size's interval and size > 512·d, up to the next of d steps between powers of two; else up
  // to a multiple of 512.
  ALLOCSIM_HOT
  int64_t round_size(int64_t size) const {
    if (size < c_.min_block_size) return c_.min_block_size;
    if (!c_.divisions.empty()) {
      int bits = 64 - __builtin_clzll(static_cast<uint64_t>(size));
      int index = std::min(std::max(bits - 1 - 20, 0), static_cast<int>(c_.divisions.size()) - 1);
      int64_t d = c_.divisions[index];
      if (d > 1 && size > c_.min_block_size * d) return roundup_power2_next_division(size, d);
    }
    return round_up_by_mask(size, c_.min_block_size);
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

  // _get_free_block: the smallest block of this stream and pool that fits (moved on by the
  // expandable walk), or -1 when there is none or max_split_size rejects it (no search
  // beyond it). The block found leaves the free list.
  template <class S>
  ALLOCSIM_HOT
  int32_t get_free_block(SortedBins& keys, int64_t rounded) {
    Key found;
    SortedBins::Position at;
    if (!keys.find(rounded, &found, &at)) return -1;
    bool walked = false;
    if (S::expandable(c_)) {
      Key first = found;
      found = best_fit(keys, found);
      walked = found.chunk != first.chunk;
    }
    int64_t block_size = found.size;
    if (S::max_split_set(c_)) {
      if (rounded < c_.max_split_size) {
        if (block_size >= c_.max_split_size) return -1;
      } else if (block_size >= rounded + c_.max_non_split_rounding) {
        return -1;
      }
    }
    // The block found first leaves by its position (no second search); one the walk moved
    // on to, by its key.
    if (walked) keys.remove(found.size, found.tie);
    else keys.erase_at(at);
    return found.chunk;
  }

  // should_split (pytorch/settings.py): a block of rounded + remaining bytes
  // serving rounded splits off its rest when, in the small pool or with expandable segments,
  // remaining >= kMinBlockSize; in the large pool when rounded < max_split_size and
  // remaining > kSmallSize.
  ALLOCSIM_HOT
  bool should_split(int64_t remaining, int64_t rounded, bool small_or_expandable) const {
    if (small_or_expandable) return remaining >= c_.min_block_size;
    return rounded < c_.max_split_size && remaining > c_.small_size;
  }

  // get_allocation_size (pytorch/settings.py): the segment size for a
  // rounded request that missed the cache.
  int64_t get_allocation_size(int64_t rounded) const {
    if (rounded <= c_.small_size) return c_.small_buffer;
    if (rounded < c_.min_large_alloc) return c_.large_buffer;
    return (rounded + c_.round_large - 1) / c_.round_large * c_.round_large;
  }

  // ReleasePath._malloc_miss: garbage collection (when on); alloc_block;
  // release_available_cached_blocks (with max_split_size) and alloc_block again;
  // release_cached_blocks and alloc_block again; else an OOM. The block found is in no free
  // list.
  int32_t malloc_miss(int64_t rounded, bool small, int64_t stream, int64_t pool_key) {
    int64_t alloc_size = get_allocation_size(rounded);
    if (c_.gc_on) garbage_collect_cached_blocks();
    int32_t found = alloc_block(alloc_size, rounded, small, stream, pool_key);
    if (found < 0 && release_available_cached_blocks(rounded, pool_key)) {
      found = alloc_block(alloc_size, rounded, small, stream, pool_key);
    }
    if (found < 0) {
      release_cached_blocks();
      found = alloc_block(alloc_size, rounded, small, stream, pool_key);
    }
    if (found < 0) ++num_ooms;
    return found;
  }

  // alloc_block: a new segment of alloc_size (cudaMalloc), or with expandable segments the
  // pages that hold `rounded`; the limit of a memory fraction is checked against alloc_size
  // either way.
  int32_t alloc_block(int64_t alloc_size, int64_t rounded, bool small, int64_t stream,
                      int64_t pool_key) {
    if (c_.set_fraction) {
      bool fits = pool_bytes_ + alloc_size <= c_.allowed_memory_maximum;
      limit_window.at_least(pool_bytes_ + alloc_size, fits);
      if (!fits) return -1;
    }
    if (c_.expandable) return try_allocate_expandable_block(stream, small, rounded, pool_key);
    int64_t base = device_->reserve(alloc_size);
    if (base < 0) return -1;
    int32_t at = new_block(base, alloc_size, pool_number(pool_key));
    grew(alloc_size);
    return at;
  }

  void grew(int64_t nbytes) {
    pool_bytes_ += nbytes;
    if (pool_bytes_ > peak_pool_bytes_) peak_pool_bytes_ = pool_bytes_;
  }

  // release_block: cudaFree a free whole-segment block (in its free list).
  void release_block(int32_t at) {
    remove_free(at);
    const Block& block = blocks_[at];
    device_->release(block.address);
    pool_bytes_ -= block.size;
    blocks_.recycle(at);
  }

  // garbage_collect_cached_blocks: above threshold × allowed bytes, release unsplit
  // large-pool free blocks whose age (large-pool searches since they became free) is at least
  // the mean age, again with the new mean, until the excess is reclaimed or a pass frees
  // nothing. Candidates in the order the Python model walks them: pools in the order they
  // were first used, each in (size, address) order.
  void garbage_collect_cached_blocks() {
    if (c_.expandable) return;
    int64_t threshold = static_cast<int64_t>(c_.gc_threshold *
                                             static_cast<double>(c_.allowed_memory_maximum));
    int64_t pool_bytes = pool_bytes_;
    if (!above_gc_threshold(pool_bytes, threshold)) return;
    int64_t now = gc_calls_[0];
    std::vector<int32_t> candidates;
    for (size_t number = 0; number < pool_keys_.size(); ++number) {
      if (pool_keys_[number] & 1) continue;
      for (const Key& key : pools_[number].ascending()) {
        const Block& block = blocks_[key.chunk];
        if (block.prev < 0 && block.next < 0) candidates.push_back(key.chunk);
      }
    }
    int64_t total_age = 0;
    for (int32_t at : candidates) total_age += now - blocks_[at].gc_base;
    int64_t count = static_cast<int64_t>(candidates.size());
    int64_t reclaimed = 0;
    bool freed = true;
    while (above_gc_threshold(pool_bytes - reclaimed, threshold) && freed && count > 0) {
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

  // Whether `held` bytes are over garbage collection's threshold, int(gc_threshold x
  // allowed_memory_maximum): collection's every decision against the limit (whether to start;
  // whether what it has reclaimed is enough), noted as the decision on allowed_memory_maximum
  // it is (pytorch/oom.py's _above_gc_threshold).
  bool above_gc_threshold(int64_t held, int64_t threshold) {
    bool above = held > threshold;
    limit_window.at_least(least_maximum_reaching(held), !above);
    return above;
  }

  // The least allowed_memory_maximum whose threshold int(gc_threshold x maximum) is at least
  // `held`, from the quotient stepped to the exact integer (pytorch/oom.py's
  // _least_maximum_reaching); kNoUpper past 2**53.
  int64_t least_maximum_reaching(int64_t held) const {
    if (held <= 0) return 0;
    double share = c_.gc_threshold;
    double estimate = static_cast<double>(held) / share;
    if (estimate >= static_cast<double>(int64_t{1} << 53)) return kNoUpper;
    int64_t maximum = static_cast<int64_t>(estimate);
    while (static_cast<int64_t>(share * static_cast<double>(maximum)) >= held) --maximum;
    while (static_cast<int64_t>(share * static_cast<double>(maximum)) < held) ++maximum;
    return maximum;
  }

  // The free list of a pool, made on first use (the Python dict's insertion order kept). A
  // run has a few pools (two per stream): a scan of their keys beats a tree's lookup.
  SortedBins& pool(int64_t pool_key) { return pools_[pool_number(pool_key)]; }
  // The pool number of `pool_key`, a pool of `stream`: the last stream's two pools are
  // remembered (a trace's events mostly follow one stream; no scan of the keys per malloc).
  ALLOCSIM_HOT
  int32_t stream_pool(int64_t stream, int64_t pool_key) {
    if (stream != last_stream_) {
      last_stream_ = stream;
      last_pools_[0] = last_pools_[1] = -1;
    }
    int32_t& number = last_pools_[pool_key & 1];
    if (number < 0) number = pool_number(pool_key);
    return number;
  }
  int32_t pool_number(int64_t pool_key) {
    for (size_t number = 0; number < pool_keys_.size(); ++number) {
      if (pool_keys_[number] == pool_key) return static_cast<int32_t>(number);
    }
    pool_keys_.push_back(pool_key);
    pools_.emplace_back();
    return static_cast<int32_t>(pools_.size()) - 1;
  }

  // release_available_cached_blocks (only with max_split_size, never expandable segments):
  // free the smallest block of this pool >= max(rounded, max_split_size); else oversize
  // blocks from the largest down until that many bytes went.
  bool release_available_cached_blocks(int64_t rounded, int64_t pool_key) {
    if (c_.max_split_size == c_.no_limit || c_.expandable) return false;
    SortedBins& keys = pool(pool_key);
    int64_t target = std::max(rounded, c_.max_split_size);
    Key found;
    if (keys.lower_bound(target, false, &found)) {
      release_block(found.chunk);
      return true;
    }
    // Every key is below the target: from the largest down.
    std::vector<Key> below = keys.ascending();
    int64_t released = 0;
    int64_t index = static_cast<int64_t>(below.size()) - 1;
    while (released < target && index >= 0 && below[index].size >= c_.max_split_size) {
      Key key = below[index];
      release_block(key.chunk);
      released += key.size;
      --index;
    }
    return released >= target;
  }

  // release_cached_blocks: every unsplit free block, large pools first, then small, each
  // pool by stream and its blocks in (size, address) order (ReleasePath's order); with
  // expandable segments the whole pages of every free block are unmapped instead, in that
  // order, and a virtual range left wholly unmapped is forgotten.
  void release_cached_blocks() {
    std::vector<int64_t> order = pool_keys_;
    std::sort(order.begin(), order.end(), [](int64_t a, int64_t b) {
      return (a & 1) != (b & 1) ? (a & 1) < (b & 1) : a < b;
    });
    if (c_.expandable) {
      std::vector<int32_t> to_unmap;
      for (int64_t pool_key : order) {
        for (const Key& key : pool(pool_key).ascending()) to_unmap.push_back(key.chunk);
      }
      for (int32_t at : to_unmap) {
        int32_t unmapped = unmap_block(at);
        if (unmapped >= 0 && blocks_[unmapped].prev < 0 && blocks_[unmapped].next < 0) {
          release_expandable_segment(unmapped);
        }
      }
      return;
    }
    for (int64_t pool_key : order) {
      SortedBins& keys = pool(pool_key);
      for (const Key& key : keys.ascending()) {
        const Block& block = blocks_[key.chunk];
        if (block.prev < 0 && block.next < 0) {
          keys.remove(key.size, key.tie);
          device_->release(block.address);
          pool_bytes_ -= block.size;
          blocks_.recycle(key.chunk);
        }
      }
    }
  }

  // -- expandable segments (pytorch/expandable.py) ------------------------------------
  static constexpr int64_t kUnmapped = -1;  // pytorch/records.py's UNMAPPED: a block's request

  int64_t page_of(int64_t pool_key) const {
    return (pool_key & 1) ? c_.small_buffer : c_.large_buffer;
  }

  // The base of the virtual range holding address (_segment_of).
  int64_t range_base(int64_t address) const {
    return *(std::upper_bound(range_bases_.begin(), range_bases_.end(), address) - 1);
  }

  // A block's expandable size: its own plus the unmapped block right behind it.
  ALLOCSIM_HOT
  int64_t expandable_size(int32_t at) const {
    int32_t after = blocks_[at].next;
    if (after >= 0 && blocks_[after].req == kUnmapped) return blocks_[at].size + blocks_[after].size;
    return blocks_[at].size;
  }

  // ExpandableSegments.best_fit, get_free_block's walk with expandable segments: from the
  // first fitting block, move on to the next bigger block while its expandable size is
  // smaller (a tie stays).
  ALLOCSIM_HOT
  Key best_fit(const SortedBins& keys, Key it) const {
    int32_t after = blocks_[it.chunk].next;
    if (after < 0 || blocks_[after].req != kUnmapped) return it;
    int64_t current = expandable_size(it.chunk);
    Key next;
    while (keys.after(it, &next)) {
      int64_t following = expandable_size(next.chunk);
      if (following >= current) break;
      it = next;
      current = following;
    }
    return it;
  }

  void add_unmapped(int32_t at) {
    Block& block = blocks_[at];
    block.req = kUnmapped;
    auto& list = unmapped_[pool_keys_[block.pool]];
    std::pair<int64_t, int32_t> entry{block.address, at};
    list.insert(std::lower_bound(list.begin(), list.end(), entry), entry);
  }

  void drop_unmapped(int32_t at) {
    Block& block = blocks_[at];
    block.req = 0;
    auto& list = unmapped_[pool_keys_[block.pool]];
    list.erase(std::lower_bound(list.begin(), list.end(),
                                std::pair<int64_t, int32_t>{block.address, INT32_MIN}));
  }

  // try_merge_blocks: join dst (in no index) with its neighbour src if that is not allocated
  // and equally mapped; src leaves its index. Returns the joined (lower) block, or dst.
  int32_t try_merge(int32_t dst, int32_t src, bool dst_mapped) {
    if (src < 0) return dst;
    int64_t req = blocks_[src].req;
    if (req > 0 || (req != kUnmapped) != dst_mapped) return dst;
    if (dst_mapped) remove_free(src);
    else drop_unmapped(src);
    bool src_low = blocks_[src].address < blocks_[dst].address;
    int32_t low = src_low ? src : dst, high = src_low ? dst : src;
    int32_t beyond = blocks_[high].next;
    blocks_[low].size += blocks_[high].size;
    blocks_[low].next = beyond;
    if (beyond >= 0) blocks_[beyond].prev = low;
    blocks_.recycle(high);
    return low;
  }

  // find_expandable_block: over this pool's unmapped blocks by address, the first where a free
  // block just before it plus the free and unmapped space from there holds size; else a new
  // virtual range (one unmapped block).
  int32_t find_expandable_block(bool small, int64_t size, int64_t pool_key) {
    auto list = unmapped_.find(pool_key);
    if (list != unmapped_.end()) {
      for (const auto& entry : list->second) {
        int32_t candidate = entry.second;
        int32_t before = blocks_[candidate].prev;
        if (before >= 0 && blocks_[before].req <= 0) candidate = before;
        int64_t nbytes = 0;
        int32_t at = candidate;
        while (nbytes < size && at >= 0 && blocks_[at].req <= 0) {
          nbytes += blocks_[at].size;
          at = blocks_[at].next;
        }
        if (nbytes >= size) return candidate;
      }
    }
    int64_t nbytes = small ? c_.range_small : c_.range_large;
    int64_t base = device_->address_range(nbytes);
    int32_t at = new_block(base, nbytes, pool_number(pool_key));
    range_bases_.insert(std::upper_bound(range_bases_.begin(), range_bases_.end(), base), base);
    add_unmapped(at);
    return at;
  }

  // map_block: map the whole pages covering [address, address + size) of unmapped block `at`
  // (one device call); the rest stays unmapped; the mapped block joins its free neighbours
  // and the free list. Returns it, or -1 when the device refused.
  int32_t map_block(int32_t at, int64_t size) {
    int64_t address = blocks_[at].address, pool_key = pool_keys_[blocks_[at].pool];
    int64_t page = page_of(pool_key);
    int64_t nbytes = (size + page - 1) / page * page;
    if (!device_->map(address, nbytes)) return -1;
    drop_unmapped(at);
    if (nbytes < blocks_[at].size) {
      int32_t after = blocks_[at].next;
      int32_t piece = new_block(address + nbytes, blocks_[at].size - nbytes, blocks_[at].pool);
      blocks_[piece].prev = at;
      blocks_[piece].next = after;
      if (after >= 0) blocks_[after].prev = piece;
      blocks_[at].next = piece;
      blocks_[at].size = nbytes;
      add_unmapped(piece);
    }
    at = try_merge(at, blocks_[at].prev, true);
    at = try_merge(at, blocks_[at].next, true);
    insert_free(at);
    grew(nbytes);
    return at;
  }

  // try_allocate_expandable_block: map pages from the block find_expandable_block chose until
  // it holds size (pages mapped before a refusal stay mapped, free). The block found is in no
  // free list; -1 when the device refused.
  int32_t try_allocate_expandable_block(int64_t /*stream*/, bool small, int64_t size,
                                        int64_t pool_key) {
    int32_t at = find_expandable_block(small, size, pool_key);
    if (blocks_[at].req == kUnmapped) {
      at = map_block(at, std::min(blocks_[at].size, size));
      if (at < 0) return -1;
    }
    while (blocks_[at].size < size) {
      int32_t following = blocks_[at].next;
      if (following < 0) {  // the Python's None.next: an error, never a write past the blocks
        throw std::logic_error("pytorch: an expandable request ran past its virtual range");
      }
      at = map_block(following, std::min(size - blocks_[at].size, blocks_[following].size));
      if (at < 0) return -1;
    }
    remove_free(at);
    return at;
  }

  // unmap_block: unmap the whole pages inside free block `at` (one device call); the parts
  // before and after them stay free; the unmapped range joins unmapped neighbours. Returns
  // the unmapped block, or -1 when no whole page lies inside.
  int32_t unmap_block(int32_t at) {
    int64_t address = blocks_[at].address, size = blocks_[at].size;
    int64_t pool_key = pool_keys_[blocks_[at].pool];
    int64_t base = range_base(address), page = page_of(pool_key);
    int64_t begin = (address - base + page - 1) / page;
    int64_t end = (address + size - base) / page;
    if (begin >= end) return -1;
    remove_free(at);
    int64_t start = base + begin * page, length = (end - begin) * page;
    int64_t before_size = start - address;
    int64_t after_size = size - before_size - length;
    int32_t following = blocks_[at].next;
    int32_t previous = blocks_[at].prev;
    int32_t current = -1, unmapped = -1;
    const std::pair<int64_t, int64_t> pieces[3] = {
        {address, before_size}, {start, length}, {start + length, after_size}};
    for (const auto& [piece, piece_size] : pieces) {
      if (piece_size == 0) continue;
      if (piece == address) {
        current = at;
        blocks_[at].size = piece_size;
      } else {
        current = new_block(piece, piece_size, blocks_[at].pool);
        blocks_[current].prev = previous;
      }
      if (previous >= 0) blocks_[previous].next = current;
      previous = current;
      if (piece == start) unmapped = current;
    }
    blocks_[current].next = following;
    if (following >= 0) blocks_[following].prev = current;
    if (before_size) insert_free(at);
    if (after_size) insert_free(current);
    unmapped = try_merge(unmapped, blocks_[unmapped].prev, false);
    unmapped = try_merge(unmapped, blocks_[unmapped].next, false);
    add_unmapped(unmapped);
    device_->unmap(start, length);
    pool_bytes_ -= length;
    return unmapped;
  }

  // release_expandable_segment: forget a virtual range that is one unmapped block.
  void release_expandable_segment(int32_t at) {
    int64_t base = blocks_[at].address;
    drop_unmapped(at);
    range_bases_.erase(std::lower_bound(range_bases_.begin(), range_bases_.end(), base));
    blocks_.recycle(at);
  }


  PyTorchConfig c_;
  Settings settings_;  // which malloc_in_pool serves malloc (settings_of c_)
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  Records<Block> blocks_;  // spare records linked through their next (records.hpp)
  std::vector<int64_t> pool_keys_;  // pool keys (stream << 1 | small), in the order first used
  int64_t last_stream_ = 0;            // stream_pool's: the last stream asked
  int32_t last_pools_[2] = {-1, -1};   // and its large and small pools' numbers (-1: not yet)
  std::vector<SortedBins> pools_;    // their free lists, by (size, address)
  int64_t gc_calls_[2] = {0, 0};              // searches per pool kind (large, small)
  int64_t pool_bytes_ = 0, peak_pool_bytes_ = 0;
  // Expandable segments: per pool key its unmapped blocks as (address, block), by address;
  // the bases of the virtual ranges, sorted.
  std::map<int64_t, std::vector<std::pair<int64_t, int32_t>>> unmapped_;
  std::vector<int64_t> range_bases_;
};

}  // namespace allocsim
