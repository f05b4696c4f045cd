// BFC, preallocate and best-fit: policies/chunk_policy.py's ChunkPolicy over policies/chunks.py's
// ChunkMap and FreeIndex, with bfc.py's Extend (doubling, back-off) and
// DeallocateFreeRegions and best_fit.py's page growth and trim as the growth rules.
//
// The Python modules are the specification; this is their twin, held to them by
// tests/test_native_differential.py (every RunResult field, timeline bucket, stat and the
// address of every malloc). The tables and constants come from Python (ChunkConfig): the bin
// of each bit length (chunks.BIN), the alignment and split slack, BFC's memory limit, first
// region size and back-off factor, best-fit's page and heap base, as the Python policy built
// for the same device holds them.
//
// Invariants (chunks.py's): a region's chunks tile it, linked by address; no two neighbouring
// chunks are both free; a chunk is in the free index exactly when it is free. Free chunks sit
// in 21 bins by size class, each a vector sorted by (size, address), with a bitmask of the
// non-empty ones: best fit is a binary search in bin(rounded), then the first chunk of the next
// non-empty bin (the smallest fitting chunk, lowest address on ties). An in-use chunk's record
// never moves, so its index is the handle the engine keeps for the live buffer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "device.hpp"
#include "limit_window.hpp"

namespace allocsim {

struct ChunkConfig {
  enum Growth { kBfc, kBestFit } growth;
  std::vector<int> bin_of_bits;  // chunks.BIN: bin number by bit length
  int64_t alignment;             // ChunkPolicy.alignment
  int64_t max_slack;             // ChunkPolicy.max_slack (split when slack >= this)
  // BFC (bfc.py): memory_limit, curr_region_allocation_bytes at the start, MIN_ALLOCATION,
  // garbage_collection and kBackpedalFactor as a float.
  int64_t memory_limit = 0, first_region = 0, min_allocation = 256;
  bool garbage_collection = false;
  float backpedal_factor = 0.9f;
  // best-fit (best_fit.py): page, trim, heap_base.
  int64_t page = 0, heap_base = 0;
  bool trim = false;
};

class ChunkPolicy {
 public:
  ChunkPolicy(ChunkConfig config, Device& device)
      : c_(std::move(config)), device_(&device), curr_region_(c_.first_region) {
    bins_.resize(kBins);
  }

  // ChunkPolicy.malloc: the address handed out and its chunk (*handle); -1 on OOM.
  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const ChunkConfig& config) { device_ = &device; c_ = config; }

  int64_t malloc(int64_t size, int64_t /*stream*/, int64_t* handle) {
    int64_t rounded = (size + c_.alignment - 1) / c_.alignment * c_.alignment;
    int32_t found = pop_best_fit(rounded);
    if (found < 0 && make_room(rounded)) found = pop_best_fit(rounded);
    if (found < 0) {
      ++num_ooms;
      return -1;
    }
    Chunk& chunk = chunks_[found];
    int64_t chunk_size = chunk.size;
    bool split = chunk_size >= 2 * rounded || chunk_size - rounded >= c_.max_slack;
    chunk.free = false;
    chunk.requested = size;
    requested_sum += size;
    int64_t handed = chunk_size;
    if (split && chunk_size != rounded) {  // ChunkMap.hand_out: the caller keeps the low end
      int32_t rest = new_chunk(chunk.address + rounded, chunk_size - rounded);
      Chunk& kept = chunks_[found];  // new_chunk may have moved the records
      Chunk& after_rest = chunks_[rest];
      kept.size = rounded;
      after_rest.prev = found;
      after_rest.next = kept.next;
      after_rest.region = kept.region;
      if (kept.next >= 0) chunks_[kept.next].prev = rest;
      else regions_[kept.region].last = rest;
      kept.next = rest;
      index_add(rest);
      handed = rounded;
    }
    bytes_in_use += handed;
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    ++num_allocs;
    *handle = found;
    return chunks_[found].address;
  }

