// The core's one binned index: free chunks ordered by (size, tie), the structure of
// policies/chunks.py's FreeIndex over different keys: BFC's, preallocate's and best-fit's free
// chunks (tie = the address; chunk_policy.hpp), the stream-ordered pool's (tie = the address;
// cuda_async.hpp), PyTorch's pools (tie = the address; pytorch.hpp), cupy_pool.py's arenas
// (tie = the chunk's creation id; cupy_pool.hpp) and tpu.py's best-fit index (tie = minus the
// offset; tpu.hpp).
//
// The order of the keys is the rule; the bins are a layout of the core's own (the Python
// modules bin differently, or not at all, for the same order): four size classes per power of
// two, which grow with size, so the order of the keys across the bins is the order of
// (size, tie). Each bin is a vector sorted by key in *descending* order, so its smallest key
// is its last — taking the smallest of the next non-empty bin, the common best fit, moves
// nothing — with a bitmask of the non-empty bins: the smallest key >= (size, minimum) is a
// binary search in bin(size), then the last key of the next non-empty bin (an O(1) jump).
// add/remove O(log k + k) (k: the bin's keys, a memmove of those below the key), lower_bound
// O(log k) plus the jump, largest O(1). The layout is the tuned floor's
// (native/src/tuned_best_fit.cpp); against 21 ascending bins by bit length it took PyTorch,
// CuPy and the stream-ordered pool from 2.6-3.0x that floor's time to 1.9-2.5x on the
// transformer trace (docs/benchmarks.md).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

#include "hot_path.hpp"

namespace allocsim {

class SortedBins {
 public:
  struct Key {
    int64_t size, tie;
    int32_t chunk;
    bool operator<(const Key& o) const { return size < o.size || (size == o.size && tie < o.tie); }
  };

  // The key goes where the descending order puts it. In a small bin (the common case) the
  // keys smaller than it, at the bin's back, move up one place each as they are passed — the
  // moves an insert makes anyway, so no search first; a larger bin is searched and moved in
  // one memmove.
  ALLOCSIM_HOT
  void add(int64_t size, int64_t tie, int32_t chunk) {
    int number = bin(size);
    Bin& keys = bins_[number];
    set(number);  // idempotent: a branch on whether the bin was empty mispredicted often
    if (keys.count == keys.capacity) keys.grow();
    Key key{size, tie, chunk};
    Key* data = keys.slots.get();
    int64_t at = keys.count++;
    if (at > kWalk) {
      int64_t end = at;
      at = first_not_above(data, end, key);
      std::memmove(data + at + 1, data + at, static_cast<size_t>(end - at) * sizeof(Key));
    } else {
      while (at > 0 && data[at - 1] < key) {
        copy(data[at - 1], &data[at]);
        --at;
      }
    }
    Key& slot = data[at];  // field by field (hot_path.hpp)
    slot.size = size;
    slot.tie = tie;
    slot.chunk = chunk;
  }

  // The key (present) out. In a small bin it is found from the back, the smaller keys behind
  // it moving down one place each as they are passed; a larger bin is searched.
  ALLOCSIM_HOT
  void remove(int64_t size, int64_t tie) {
    int number = bin(size);
    Bin& keys = bins_[number];
    Key key{size, tie, 0};
    Key* data = keys.slots.get();
    int64_t last = keys.count - 1;
    if (last > kWalk) {
      int64_t at = first_not_above(data, keys.count, key);
      std::memmove(data + at, data + at + 1, static_cast<size_t>(last - at) * sizeof(Key));
    } else {
      Key moving = data[last];
      for (int64_t at = last; moving < key;) {
        Key above = data[--at];
        copy(moving, &data[at]);
        moving = above;
      }
    }
    keys.count = last;
    clear_if(number, last == 0);
  }

  // Where a key found by find() lies: its bin and its index there, valid until the index
  // changes. erase_at() takes it out without a second search.
  struct Position {
    int number;
    int64_t index;
  };

  // The smallest key with size >= size into *out and where it lies into *at (false: none).
  // O(log k) plus an O(1) jump; nothing moves.
  ALLOCSIM_HOT
  bool find(int64_t size, Key* out, Position* at) const {
    int number = bin(size);
    const Bin& keys = bins_[number];
    const Key* data = keys.slots.get();
    if (keys.count > 0 && data[0].size >= size) {
      // The keys >= (size, minimum) are a prefix; the smallest of them is its last.
      int64_t end = first_not_above(data, keys.count, Key{size, INT64_MIN, 0});
      copy(data[end - 1], out);
      *at = Position{number, end - 1};
      return true;
    }
    int next = next_nonempty(number + 1);
    if (next < 0) return false;
    const Bin& above = bins_[next];
    copy(above.slots[above.count - 1], out);
    *at = Position{next, above.count - 1};
    return true;
  }

