// The benchmark's tuned floor (benchmarks/native.py): allocsim's best-fit policy
// (policies/best_fit.py: 256-byte rounding, always split, the smallest free block that fits
// and the lowest address on ties, merge with both neighbours at once, a heap mapped in whole
// pages at its top) written for speed alone, with none of the engine's bookkeeping — no
// device, timeline, samples or stats. Its peak heap is best-fit's peak mapped bytes
// (tests/test_bench_floors.py), so a policy's ratio to it is to the same work done as fast as
// we know how. And the read limit: a loop that only reads the trace's columns.
//
// What makes it fast, each the lesson for the native core:
// - blocks are records in one pooled vector with neighbour links by index (no node per block);
// - free blocks sit in 220 size classes (four per power of two of 256-byte units), each a
//   vector sorted by (size, address) in *descending* order, so the best fit is the vector's
//   tail: popping it, the common case, moves nothing; a bitmap of the non-empty classes finds
//   the next class up in O(1);
// - live buffers are in a flat open-addressing table (linear probing, backward-shift
//   deletion), id -> block index, grown at a quarter full;
// - nothing is allocated per event (the vectors keep their capacity).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "columns.hpp"

namespace allocsim {
namespace {

constexpr int64_t kAlign = 256;

struct Block {
  int64_t address, size;
  int32_t prev, next;  // neighbours by address; -1 at the heap's ends
  bool free;
};

// Free blocks by (size, address): a sorted vector per size class, descending, and a bitmap.
class Bins {
 public:
  struct Key {
    int64_t size, address;
    int32_t block;
  };

  void add(const Key& key) {
    int number = bin(key.size);
    std::vector<Key>& keys = bins_[number];
    if (keys.empty()) {
      set(number);
      keys.push_back(key);
      return;
    }
    keys.insert(std::lower_bound(keys.begin(), keys.end(), key, above), key);
  }

  void remove(int64_t size, int64_t address) {
    int number = bin(size);
    std::vector<Key>& keys = bins_[number];
    keys.erase(std::lower_bound(keys.begin(), keys.end(), Key{size, address, 0}, above));
    if (keys.empty()) clear(number);
  }

  // Out of the bins: the smallest block of at least `size` (lowest address on ties); -1: none.
  int32_t pop_best_fit(int64_t size) {
    int number = bin(size);
    std::vector<Key>& keys = bins_[number];
    if (!keys.empty() && keys.front().size >= size) {
      // keys >= (size, -inf) are a prefix; the smallest of them is its last.
      auto end = std::lower_bound(keys.begin(), keys.end(), Key{size, INT64_MIN, 0}, above);
      auto it = end - 1;
      int32_t block = it->block;
      keys.erase(it);
      if (keys.empty()) clear(number);
      return block;
    }
    number = next_nonempty(number + 1);
    if (number < 0) return -1;
    std::vector<Key>& next = bins_[number];
    int32_t block = next.back().block;
    next.pop_back();
    if (next.empty()) clear(number);
    return block;
  }

 private:
  static constexpr int kBins = 256;
  static bool above(const Key& a, const Key& b) {
    return a.size > b.size || (a.size == b.size && a.address > b.address);
  }
  // Four classes per power of two of 256-byte units: monotone in size.
  static int bin(int64_t size) {
    uint64_t units = static_cast<uint64_t>(size) / kAlign;
    if (units < 4) return static_cast<int>(units);
    int bits = 64 - __builtin_clzll(units);
    return (bits - 2) * 4 + static_cast<int>((units >> (bits - 3)) & 3);
  }
  void set(int number) { mask_[number >> 6] |= uint64_t{1} << (number & 63); }
  void clear(int number) { mask_[number >> 6] &= ~(uint64_t{1} << (number & 63)); }
  int next_nonempty(int from) const {
    for (int word = from >> 6; word < kBins / 64; ++word) {
      uint64_t bits = mask_[word];
      if (word == from >> 6) bits &= ~uint64_t{0} << (from & 63);
      if (bits) return word * 64 + __builtin_ctzll(bits);
    }
    return -1;
  }

  std::vector<Key> bins_[kBins];
  uint64_t mask_[kBins / 64] = {};
};

// Live buffers: id -> block, open addressing with linear probing, grown at a quarter full
// (the core's id table's load, id_map.hpp: at half full this floor was 4-5% slower).
class LiveTable {
 public:
  LiveTable() : slots_(1024, Slot{kEmpty, 0}), mask_(1023) {}

  void put(int64_t id, int32_t block) {
    if (4 * (size_ + 1) > slots_.size()) grow();
    size_t i = home(id);
    while (slots_[i].id != kEmpty) {
      if (slots_[i].id == id) {  // an alloc of a live id replaces it, as the engine does
        slots_[i].block = block;
        return;
      }
      i = (i + 1) & mask_;
    }
    slots_[i] = Slot{id, block};
    ++size_;
  }

  // The id's block, out of the table; -1 when it is not live.
  int32_t pop(int64_t id) {
    size_t i = home(id);
    while (slots_[i].id != id) {
      if (slots_[i].id == kEmpty) return -1;
      i = (i + 1) & mask_;
    }
    int32_t block = slots_[i].block;
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots_[j].id != kEmpty; j = (j + 1) & mask_) {
      size_t want = home(slots_[j].id);
      bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (!stays) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole].id = kEmpty;
    --size_;
    return block;
  }

