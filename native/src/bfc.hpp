// BFC (TF/XLA bfc_allocator.cc): the bodies of ChunkPolicy's growth rules that
// policies/bfc.py writes (chunk_policy.hpp declares them; the class and its free index are
// there).
// Extend (doubling the region size, backing off when the device refuses) and
// DeallocateFreeRegions (garbage collection).
//
// The Python module is the specification; this is its twin, rule for rule by name, held to it
// by tests/test_native_differential.py and tests/test_native_rule_edges.py.
#pragma once

#include <algorithm>
#include <cstdint>

#include "chunk_policy.hpp"

namespace allocsim {

inline int64_t ChunkPolicy::backpedal_bytes(int64_t nbytes) const {
  // size_t x float kBackpedalFactor is a float, truncated back to size_t, then rounded up.
  float product = static_cast<float>(nbytes) * c_.backpedal_factor;
  int64_t truncated = static_cast<int64_t>(product);
  return (truncated + c_.min_allocation - 1) / c_.min_allocation * c_.min_allocation;
}

inline int64_t ChunkPolicy::round_bytes(int64_t nbytes) const {  // up to min_allocation
  return (nbytes + c_.min_allocation - 1) / c_.min_allocation * c_.min_allocation;
}

inline bool ChunkPolicy::extend_region(int64_t rounded) {  // BFC's Extend (BFC._extend_region)
  int64_t available = (c_.memory_limit - pool_bytes_) / c_.min_allocation * c_.min_allocation;
  if (c_.memory_limit - pool_bytes_ < 0) {  // Python's floor division of a negative
    available = -((-(c_.memory_limit - pool_bytes_) + c_.min_allocation - 1) /
                  c_.min_allocation) * c_.min_allocation;
  }
  // floor256(limit - pool) >= x exactly when limit >= pool + round256(x).
  limit_window.at_least(pool_bytes_ + round_bytes(rounded), rounded <= available);
  if (rounded > available) return false;
  bool increased = false;
  while (rounded > curr_region_) {
    double_region();
    increased = true;
  }
  if (curr_region_ <= available) {
    limit_window.at_least(pool_bytes_ + round_bytes(curr_region_), true);
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
inline void ChunkPolicy::double_region() {
  curr_region_ = curr_region_ >= kRegionCap / 2 ? kRegionCap : curr_region_ * 2;
}

inline bool ChunkPolicy::region_is_free(const Region& r) const {
  return r.live && r.first == r.last && chunks_[r.first].free;
}

// BFC's DeallocateFreeRegions (BFC._deallocate_free_regions).
inline bool ChunkPolicy::deallocate_free_regions(int64_t rounded) {
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

}  // namespace allocsim
