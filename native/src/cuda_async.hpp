// The CUDA stream-ordered pool (cudaMallocAsync) as policies/cuda_async.py models it: chunks
// of round_up(request, chunk) mapped in virtual ranges of their own, best fit by (size,
// address) with immediate coalescing, the release threshold applied at synchronisations
// (after every free with sync=free; on an OOM and never else with sync=none, freed memory then
// staying with its stream), the synchronise-and-retry of an OOM with the wholly free chunks
// remapped, and JAX's preallocation at the first allocation.
//
// The Python module is the specification (it lists what is documented and what is assumed);
// this is its twin, held to it by tests/test_native_differential.py. From Python
// (CudaAsyncConfig): the threshold, the growth chunk, the alignment, the sync mode, whether
// preallocation is pending. Its free indexes are SortedBins by (size, address), FreeIndex's
// order (sorted_bins.hpp).
//
// Invariants (cuda_async.py's): a mapped region's chunks tile it, linked by address (-1 at
// its ends, where the Python ring is); a chunk is free exactly when it is in its owner's
// index (SHARED, or with sync=none a stream's), keyed (size, address) — but for the whole
// free region free() holds out of the index until its trim (unindexed_); free_regions holds
// exactly the regions that are one shared free chunk. A chunk in use never moves: its index
// is the engine's handle.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "device.hpp"
#include "limit_window.hpp"
#include "records.hpp"
#include "sorted_bins.hpp"

namespace allocsim {

struct CudaAsyncConfig {
  int64_t threshold, chunk, alignment;
  bool sync_on_free, preallocate;  // preallocate: CudaAsyncAllocator's pending preallocation
};

// The wholly free regions, each by its one chunk: an unordered bag whose members' places are
// kept by chunk, so a put and an erase are O(1) whatever their number (a threshold that keeps
// memory holds tens of wholly free regions, and a sorted vector moved them on every take and
// every free). Trim, which wants them newest (highest base) first, sorts a copy: with a
// threshold of 0, where it runs at each free, a region is released as soon as it is wholly
// free and the bag holds one or two.
class FreeRegions {
 public:
  using Entry = std::pair<int64_t, int32_t>;  // base, chunk

  // Region `base`, wholly chunk `at`, is free (it was not: a region turns wholly free once
  // until it is taken from or released).
  void put(int64_t base, int32_t at) {
    size_t chunk = static_cast<size_t>(at);
    if (chunk >= place_.size()) place_.resize(chunk + 1, -1);
    place_[chunk] = static_cast<int32_t>(entries_.size());
    entries_.push_back(Entry{base, at});
  }
  // Chunk `at`'s region is no longer wholly free (or never was: a no-op).
  void erase(int32_t at) {
    size_t chunk = static_cast<size_t>(at);
    if (chunk >= place_.size() || place_[chunk] < 0) return;
    int32_t place = place_[chunk];
    Entry last = entries_.back();
    entries_[static_cast<size_t>(place)] = last;
    place_[static_cast<size_t>(last.second)] = place;
    entries_.pop_back();
    place_[chunk] = -1;
  }
  // The members, newest (highest base) first: a copy, so the caller may erase as it goes.
  const std::vector<Entry>& newest_first() {
    sorted_ = entries_;
    std::sort(sorted_.begin(), sorted_.end(),
              [](const Entry& a, const Entry& b) { return a.first > b.first; });
    return sorted_;
  }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  int32_t only() const { return entries_.front().second; }  // the one member's chunk

 private:
  std::vector<Entry> entries_;
  std::vector<int32_t> place_;  // by chunk: its place in entries_, -1 if not a member
  std::vector<Entry> sorted_;   // newest_first's copy, kept for its capacity
};

class CudaAsyncPolicy : public Counters {
 public:
  CudaAsyncPolicy(CudaAsyncConfig config, Device& device)
      : c_(std::move(config)), device_(&device), pending_(c_.preallocate),
        indexes_(1) {}

  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const CudaAsyncConfig& config) { device_ = &device; c_ = config; }

  LimitWindow limit_window;  // the threshold's decisions (cuda_async.py's limit_window)