  // ChunkPolicy.free (ChunkMap.give_back_general): merge with the next chunk if free, then
  // the previous one; with best-fit's trim, unmap wholly free pages at the top.
  void free(int64_t handle) {
    int32_t at = static_cast<int32_t>(handle);
    Chunk* chunk = &chunks_[at];
    int64_t freed = chunk->size;
    requested_sum -= chunk->requested;
    chunk->requested = 0;
    int32_t after = chunk->next;
    if (after >= 0 && chunks_[after].free) {  // merge the next chunk into this one
      index_remove(after);
      chunk->size += chunks_[after].size;
      unlink(after);
    }
    int32_t before = chunk->prev;
    if (before >= 0 && chunks_[before].free) {  // merge this one into the previous
      index_remove(before);
      chunks_[before].size += chunk->size;
      unlink(at);
      at = before;
      chunk = &chunks_[at];
    }
    chunk->free = true;
    index_add(at);
    bytes_in_use -= freed;
    ++num_frees;
    if (c_.growth == ChunkConfig::kBestFit && c_.trim) trim();
  }

  // FreeIndex.largest: the largest free chunk's size (0 if none).
  int64_t largest_free() const {
    if (!nonempty_) return 0;
    int top = 31 - __builtin_clz(nonempty_);
    return bins_[top].back().size;
  }

  int64_t pool_bytes() const { return c_.growth == ChunkConfig::kBfc ? pool_bytes_ : mapped_; }
  int64_t peak_pool_bytes() const {
    return c_.growth == ChunkConfig::kBfc ? peak_pool_bytes_ : peak_mapped_;
  }
  int64_t free_blocks() const { return free_count_; }
  int64_t bytes_requested() const { return requested_sum; }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0, requested_sum = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
  LimitWindow limit_window;  // BFC's decisions against memory_limit (bfc.py's limit_window)

 private:
  static constexpr int kBins = 21;
  struct Chunk {
    int64_t size, address, requested;
    int32_t prev, next;  // neighbours in the region by address; -1 at its ends
    int32_t region;
    bool free;
  };
  struct Key {  // FreeIndex's key: ordered by (size, address)
    int64_t size, address;
    int32_t chunk;
    bool operator<(const Key& o) const {
      return size < o.size || (size == o.size && address < o.address);
    }
  };
  struct Region {
    int64_t base, size;
    int32_t first, last;
    bool live;
  };

  int bin(int64_t nbytes) const {
    int bits = nbytes > 0 ? 64 - __builtin_clzll(static_cast<uint64_t>(nbytes)) : 0;
    return c_.bin_of_bits[bits];
  }

  int32_t new_chunk(int64_t address, int64_t size) {
    int32_t at;
    if (!spare_.empty()) {
      at = spare_.back();
      spare_.pop_back();
    } else {
      at = static_cast<int32_t>(chunks_.size());
      chunks_.push_back(Chunk{});
    }
    chunks_[at] = Chunk{size, address, 0, -1, -1, -1, true};
    return at;
  }

  // Take chunk `at` out of its region's links (a merged neighbour) and recycle its record.
  void unlink(int32_t at) {
    Chunk& gone = chunks_[at];
    Region& region = regions_[gone.region];
    if (gone.prev >= 0) chunks_[gone.prev].next = gone.next;
    else region.first = gone.next;
    if (gone.next >= 0) chunks_[gone.next].prev = gone.prev;
    else region.last = gone.prev;
    spare_.push_back(at);
  }

  void index_add(int32_t at) {
    const Chunk& chunk = chunks_[at];
    int number = bin(chunk.size);
    std::vector<Key>& keys = bins_[number];
    Key key{chunk.size, chunk.address, at};
    if (keys.empty()) nonempty_ |= 1u << number;
    if (keys.empty() || keys.back() < key) keys.push_back(key);
    else keys.insert(std::lower_bound(keys.begin(), keys.end(), key), key);
    ++free_count_;
  }

  void index_remove(int32_t at) {
    const Chunk& chunk = chunks_[at];
    int number = bin(chunk.size);
    std::vector<Key>& keys = bins_[number];
    Key key{chunk.size, chunk.address, at};
    keys.erase(std::lower_bound(keys.begin(), keys.end(), key));
    if (keys.empty()) nonempty_ &= ~(1u << number);
    --free_count_;
  }

