// BFC, preallocate and best-fit: policies/chunk_policy.py's ChunkPolicy over policies/chunks.py's
// ChunkMap and FreeIndex. The growth rules are declared here and written in the twins of
// their Python modules: bfc.hpp (bfc.py's Extend, doubling and back-off, and
// DeallocateFreeRegions) and best_fit.hpp (best_fit.py's page growth and trim).
//
// The Python modules are the specification; this is their twin, held to them by
// tests/test_native_differential.py (every RunResult field, timeline bucket, stat and the
// address of every malloc). The constants come from Python (ChunkConfig): the alignment and
// split slack, BFC's memory limit, first region size and back-off factor, best-fit's page and
// heap base, as the Python policy built for the same device holds them.
//
// Invariants (chunks.py's): a region's chunks tile it, linked by address; no two neighbouring
// chunks are both free; a chunk is in the free index exactly when it is free. The free index is
// the core's one binned index, SortedBins (sorted_bins.hpp), keyed by (size, address): best fit
// is its lower_bound (the smallest fitting chunk, lowest address on ties). An in-use chunk's
// record never moves, so its index is the handle the engine keeps for the live buffer.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "hot_path.hpp"

#include "device.hpp"
#include "limit_window.hpp"
#include "records.hpp"
#include "sorted_bins.hpp"

namespace allocsim {

struct ChunkConfig {
  enum Growth { kBfc, kBestFit } growth;
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
      : c_(std::move(config)), device_(&device), curr_region_(c_.first_region) {}

  // ChunkPolicy.malloc: the address handed out and its chunk (*handle); -1 on OOM.
  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const ChunkConfig& config) { device_ = &device; c_ = config; }

  ALLOCSIM_HOT
  int64_t malloc(int64_t size, int64_t /*stream*/, int64_t* handle) {
    int64_t rounded = round_up(size, c_.alignment);
    int32_t found = pop_best_fit(rounded);
    if (found < 0 && make_room(rounded)) found = pop_best_fit(rounded);
    if (found < 0) {
      ++num_ooms;
      return -1;
    }
    Chunk& chunk = chunks_[found];
    int64_t chunk_size = chunk.size;
    bool split = chunk_size >= smallest_split(rounded);  // ShouldSplitChunk
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

  // ChunkPolicy.smallest_split: BFC's ShouldSplitChunk (split when chunk >= 2 * rounded or
  // chunk - rounded >= max_internal_fragmentation) as the smallest chunk that a request of
  // rounded bytes splits; 0 slack splits always.
  ALLOCSIM_HOT
  int64_t smallest_split(int64_t rounded) const {
    int64_t twice = 2 * rounded, slack_edge = rounded + c_.max_slack;
    return twice < slack_edge ? twice : slack_edge;
  }

  // ChunkPolicy.free (ChunkMap.give_back_general): merge with the next chunk if free, then
  // the previous one; with best-fit's trim, unmap wholly free pages at the top.
  ALLOCSIM_HOT
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
  int64_t largest_free() const { return free_.largest(); }

  int64_t pool_bytes() const { return c_.growth == ChunkConfig::kBfc ? pool_bytes_ : mapped_; }
  int64_t peak_pool_bytes() const {
    return c_.growth == ChunkConfig::kBfc ? peak_pool_bytes_ : peak_mapped_;
  }
  int64_t free_blocks() const { return free_.size(); }
  int64_t bytes_requested() const { return requested_sum; }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0, requested_sum = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;
  LimitWindow limit_window;  // BFC's decisions against memory_limit (bfc.py's limit_window)

  // decision_rows (sim/questions/run_repeats.py's chunk_rows, its twin): a row of kRowWidth
  // per chunk — address, size, in use (1) or free (0), two zeros — the free ones from the
  // index, those in use from the live buffers' handles. What a stretch with no device call
  // can change of bfc_state (the regions, the pool, the doubling size and the limit change
  // only with one).
  void decision_rows(const std::vector<int64_t>& live, std::vector<int64_t>& rows) const {
    for (const SortedBins::Key& key : free_.ascending()) {
      rows.insert(rows.end(), {chunks_[key.chunk].address, key.size, 0, 0, 0});
    }
    for (int64_t handle : live) {
      const Chunk& chunk = chunks_[static_cast<int32_t>(handle)];
      rows.insert(rows.end(), {chunk.address, chunk.size, 1, 0, 0});
    }
  }
  int64_t address_of(int64_t handle) const { return chunks_[static_cast<int32_t>(handle)].address; }

 private:
  struct Chunk {
    int64_t size, address, requested;
    int32_t prev, next;  // neighbours in the region by address; -1 at its ends
    int32_t region;
    bool free;
  };
  struct Region {
    int64_t base, size;
    int32_t first, last;
    bool live;
  };

  ALLOCSIM_HOT
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
  ALLOCSIM_HOT
  void unlink(int32_t at) {
    Chunk& gone = chunks_[at];
    Region& region = regions_[gone.region];
    if (gone.prev >= 0) chunks_[gone.prev].next = gone.next;
    else region.first = gone.next;
    if (gone.next >= 0) chunks_[gone.next].prev = gone.prev;
    else region.last = gone.prev;
    spare_.push_back(at);
  }

  // FreeIndex.add / remove: the free chunks by (size, address), the tie the address.
  ALLOCSIM_HOT
  void index_add(int32_t at) { free_.add(chunks_[at].size, chunks_[at].address, at); }
  ALLOCSIM_HOT
  void index_remove(int32_t at) { free_.remove(chunks_[at].size, chunks_[at].address); }

  // FreeIndex.pop_best_fit: the smallest free chunk >= rounded (lowest address on ties), out
  // of the index; -1 when none fits.
  ALLOCSIM_HOT
  int32_t pop_best_fit(int64_t rounded) {
    SortedBins::Key found;
    return free_.lower_bound(rounded, true, &found) ? found.chunk : -1;
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
    return extend_region(rounded) ||
           (deallocate_free_regions(rounded) && extend_region(rounded));
  }

  // -- BFC's growth rules: their bodies are in bfc.hpp, the twin of bfc.py ----------------
  int64_t round_bytes(int64_t nbytes) const;
  int64_t backpedal_bytes(int64_t nbytes) const;
  bool extend_region(int64_t rounded);
  void double_region();
  static constexpr int64_t kRegionCap = int64_t{1} << 62;
  bool region_is_free(const Region& r) const;
  bool deallocate_free_regions(int64_t rounded);

  // -- best-fit's growth rules: their bodies are in best_fit.hpp, the twin of best_fit.py ----
  int64_t tail_free_bytes() const;
  bool grow(int64_t rounded);
  void trim();

  ChunkConfig c_;
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  std::vector<Chunk> chunks_;
  std::vector<int32_t> spare_;
  std::vector<Region> regions_;
  SortedBins free_;  // the free chunks (FreeIndex)
  int64_t curr_region_;
  int64_t pool_bytes_ = 0, peak_pool_bytes_ = 0;
  int64_t mapped_ = 0, peak_mapped_ = 0;
};

}  // namespace allocsim

// The growth rules' bodies, each in the twin of its Python module.
#include "best_fit.hpp"
#include "bfc.hpp"