  // Each sync mode has its own copy of the per-event path, its tests of the mode folded away
  // (with both in one body the engine's loop spilled more registers).
  ALLOCSIM_HOT
  int64_t malloc(int64_t size, int64_t stream, int64_t* handle) {
    return c_.sync_on_free ? malloc_in<true>(size, stream, handle)
                           : malloc_in<false>(size, stream, handle);
  }

  ALLOCSIM_HOT
  void free(int64_t handle) {
    if (c_.sync_on_free) free_in<true>(handle);
    else free_in<false>(handle);
  }

  // place_rows (sim/questions/run_repeats.py's cuda_async_rows, its twin): the decision state
  // named by place, as the pool's decisions read addresses only through their order. A row
  // of kRowWidth per chunk, by place — its region's rank among the regions by address, its
  // offset there, its size, in use (1) or free (0), and with sync=none a free chunk's owner
  // (kSharedStream: shared memory) or a chunk in use's stream — then, after the shared index,
  // a row per stream's index in the order made (-1, its number, its stream, 2, 0), and
  // (-2, 0, 0, 3, 0) while preallocation is to come; `places` gets each live handle's rank
  // and offset. The regions named are those holding a free chunk or a live buffer: a region
  // wholly held by buffers whose ids were taken again while live (a trace's leak) is never
  // freed, so nothing in it is decided on.
  void place_rows(const std::vector<int64_t>& live, std::vector<int64_t>& rows,
                  std::vector<int64_t>& places) const {
    std::vector<int32_t> start(chunks_.size(), -1);  // each chunk's region's first chunk
    std::vector<int32_t> path;
    auto region_of = [&](int32_t at) {
      path.clear();
      while (start[static_cast<size_t>(at)] < 0 && chunks_[at].prev >= 0) {
        path.push_back(at);
        at = chunks_[at].prev;
      }
      int32_t first = start[static_cast<size_t>(at)] >= 0 ? start[static_cast<size_t>(at)] : at;
      start[static_cast<size_t>(at)] = first;
      for (int32_t on : path) start[static_cast<size_t>(on)] = first;
      return first;
    };
    std::vector<std::pair<int64_t, int32_t>> regions;  // (base, first chunk)
    std::vector<char> seen(chunks_.size(), 0);
    auto see = [&](int32_t at) {
      int32_t first = region_of(at);
      if (!seen[static_cast<size_t>(first)]) {
        seen[static_cast<size_t>(first)] = 1;
        regions.emplace_back(chunks_[first].address, first);
      }
    };
    for (int32_t owner = 0; owner < indexes_.count(); ++owner) {
      for (const SortedBins::Key& key : indexes_[owner].ascending()) see(key.chunk);
    }
    for (int64_t handle : live) see(static_cast<int32_t>(handle));
    std::sort(regions.begin(), regions.end());
    std::vector<int64_t> rank(chunks_.size(), -1);  // a first chunk's region's rank
    bool streams = !c_.sync_on_free;
    for (size_t number = 0; number < regions.size(); ++number) {
      auto [base, first] = regions[number];
      rank[static_cast<size_t>(first)] = static_cast<int64_t>(number);
      for (int32_t at = first; at >= 0; at = chunks_[at].next) {
        const Chunk& chunk = chunks_[at];
        int64_t extra = 0;
        if (streams) {
          extra = !chunk.free ? chunk.stream
                  : chunk.owner == kShared ? kSharedStream : indexes_.stream_at(chunk.owner);
        }
        rows.insert(rows.end(), {static_cast<int64_t>(number), chunk.address - base, chunk.size,
                                 chunk.free ? 0 : 1, extra});
      }
    }
    for (int32_t owner = 1; owner < indexes_.count(); ++owner) {
      rows.insert(rows.end(), {-1, owner, indexes_.stream_at(owner), 2, 0});
    }
    if (pending_) rows.insert(rows.end(), {-2, 0, 0, 3, 0});
    for (int64_t handle : live) {
      int32_t first = start[static_cast<size_t>(handle)];
      places.push_back(rank[static_cast<size_t>(first)]);
      places.push_back(chunks_[static_cast<int32_t>(handle)].address - chunks_[first].address);
    }
  }