  // FreeIndex.pop_best_fit: the smallest free chunk >= rounded (lowest address on ties), out
  // of the index; -1 when none fits.
  int32_t pop_best_fit(int64_t rounded) {
    int number = bin(rounded);
    std::vector<Key>& keys = bins_[number];
    if (!keys.empty()) {
      auto it = std::lower_bound(keys.begin(), keys.end(), Key{rounded, INT64_MIN, 0});
      if (it != keys.end()) {
        int32_t at = it->chunk;
        keys.erase(it);
        if (keys.empty()) nonempty_ &= ~(1u << number);
        --free_count_;
        return at;
      }
    }
    uint32_t above = number + 1 < 32 ? nonempty_ >> (number + 1) : 0;
    if (!above) return -1;
    number += __builtin_ctz(above) + 1;
    std::vector<Key>& next = bins_[number];
    int32_t at = next.front().chunk;
    next.erase(next.begin());
    if (next.empty()) nonempty_ &= ~(1u << number);
    --free_count_;
    return at;
  }

  // ChunkMap.add_region: a new region becomes one free chunk.
  void add_region(int64_t base, int64_t nbytes) {
    int32_t region = static_cast<int32_t>(regions_.size());
    int32_t at = new_chunk(base, nbytes);
    chunks_[at].region = region;
    regions_.push_back(Region{base, nbytes, at, at, true});
    index_add(at);
  }

  bool make_room(int64_t rounded) {
    if (c_.growth == ChunkConfig::kBestFit) return grow(rounded);
    return extend(rounded) || (deallocate_free_regions(rounded) && extend(rounded));
  }

  // -- BFC (bfc.py) -----------------------------------------------------------------
  int64_t round_up(int64_t nbytes) const {  // round_bytes: up to min_allocation
    return (nbytes + c_.min_allocation - 1) / c_.min_allocation * c_.min_allocation;
  }

  int64_t backpedal_bytes(int64_t nbytes) const {
    // size_t x float kBackpedalFactor is a float, truncated back to size_t, then rounded up.
    float product = static_cast<float>(nbytes) * c_.backpedal_factor;
    int64_t truncated = static_cast<int64_t>(product);
    return (truncated + c_.min_allocation - 1) / c_.min_allocation * c_.min_allocation;
  }

  bool extend(int64_t rounded) {  // BFC's Extend
    int64_t available = (c_.memory_limit - pool_bytes_) / c_.min_allocation * c_.min_allocation;
    if (c_.memory_limit - pool_bytes_ < 0) {  // Python's floor division of a negative
      available = -((-(c_.memory_limit - pool_bytes_) + c_.min_allocation - 1) /
                    c_.min_allocation) * c_.min_allocation;
    }
    // floor256(limit - pool) >= x exactly when limit >= pool + round256(x).
    limit_window.at_least(pool_bytes_ + round_up(rounded), rounded <= available);
    if (rounded > available) return false;
    bool increased = false;
    while (rounded > curr_region_) {
      double_region();
      increased = true;
    }
    if (curr_region_ <= available) {
      limit_window.at_least(pool_bytes_ + round_up(curr_region_), true);
    } else {  // the region is what the limit leaves: the same for the same 256 bytes
      limit_window.within(pool_bytes_ + available, pool_bytes_ + available + c_.min_allocation - 1);
    }
    int64_t nbytes = std::min(curr_region_, available);
    int64_t base = device_->reserve(nbytes);
    while (base < 0) {
      int64_t backpedal = backpedal_bytes(nbytes);
      if (backpedal >= nbytes) backpedal = nbytes - c_.min_allocation;
      nbytes = backpedal;
      if (nbytes < rounded) return false;
      base = device_->reserve(nbytes);
    }
    if (!increased) double_region();
    add_region(base, nbytes);
    pool_bytes_ += nbytes;
    peak_pool_bytes_ = std::max(peak_pool_bytes_, pool_bytes_);
    return true;
  }

