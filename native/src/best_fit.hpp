// best-fit: the bodies of ChunkPolicy's growth rules that policies/best_fit.py writes
// (chunk_policy.hpp declares them; the class and its free index are there).
// Mapping just enough whole pages at the top of one address range, and trimming the
// wholly free pages there.
//
// The Python module is the specification; this is its twin, rule for rule by name, held to it
// by tests/test_native_differential.py and tests/test_native_rule_edges.py.
#pragma once

#include <algorithm>
#include <cstdint>

#include "chunk_policy.hpp"

namespace allocsim {

inline int64_t ChunkPolicy::tail_free_bytes() const {
  if (!mapped_) return 0;
  const Chunk& last = chunks_[regions_.back().last];
  return last.free ? last.size : 0;
}

inline bool ChunkPolicy::grow(int64_t rounded) {  // map just enough whole pages at the top
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

inline void ChunkPolicy::trim() {  // unmap the wholly free pages at the top of the heap
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

}  // namespace allocsim