  int64_t largest_free() const { return indexes_.largest(); }
  int64_t free_blocks() const { return indexes_.size(); }
  int64_t pool_bytes() const { return mapped_; }
  int64_t peak_pool_bytes() const { return peak_mapped_; }

 private:
  template <bool kSyncOnFree>
  ALLOCSIM_HOT
  int64_t malloc_in(int64_t size, int64_t stream, int64_t* handle) {
    if (pending_) preallocate();
    int64_t rounded = round_up(size, c_.alignment);
    SortedBins::Key found;
    int32_t owner;
    int32_t at;
    SortedBins::Position where;
    if (find<kSyncOnFree>(rounded, stream, &found, &owner, &where)) {
      at = take(found, owner, where, rounded);
    } else {
      at = grow(rounded, stream);
      if (at < 0) {
        ++num_ooms;
        return -1;
      }
    }
    chunks_[at].requested = size;  // _hand_to
    chunks_[at].stream = stream;
    handed(rounded, size);
    *handle = at;
    return chunks_[at].address;
  }

  template <bool kSyncOnFree>
  ALLOCSIM_HOT
  void free_in(int64_t handle) {
    int32_t at = static_cast<int32_t>(handle);
    returned(chunks_[at].size, chunks_[at].requested);
    if (kSyncOnFree) {
      // A chunk that becomes a whole region waits out of the index (unindexed_): the
      // synchronisation after the free applies the release threshold, which most often
      // releases it at once, and only what stays is indexed (an add and a remove saved).
      give_back<true>(at, kShared, true);
      if (release_due()) trim(c_.threshold, &limit_window);
      if (unindexed_ >= 0) index_unindexed();
    } else {
      give_back<false>(at, indexes_.of(chunks_[at].stream));
    }
  }

  static constexpr int32_t kShared = 0;  // the index (and owner) of shared free memory
  // Shared memory's owner as cuda_async.py names it (SHARED), in place_rows.
  static constexpr int64_t kSharedStream = -(int64_t{1} << 62);
  // A record is one cache line: its index becomes its offset by a shift (at 48 bytes, a
  // multiply on every access) and no record straddles two lines.
  struct alignas(64) Chunk {
    int64_t size, address, requested, stream;
    int32_t prev, next;  // neighbours in the region by address; -1 at its ends
    int32_t owner;       // while free: the index it sits in
    bool free;
  };

  // _find: best fit by (size, address) among shared free memory and (sync=none) the stream's;
  // where it lies in its owner's index into *where (take() erases it there, no second search).
  template <bool kSyncOnFree>
  ALLOCSIM_HOT
  bool find(int64_t rounded, int64_t stream, SortedBins::Key* found, int32_t* owner,
            SortedBins::Position* where) {
    // With sync=none the shared index is mostly empty: a search would scan its bitmap to the
    // end, where empty() reads it at once.
    bool any = false;
    if (kSyncOnFree || !indexes_[kShared].empty()) {
      any = indexes_[kShared].find(rounded, found, where);
    }
    *owner = kShared;
    if (!kSyncOnFree) {
      int32_t own = indexes_.find(stream);
      SortedBins::Key mine;
      SortedBins::Position mine_at;
      if (own >= 0 && indexes_[own].find(rounded, &mine, &mine_at) &&
          (!any || mine < *found)) {
        *found = mine;
        *owner = own;
        *where = mine_at;
        any = true;
      }
    }
    return any;
  }

  // _take: hand out free chunk `found` of `owner`; the rest stays free with the same owner.
  ALLOCSIM_HOT
  int32_t take(const SortedBins::Key& found, int32_t owner, SortedBins::Position where,
               int64_t rounded) {
    int32_t at = found.chunk;
    indexes_[owner].erase_at(where);
    if (chunks_[at].prev < 0 && chunks_[at].next < 0) free_regions_.erase(at);
    chunks_[at].free = false;
    split_off(at, rounded, owner);
    return at;
  }