  // curr_region_allocation_bytes *= 2, which Python's ints never overflow: every successful
  // Extend without growth doubles it, so a run that garbage-collects and extends again 62
  // times would wrap an int64 to 0 and spin in the loop above. Held at kRegionCap instead:
  // above every memory limit the bridge passes (< 2**60, sim/kernel/native.py) and so above
  // every `available`, where Extend reads it only as min(curr, available) = available and
  // `rounded > curr` is false, exactly as for the Python's larger value.
  void double_region() {
    curr_region_ = curr_region_ >= kRegionCap / 2 ? kRegionCap : curr_region_ * 2;
  }
  static constexpr int64_t kRegionCap = int64_t{1} << 62;

  bool region_is_free(const Region& r) const {
    return r.live && r.first == r.last && chunks_[r.first].free;
  }

  bool deallocate_free_regions(int64_t rounded) {  // BFC's DeallocateFreeRegions
    if (!c_.garbage_collection) return false;
    int64_t free_bytes = 0;
    for (const Region& r : regions_) if (region_is_free(r)) free_bytes += r.size;
    if (free_bytes == 0) return false;
    bool room = rounded <= c_.memory_limit - pool_bytes_ + free_bytes;
    limit_window.at_least(rounded + pool_bytes_ - free_bytes, room);
    if (!room) return false;
    // In the order the Python dict holds them: insertion order, as regions_ is.
    for (Region& r : regions_) {
      if (!region_is_free(r)) continue;
      index_remove(r.first);
      spare_.push_back(r.first);
      r.live = false;
      pool_bytes_ -= r.size;
      device_->release(r.base);
    }
    return true;
  }

  // -- best-fit (best_fit.py) -------------------------------------------------------
  int64_t tail_free_bytes() const {
    if (!mapped_) return 0;
    const Chunk& last = chunks_[regions_.back().last];
    return last.free ? last.size : 0;
  }

  bool grow(int64_t rounded) {  // map just enough whole pages at the top
    int64_t need = rounded - tail_free_bytes();
    int64_t extra = (need + c_.page - 1) / c_.page * c_.page;
    if (!device_->map(c_.heap_base + mapped_, extra)) return false;
    if (mapped_) {  // ChunkMap.grow_region
      Region& region = regions_.back();
      region.size += extra;
      int32_t last = region.last;
      if (chunks_[last].free) {
        index_remove(last);
        chunks_[last].size += extra;
        index_add(last);
      } else {
        int64_t end = region.base + region.size - extra;
        int32_t at = new_chunk(end, extra);
        Region& grown = regions_.back();
        chunks_[at].region = static_cast<int32_t>(regions_.size() - 1);
        chunks_[at].prev = grown.last;
        chunks_[grown.last].next = at;
        grown.last = at;
        index_add(at);
      }
    } else {
      regions_.clear();
      add_region(c_.heap_base, extra);
    }
    mapped_ += extra;
    peak_mapped_ = std::max(peak_mapped_, mapped_);
    return true;
  }

  void trim() {  // unmap the wholly free pages at the top of the heap
    int64_t free_pages = tail_free_bytes() / c_.page * c_.page;
    if (free_pages == 0) return;
    Region& region = regions_.back();
    int32_t last = region.last;
    if (free_pages == mapped_) {  // the whole heap is free: forget the region
      index_remove(last);
      spare_.push_back(last);
      regions_.clear();
    } else {  // ChunkMap.shrink_region
      region.size -= free_pages;
      index_remove(last);
      if (chunks_[last].size == free_pages) {
        unlink(last);
      } else {
        chunks_[last].size -= free_pages;
        index_add(last);
      }
    }
    mapped_ -= free_pages;
    device_->unmap(c_.heap_base + mapped_, free_pages);
  }

  ChunkConfig c_;
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  std::vector<Chunk> chunks_;
  std::vector<int32_t> spare_;
  std::vector<Region> regions_;
  std::vector<std::vector<Key>> bins_;
  uint32_t nonempty_ = 0;
  int64_t free_count_ = 0;
  int64_t curr_region_;
  int64_t pool_bytes_ = 0, peak_pool_bytes_ = 0;
  int64_t mapped_ = 0, peak_mapped_ = 0;
};

}  // namespace allocsim
