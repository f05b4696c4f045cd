// CuPy's default memory pool: policies/cupy_pool.py's CuPyPoolAllocator (which follows
// cupy/cupy cupy/cuda/memory.pyx: _round_size, _Arena.get_chunk / try_merge_chunk /
// insert_chunk, _Chunk.split, SingleDeviceMemoryPool._malloc / _try_malloc / free_all_blocks).
//
// The Python module is the specification; this is its twin, held to it by
// tests/test_native_differential.py. From Python (CuPyConfig): the allocation unit (512 B),
// the limit the Python pool computed (set_limit's size or fraction × capacity; 0 = none). An
// arena is SortedBins by (size, creation id) (sorted_bins.hpp), whose bins are a layout of its
// own: the order of its keys is _Arena's.
//
// Invariants (cupy_pool.py's): a cudaMalloc'd block's chunks tile it, linked by address (-1
// at its ends); every chunk keeps the arena of the stream whose allocation made its block; a
// chunk is in its arena exactly while free, under (size, creation id) — CuPy's (size,
// id(chunk)), the creation order standing in for the object's address; no two neighbours are
// both free. A chunk in use never moves: its index is the engine's handle.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "device.hpp"
#include "limit_window.hpp"
#include "records.hpp"
#include "sorted_bins.hpp"

namespace allocsim {

struct CuPyConfig {
  int64_t unit;                 // ALLOCATION_UNIT_SIZE
  int64_t limit;                // CuPyPoolAllocator.get_limit(): 0 = none
};

class CuPyPolicy : public Counters {
 public:
  CuPyPolicy(CuPyConfig config, Device& device)
      : c_(std::move(config)), device_(&device), arenas_(0) {
    // malloc's _round_size rounds by mask (ALLOCATION_UNIT_SIZE, 512: a power of two).
    require_power_of_two(c_.unit, "cupy: the allocation unit must be a power of two");
  }

  // malloc: the smallest free chunk of this stream's arena that fits (split, the caller
  // keeping the low end), else a new block of exactly the rounded size; -1 on OOM.
  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const CuPyConfig& config) { device_ = &device; c_ = config; }

  LimitWindow limit_window;  // the limit's decisions (cupy_pool.py's limit_window)

  ALLOCSIM_HOT
  int64_t malloc(int64_t size, int64_t stream, int64_t* handle) {
    int64_t rounded = round_up_by_mask(size, c_.unit);  // _round_size
    int32_t arena = arenas_.of(stream);
    SortedBins::Key key;
    int32_t at;
    if (arenas_[arena].lower_bound(rounded, true, &key)) {  // _Arena.get_chunk
      at = key.chunk;
      chunks_[at].free = false;
      int64_t rest_size = chunks_[at].size - rounded;
      if (rest_size) {  // _Chunk.split: the rest is a new (younger) chunk, free at once
        int32_t after = chunks_[at].next;
        int32_t rest = new_chunk(chunks_[at].address + rounded, rest_size, arena, at, after);
        if (after >= 0) chunks_[after].prev = rest;
        chunks_[at].next = rest;
        chunks_[at].size = rounded;
        chunks_[rest].free = true;
        arenas_[arena].add(rest_size, chunks_[rest].cid, rest);
      }
    } else {
      int64_t base = try_malloc(rounded);
      if (base < 0) {
        ++num_ooms;
        return -1;
      }
      at = new_chunk(base, rounded, arena, -1, -1);
    }
    chunks_[at].requested = size;
    handed(rounded, size);
    *handle = at;
    return chunks_[at].address;
  }

  // free: merge with the next chunk while free, then the previous one (whose object stays),
  // and back into the arena.
  ALLOCSIM_HOT
  void free(int64_t handle) {
    int32_t at = static_cast<int32_t>(handle);
    returned(chunks_[at].size, chunks_[at].requested);
    SortedBins& arena = arenas_[chunks_[at].arena];
    int32_t after = chunks_[at].next;
    if (after >= 0 && chunks_[after].free) {
      arena.remove(chunks_[after].size, chunks_[after].cid);
      absorb_next(chunks_, at);
    }
    int32_t before = chunks_[at].prev;
    if (before >= 0 && chunks_[before].free) {
      arena.remove(chunks_[before].size, chunks_[before].cid);
      absorb_next(chunks_, before);
      at = before;
    }
    chunks_[at].free = true;
    arena.add(chunks_[at].size, chunks_[at].cid, at);
  }

  int64_t largest_free() const { return arenas_.largest(); }
  int64_t free_blocks() const { return arenas_.size(); }
  int64_t pool_bytes() const { return total_bytes_; }
  int64_t peak_pool_bytes() const { return peak_total_bytes_; }