  // The key find() found at `at` out of the index (the smallest of a bin, the common case,
  // moves nothing).
  ALLOCSIM_HOT
  void erase_at(Position at) {
    Bin& keys = bins_[at.number];
    int64_t last = --keys.count;
    if (at.index != last) {  // keys behind it move down one place
      Key* data = keys.slots.get();
      int64_t behind = last - at.index;
      if (behind > kWalk) {
        std::memmove(data + at.index, data + at.index + 1,
                     static_cast<size_t>(behind) * sizeof(Key));
      } else {
        for (int64_t index = at.index + 1; index <= last; ++index) {
          copy(data[index], &data[index - 1]);
        }
      }
    }
    clear_if(at.number, last == 0);
  }

  // The smallest key with size >= size into *out (false: none); with pop, it leaves the index.
  ALLOCSIM_HOT
  bool lower_bound(int64_t size, bool pop, Key* out) {
    Position at;
    if (!find(size, out, &at)) return false;
    if (pop) erase_at(at);
    return true;
  }

  // The smallest key above `key` into *out (false: none). O(log k) plus an O(1) jump.
  ALLOCSIM_HOT
  bool after(const Key& key, Key* out) const {
    int number = bin(key.size);
    const Bin& keys = bins_[number];
    int64_t end = first_not_above(keys.slots.get(), keys.count, key);
    if (end > 0) {  // the keys above `key` are a prefix; its last is the smallest
      *out = keys.slots[end - 1];
      return true;
    }
    int next = next_nonempty(number + 1);
    if (next < 0) return false;
    *out = bins_[next].slots[bins_[next].count - 1];
    return true;
  }

  // Every key, in ascending order (for the rare passes over all of them).
  std::vector<Key> ascending() const {
    std::vector<Key> keys;
    keys.reserve(static_cast<size_t>(size()));
    for (const Bin& bin : bins_) {
      for (int64_t index = bin.count - 1; index >= 0; --index) keys.push_back(bin.slots[index]);
    }
    return keys;
  }

  // Every key out; the bins keep their memory.
  void clear() {
    for (Bin& keys : bins_) keys.count = 0;
    for (uint64_t& word : mask_) word = 0;
  }

  int64_t largest() const {
    int top = top_nonempty();
    return top < 0 ? 0 : bins_[top].slots[0].size;
  }
  // How many keys: counted when asked (for stats and the rare passes), not kept per add and
  // remove.
  int64_t size() const {
    int64_t count = 0;
    for (const Bin& keys : bins_) count += keys.count;
    return count;
  }
  // The bitmap's words at once, no branch per word (an empty index was four loads and four
  // branches: the stream-ordered pool's sync=none asks of its mostly empty shared index on
  // every malloc).
  bool empty() const {
    static_assert(kWords == 4, "empty() reads the bitmap's four words");
    return (mask_[0] | mask_[1] | mask_[2] | mask_[3]) == 0;
  }

 private:
  static constexpr int kBins = 256;
  static constexpr int kWords = kBins / 64;
  // A bin of up to this many keys is walked from its back; a larger one binary-searched and
  // moved by memmove.
  static constexpr int64_t kWalk = 8;

  // A bin: its keys, descending, are slots[0, count); the slots past them are spare room, so
  // adding a key writes a slot rather than calling into std::vector. Its slots are one pointer
  // (a std::vector's three made a bin 40 bytes: 3% more instructions per replay); 32-bit
  // counts cost more in widening than the 16-byte stride saved.
  struct Bin {
    std::unique_ptr<Key[]> slots;
    int64_t count = 0;
    int64_t capacity = 0;
    Bin() = default;
    Bin(Bin&&) noexcept = default;
    Bin& operator=(Bin&&) noexcept = default;
    Bin(const Bin& other)  // a policy's copy (a run resumed from a saved state) copies its keys
        : slots(other.capacity ? new Key[other.capacity] : nullptr), count(other.count),
          capacity(other.capacity) {
      std::copy(other.slots.get(), other.slots.get() + other.count, slots.get());
    }
    Bin& operator=(const Bin& other) {
      if (this != &other) *this = Bin(other);
      return *this;
    }
    void grow() {
      int64_t larger = capacity ? 2 * capacity : 4;
      std::unique_ptr<Key[]> moved(new Key[larger]);
      std::copy(slots.get(), slots.get() + count, moved.get());
      slots = std::move(moved);
      capacity = larger;
    }
  };

