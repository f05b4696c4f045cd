// Live buffers: trace buffer id -> the policy's handle for the block it holds.
//
// Open addressing with linear probing and backward-shift deletion (no tombstones), grown at
// half full: O(1) expected per insert, lookup and erase, one flat array, no allocation per
// event. An id equal to kEmpty cannot be stored; the Python bridge sends such traces to the
// Python models.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "hot_path.hpp"

namespace allocsim {

class IdMap {
 public:
  static constexpr int64_t kEmpty = std::numeric_limits<int64_t>::min();

  IdMap() { slots_.assign(64, Slot{kEmpty, 0}); mask_ = 63; shift_ = 64 - 6; limit_ = 32; }

  // Insert or replace (an alloc of a live id replaces it, as the Python dict does).
  ALLOCSIM_HOT
  void put(int64_t key, int64_t value) {
    if (size_ >= limit_) grow();
    size_t i = home(key);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) { slots_[i].value = value; return; }
      i = (i + 1) & mask_;
    }
    slots_[i] = Slot{key, value};
    ++size_;
  }

  // Remove key; returns whether it was there (its value into *value).
  ALLOCSIM_HOT
  bool pop(int64_t key, int64_t* value) {
    size_t i = home(key);
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == kEmpty) return false;
      if (s.key == key) break;
      i = (i + 1) & mask_;
    }
    *value = slots_[i].value;
    // Backward shift: pull later entries of the probe run into the hole.
    size_t hole = i;
    size_t j = (i + 1) & mask_;
    while (slots_[j].key != kEmpty) {
      size_t want = home(slots_[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (!stays) { slots_[hole] = slots_[j]; hole = j; }
      j = (j + 1) & mask_;
    }
    slots_[hole].key = kEmpty;
    --size_;
    return true;
  }

  // Look key up without removing it.
  bool find(int64_t key, int64_t* value) const {
    size_t i = home(key);
    while (slots_[i].key != kEmpty) {
      if (slots_[i].key == key) { *value = slots_[i].value; return true; }
      i = (i + 1) & mask_;
    }
    return false;
  }

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  struct Slot { int64_t key; int64_t value; };
  // Fibonacci hashing: the product's top bits (its best mixed), as many as the table has.
  // Its low bits, which x ^ (x >> 29) kept, left a trace's sequential ids in longer probe runs.
  size_t home(int64_t key) const {
    uint64_t x = static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ull;
    return static_cast<size_t>(x >> shift_);
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{kEmpty, 0});
    mask_ = slots_.size() - 1;
    limit_ = slots_.size() / 2;
    --shift_;  // one more bit of the product
    size_ = 0;
    for (const Slot& s : old) if (s.key != kEmpty) put(s.key, s.value);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;  // 64 - log2(slots)
  size_t size_ = 0;
  size_t limit_ = 0;  // half the slots: put() grows the table before it holds more (held, not
                      // computed from the vector per put)
};

}  // namespace allocsim