  // decision_rows (sim/questions/run_repeats.py's cupy_rows, its twin): a row of kRowWidth
  // per chunk — address, size, in use (1) or free (0), its arena's stream, its creation id
  // (the caller ranks them: only their order decides) — the free ones from the arenas,
  // those in use from the live buffers' handles. What a stretch with no device call can
  // change of _cupy_state (the blocks held, the total, the limit and the arenas change only
  // with one; the links follow from the addresses within the blocks).
  void decision_rows(const std::vector<int64_t>& live, std::vector<int64_t>& rows) const {
    const std::vector<SortedBins>& arenas = arenas_.all();
    for (int32_t arena = 0; arena < static_cast<int32_t>(arenas.size()); ++arena) {
      int64_t stream = arenas_.stream_at(arena);
      for (const SortedBins::Key& key : arenas[arena].ascending()) {
        const Chunk& chunk = chunks_[key.chunk];
        rows.insert(rows.end(), {chunk.address, chunk.size, 0, stream, chunk.cid});
      }
    }
    for (int64_t handle : live) {
      const Chunk& chunk = chunks_[static_cast<int32_t>(handle)];
      rows.insert(rows.end(),
                  {chunk.address, chunk.size, 1, arenas_.stream_at(chunk.arena), chunk.cid});
    }
  }
  int64_t address_of(int64_t handle) const { return chunks_[static_cast<int32_t>(handle)].address; }

 private:
  // A record is one cache line: its index becomes its offset by a shift (at 48 bytes, a
  // multiply on every access) and no record straddles two lines.
  struct alignas(64) Chunk {
    int64_t size, address, requested, cid;
    int32_t prev, next;  // neighbours in the block by address; -1 at its ends
    int32_t arena;
    bool free;
  };

  // A chunk in use (the caller frees it) with the next creation id.
  ALLOCSIM_HOT
  int32_t new_chunk(int64_t address, int64_t size, int32_t arena, int32_t prev, int32_t next) {
    int32_t at = chunks_.make();
    Chunk& chunk = chunks_[at];  // field by field (hot_path.hpp)
    chunk.size = size;
    chunk.address = address;
    chunk.requested = 0;
    chunk.cid = next_cid_++;
    chunk.prev = prev;
    chunk.next = next;
    chunk.arena = arena;
    chunk.free = false;
    return at;
  }

  bool fits_limit(int64_t rounded) {
    bool fits = total_bytes_ + rounded <= c_.limit;
    limit_window.at_least(total_bytes_ + rounded, fits);
    return fits;
  }

  // _try_malloc: the limit with its two free_all_blocks retries, then cudaMalloc with its two
  // (three device attempts; the simulation has no Python garbage for gc.collect to find).
  int64_t try_malloc(int64_t rounded) {
    if (c_.limit) {
      limit_window.at_least(rounded, rounded <= c_.limit);
      if (rounded > c_.limit) return -1;
      if (!fits_limit(rounded)) {
        free_all_blocks();
        if (!fits_limit(rounded)) {
          free_all_blocks();
          if (!fits_limit(rounded)) return -1;
        }
      }
    }
    total_bytes_ += rounded;
    int64_t base = device_->reserve(rounded);
    for (int retry = 0; base < 0 && retry < 2; ++retry) {
      free_all_blocks();
      base = device_->reserve(rounded);
    }
    if (base < 0) {
      total_bytes_ -= rounded;
      return -1;
    }
    if (total_bytes_ > peak_total_bytes_) peak_total_bytes_ = total_bytes_;
    return base;
  }

  // free_all_blocks: cudaFree every free chunk that is a whole block, arenas in the order
  // made, each in (size, creation id) order.
  void free_all_blocks() {
    for (SortedBins& arena : arenas_.all()) {
      if (arena.empty()) continue;
      for (const SortedBins::Key& key : arena.ascending()) {
        const Chunk& chunk = chunks_[key.chunk];
        if (chunk.prev >= 0 || chunk.next >= 0) continue;
        arena.remove(key.size, key.tie);
        total_bytes_ -= chunk.size;
        device_->release(chunk.address);
        chunks_.recycle(key.chunk);
      }
    }
  }

  CuPyConfig c_;
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  Records<Chunk> chunks_;
  StreamIndexes arenas_;  // one per stream, in the order the streams came
  int64_t next_cid_ = 0;
  int64_t total_bytes_ = 0, peak_total_bytes_ = 0;
};

}  // namespace allocsim