  // _split_off: chunk `at` (in use) keeps its low `rounded` bytes; the rest becomes free
  // memory of `owner` (the chunk after it is never free: no merge).
  ALLOCSIM_HOT
  void split_off(int32_t at, int64_t rounded, int32_t owner) {
    int64_t rest_size = chunks_[at].size - rounded;
    if (!rest_size) return;
    int32_t after = chunks_[at].next;
    int32_t rest = new_chunk(chunks_[at].address + rounded, rest_size, at, after);
    if (after >= 0) chunks_[after].prev = rest;
    chunks_[at].next = rest;
    chunks_[at].size = rounded;
    chunks_[rest].free = true;
    chunks_[rest].owner = owner;
    indexes_[owner].add(rest_size, chunks_[rest].address, rest);
  }

  // A chunk in use (the caller frees it).
  ALLOCSIM_HOT
  int32_t new_chunk(int64_t address, int64_t size, int32_t prev, int32_t next) {
    int32_t at = chunks_.make();
    Chunk& chunk = chunks_[at];  // field by field (hot_path.hpp)
    chunk.size = size;
    chunk.address = address;
    chunk.requested = 0;
    chunk.stream = 0;
    chunk.prev = prev;
    chunk.next = next;
    chunk.owner = kShared;
    chunk.free = false;
    return at;
  }

  // Take free chunk `at` out of the index it sits in.
  ALLOCSIM_HOT
  void unindex(int32_t at) { indexes_[chunks_[at].owner].remove(chunks_[at].size, chunks_[at].address); }

  // The whole free region free() left out of the index, which the threshold kept: indexed now.
  void index_unindexed() {
    indexes_[kShared].add(chunks_[unindexed_].size, chunks_[unindexed_].address, unindexed_);
    unindexed_ = -1;
  }

  // Whether free neighbour `n` merges into a chunk given back to `owner`: with per-stream
  // ownership only if it is shared or owner's.
  template <bool kSyncOnFree>
  ALLOCSIM_HOT
  bool joins(int32_t n, int32_t owner) const {
    if (n < 0 || !chunks_[n].free) return false;
    return kSyncOnFree || chunks_[n].owner == owner || chunks_[n].owner == kShared;
  }

  // _give_back: chunk `at` (in no index) becomes free memory of `owner`, merged with the
  // next free neighbour, then the previous one. With `defer_region`, a merged chunk that is a
  // whole region is put in free_regions_ but left out of the index, as unindexed_ (free()'s
  // trim releases it or indexes it).
  template <bool kSyncOnFree>
  ALLOCSIM_HOT
  void give_back(int32_t at, int32_t owner, bool defer_region = false) {
    if (joins<kSyncOnFree>(chunks_[at].next, owner)) {
      unindex(chunks_[at].next);
      absorb_next(chunks_, at);
    }
    int32_t before = chunks_[at].prev;
    if (joins<kSyncOnFree>(before, owner)) {
      unindex(before);
      absorb_next(chunks_, before);
      at = before;
    }
    Chunk& chunk = chunks_[at];
    chunk.free = true;
    chunk.owner = owner;
    if (owner == kShared && chunk.prev < 0 && chunk.next < 0) {
      free_regions_.put(chunk.address, at);
      if (defer_region) {
        unindexed_ = at;
        return;
      }
    }
    indexes_[owner].add(chunk.size, chunk.address, at);
  }

  // _chunk_bytes: the physical chunk a miss of `rounded` bytes maps, round_up(rounded, chunk).
  int64_t chunk_bytes(int64_t rounded) const {
    return (rounded + c_.chunk - 1) / c_.chunk * c_.chunk;
  }

  // _map_chunk: a new physical chunk of round_up(rounded, chunk) bytes in a virtual range of
  // its own, one chunk in use; -1 when the device refused.
  int32_t map_chunk(int64_t rounded) {
    int64_t nbytes = chunk_bytes(rounded);
    int64_t base = device_->address_range(nbytes);
    if (!device_->map(base, nbytes)) return -1;
    mapped_ += nbytes;
    if (mapped_ > peak_mapped_) peak_mapped_ = mapped_;
    return new_chunk(base, nbytes, -1, -1);
  }

  // _grow: a new chunk carved from its low end; after a refusal, _after_refusal: synchronise
  // and search again, then release the wholly free chunks and map once more.
  int32_t grow(int64_t rounded, int64_t stream) {
    int32_t at = map_chunk(rounded);
    if (at < 0) {
      synchronize();
      SortedBins::Key found;
      int32_t owner;
      SortedBins::Position where;
      bool any = c_.sync_on_free ? find<true>(rounded, stream, &found, &owner, &where)
                                 : find<false>(rounded, stream, &found, &owner, &where);
      if (any) return take(found, owner, where, rounded);
      trim(0);
      at = map_chunk(rounded);
      if (at < 0) return -1;
    }
    split_off(at, rounded, kShared);
    return at;
  }