 private:
  static constexpr int64_t kEmpty = INT64_MIN;
  struct Slot {
    int64_t id;
    int32_t block;
  };
  size_t home(int64_t id) const {
    uint64_t x = static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(x >> 32) & mask_;
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2, Slot{kEmpty, 0});
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    size_ = 0;
    for (const Slot& s : old) if (s.id != kEmpty) put(s.id, s.block);
  }
  std::vector<Slot> slots_;
  size_t mask_;
  size_t size_ = 0;
};

class TunedBestFit {
 public:
  explicit TunedBestFit(int64_t page) : page_(page) {}

  int64_t peak_mapped() const { return peak_mapped_; }

  int32_t malloc(int64_t size) {
    int64_t rounded = (size + kAlign - 1) / kAlign * kAlign;
    int32_t at = bins_.pop_best_fit(rounded);
    if (at < 0) {
      grow(rounded);
      at = bins_.pop_best_fit(rounded);
    }
    Block& block = blocks_[at];
    block.free = false;
    if (block.size != rounded) {  // split: the caller keeps the low end
      int32_t rest = make(Block{block.address + rounded, block.size - rounded, at,
                                blocks_[at].next, true});
      Block& kept = blocks_[at];
      kept.size = rounded;
      if (kept.next >= 0) blocks_[kept.next].prev = rest;
      else last_ = rest;
      kept.next = rest;
      bins_.add({blocks_[rest].size, blocks_[rest].address, rest});
    }
    return at;
  }

  void free(int32_t at) {
    Block* block = &blocks_[at];
    int32_t after = block->next;
    if (after >= 0 && blocks_[after].free) {
      bins_.remove(blocks_[after].size, blocks_[after].address);
      block->size += blocks_[after].size;
      unlink(after);
    }
    int32_t before = block->prev;
    if (before >= 0 && blocks_[before].free) {
      bins_.remove(blocks_[before].size, blocks_[before].address);
      blocks_[before].size += block->size;
      unlink(at);
      at = before;
      block = &blocks_[at];
    }
    block->free = true;
    bins_.add({block->size, block->address, at});
  }

 private:
  int32_t make(const Block& value) {
    if (spare_.empty()) {
      blocks_.push_back(value);
      return static_cast<int32_t>(blocks_.size() - 1);
    }
    int32_t at = spare_.back();
    spare_.pop_back();
    blocks_[at] = value;
    return at;
  }

  void unlink(int32_t at) {
    const Block& gone = blocks_[at];
    if (gone.prev >= 0) blocks_[gone.prev].next = gone.next;
    if (gone.next >= 0) blocks_[gone.next].prev = gone.prev;
    else last_ = gone.prev;
    spare_.push_back(at);
  }

  // best_fit.py's _grow: map just enough whole pages at the top for `rounded` bytes.
  void grow(int64_t rounded) {
    bool tail_free = last_ >= 0 && blocks_[last_].free;
    int64_t need = rounded - (tail_free ? blocks_[last_].size : 0);
    int64_t extra = (need + page_ - 1) / page_ * page_;
    if (tail_free) {
      Block& tail = blocks_[last_];
      bins_.remove(tail.size, tail.address);
      tail.size += extra;
      bins_.add({tail.size, tail.address, last_});
    } else {
      int32_t at = make(Block{mapped_, extra, last_, -1, true});
      if (last_ >= 0) blocks_[last_].next = at;
      last_ = at;
      bins_.add({extra, mapped_, at});
    }
    mapped_ += extra;
    if (mapped_ > peak_mapped_) peak_mapped_ = mapped_;
  }

  int64_t page_;
  std::vector<Block> blocks_;
  std::vector<int32_t> spare_;
  Bins bins_;
  int32_t last_ = -1;  // the block at the top of the heap
  int64_t mapped_ = 0, peak_mapped_ = 0;
};

}  // namespace

// Replay the events (op 0 = alloc, sizes as the engine reads them: a free's is its alloc's)
// through the tuned best fit; returns its peak mapped bytes.
int64_t tuned_best_fit(const Column& op, const Column& id, const Column& size, int64_t n,
                       int64_t page) {
  TunedBestFit heap(page);
  LiveTable live;
  std::vector<int64_t> ops(kWindow), ids(kWindow), sizes(kWindow);
  for (int64_t base = 0; base < n; base += kWindow) {
    int64_t count = std::min(kWindow, n - base);
    op.widen(base, count, ops.data());
    id.widen(base, count, ids.data());
    size.widen(base, count, sizes.data());
    for (int64_t k = 0; k < count; ++k) {
      if (ops[k] == 0) {
        if (sizes[k] > 0) live.put(ids[k], heap.malloc(sizes[k]));
      } else {
        int32_t block = live.pop(ids[k]);
        if (block >= 0) heap.free(block);
      }
    }
  }
  return heap.peak_mapped();
}

// The read limit: the same columns widened a window at a time and summed, nothing else.
int64_t read_columns(const Column& op, const Column& id, const Column& size, int64_t n) {
  std::vector<int64_t> ops(kWindow), ids(kWindow), sizes(kWindow);
  int64_t sum = 0;
  for (int64_t base = 0; base < n; base += kWindow) {
    int64_t count = std::min(kWindow, n - base);
    op.widen(base, count, ops.data());
    id.widen(base, count, ids.data());
    size.widen(base, count, sizes.data());
    for (int64_t k = 0; k < count; ++k) sum += ops[k] ^ ids[k] ^ sizes[k];
  }
  return sum;
}

}  // namespace allocsim