  // A key copied field by field (hot_path.hpp).
  ALLOCSIM_HOT
  static void copy(const Key& from, Key* to) {
    to->size = from.size;
    to->tie = from.tie;
    to->chunk = from.chunk;
  }

  // Four classes per power of two of size + 4: the bit length and the two bits below the top
  // one (the 4 added spares a branch for the sizes below 4, which have no two bits below).
  // Monotone in size; from 4 (size 0) to at most 247 for sizes below 2**62 - 4.
  ALLOCSIM_HOT
  static int bin(int64_t size) {
    uint64_t value = static_cast<uint64_t>(size) + 4;
    int top = 63 ^ __builtin_clzll(value);  // the top bit's place (bsr; 64 - clz took four more)
    return (top - 1) * 4 + static_cast<int>((value >> (top - 2)) & 3);
  }
  // How many keys of a descending bin are above `key` (where `key` is or would go): a binary
  // search, written out so that it stays in the per-event loop.
  ALLOCSIM_HOT
  static int64_t first_not_above(const Key* data, int64_t count, const Key& key) {
    int64_t low = 0;
    while (count > 0) {
      int64_t half = count / 2;
      if (key < data[low + half]) {
        low += half + 1;
        count -= half + 1;
      } else {
        count = half;
      }
    }
    return low;
  }
  ALLOCSIM_HOT
  void set(int number) { mask_[number >> 6] |= uint64_t{1} << (number & 63); }
  // The bin's bit cleared where it has just emptied, without a branch: whether a remove
  // empties its bin is a coin toss in a replay (CuPy's transformer replay mispredicted 60k
  // of these per 300k events as a branch).
  ALLOCSIM_HOT
  void clear_if(int number, bool emptied) {
    mask_[number >> 6] &= ~(uint64_t{emptied} << (number & 63));
  }
  ALLOCSIM_HOT
  int next_nonempty(int from) const {
    for (int word = from >> 6; word < kWords; ++word) {
      uint64_t bits = mask_[word];
      if (word == from >> 6) bits &= ~uint64_t{0} << (from & 63);
      if (bits) return word * 64 + __builtin_ctzll(bits);
    }
    return -1;
  }
  int top_nonempty() const {
    for (int word = kWords - 1; word >= 0; --word) {
      if (mask_[word]) return word * 64 + 63 - __builtin_clzll(mask_[word]);
    }
    return -1;
  }

  Bin bins_[kBins];
  uint64_t mask_[kWords] = {};
};

// One index per stream (CuPy's arenas, the pool's stream owners), each made on first use and
// kept in that order (the Python dicts' order, which their passes follow), after `first`
// indexes that belong to no stream.
class StreamIndexes {
 public:
  explicit StreamIndexes(int first) : all_(first) {}
  // The stream's index, made now if it has none. The last stream asked is remembered: a
  // trace's events mostly follow one stream, so the common lookup hashes nothing.
  int32_t of(int64_t stream) {
    if (stream == last_stream_ && last_index_ >= 0) return last_index_;
    auto it = by_stream_.find(stream);
    int32_t index;
    if (it != by_stream_.end()) {
      index = it->second;
    } else {
      index = static_cast<int32_t>(all_.size());
      all_.emplace_back();
      by_stream_.emplace(stream, index);
    }
    last_stream_ = stream;
    last_index_ = index;
    return index;
  }
  // The stream's index, or -1 when it has none.
  int32_t find(int64_t stream) const {
    if (stream == last_stream_ && last_index_ >= 0) return last_index_;
    auto it = by_stream_.find(stream);
    return it == by_stream_.end() ? -1 : it->second;
  }
  SortedBins& operator[](int32_t index) { return all_[index]; }
  const SortedBins& operator[](int32_t index) const { return all_[index]; }
  std::vector<SortedBins>& all() { return all_; }
  const std::vector<SortedBins>& all() const { return all_; }
  // The stream whose index this is (a pass over the few streams; not per event).
  int64_t stream_at(int32_t index) const {
    for (const auto& [stream, at] : by_stream_) {
      if (at == index) return stream;
    }
    return -1;
  }
  int32_t count() const { return static_cast<int32_t>(all_.size()); }
  // The largest free chunk and the number of free chunks of all of them.
  int64_t largest() const {
    int64_t largest = 0;
    for (const SortedBins& index : all_) largest = std::max(largest, index.largest());
    return largest;
  }
  int64_t size() const {
    int64_t count = 0;
    for (const SortedBins& index : all_) count += index.size();
    return count;
  }

 private:
  std::vector<SortedBins> all_;
  std::unordered_map<int64_t, int32_t> by_stream_;
  int64_t last_stream_ = 0;
  int32_t last_index_ = -1;  // of last_stream_; -1: none asked yet
};

}  // namespace allocsim