  // synchronize: every stream's free memory becomes shared (indexes in the order made, each
  // in (size, address) order), then the release threshold.
  void synchronize() {
    for (int32_t owner = 1; owner < indexes_.count(); ++owner) {
      if (indexes_[owner].empty()) continue;
      for (const SortedBins::Key& key : indexes_[owner].ascending()) {
        indexes_[owner].remove(key.size, key.tie);
        give_back<false>(key.chunk, kShared);  // stream-owned memory: sync=none
      }
    }
    if (release_due()) trim(c_.threshold, &limit_window);
  }

  // _release_due: a wholly free chunk exists and the pool holds more than the release
  // threshold (a decision against the threshold, noted).
  bool release_due() {
    if (free_regions_.empty()) return false;
    bool kept = c_.threshold >= mapped_;
    limit_window.at_least(mapped_, kept);
    return !kept;
  }

  // _trim (cuMemPoolTrimTo): release wholly free chunks, newest (highest address) first,
  // never below `keep` bytes; `window`, where `keep` is the threshold, notes each comparison.
  void trim(int64_t keep, LimitWindow* window = nullptr) {
    if (mapped_ <= keep) {
      if (window) window->at_least(mapped_, true);
      return;
    }
    if (window) window->at_least(mapped_, false);
    if (free_regions_.size() == 1) {  // a threshold of 0's every trim: no order to find
      trim_region(free_regions_.only(), keep, window);
      return;
    }
    for (const FreeRegions::Entry& member : free_regions_.newest_first()) {
      if (trim_region(member.second, keep, window)) break;
    }
  }

  // _trim_region, one step of _trim's loop: release wholly free chunk `at` unless that takes
  // the pool below `keep`; whether the pool is then down to `keep` (the trim stops).
  bool trim_region(int32_t at, int64_t keep, LimitWindow* window) {
    int64_t nbytes = chunks_[at].size;
    int64_t base = chunks_[at].address;
    bool stays = mapped_ - nbytes < keep;
    if (window) window->at_least(mapped_ - nbytes + 1, stays);
    if (stays) return false;
    free_regions_.erase(at);
    if (at == unindexed_) {
      unindexed_ = -1;  // released before it was indexed
    } else {
      indexes_[kShared].remove(nbytes, base);
    }
    chunks_.recycle(at);
    mapped_ -= nbytes;
    device_->unmap(base, nbytes);
    bool done = mapped_ <= keep;
    if (window) window->at_least(mapped_, done);
    return done;
  }

  // _preallocate (XLA's SetStreamAndPreallocateMemory): the threshold's bytes mapped and
  // freed into the pool at once, where they stay.
  void preallocate() {
    pending_ = false;
    // The chunk is the threshold rounded up to whole chunks: alike for every threshold that
    // rounds to it.
    int64_t whole_chunks = chunk_bytes(c_.threshold);
    limit_window.within(whole_chunks - c_.chunk + 1, whole_chunks);
    int32_t at = map_chunk(c_.threshold);
    if (at < 0) return;
    Chunk& chunk = chunks_[at];
    chunk.free = true;
    chunk.owner = kShared;
    indexes_[kShared].add(chunk.size, chunk.address, at);
    free_regions_.put(chunk.address, at);
  }

  CudaAsyncConfig c_;
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  bool pending_;
  Records<Chunk> chunks_;
  StreamIndexes indexes_;  // kShared, then (sync=none) the streams' in the order made
  // base -> the region's one free chunk, by base: a sorted vector, as few regions are wholly
  // free at once (a release threshold of 0 trims them at each synchronisation); a std::map's
  // node per region was an allocation on most frees.
  FreeRegions free_regions_;
  int32_t unindexed_ = -1;   // within free(): the whole free region not yet indexed; else -1
  int64_t mapped_ = 0, peak_mapped_ = 0;
};

}  // namespace allocsim
