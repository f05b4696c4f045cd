// Live buffers: trace buffer id -> the policy's handle for the block it holds; and the keyed
// records of policies and the device (buddy's free blocks and arenas, the device's ranges).
//
// Open addressing with linear probing and backward-shift deletion (no tombstones), grown at a
// quarter full: O(1) expected per insert, lookup and erase, one flat array, no allocation per
// event. A quarter, not a half: a probe's loop ends where an empty slot or the key is, a branch
// the processor cannot foresee, and at half full the runs were long enough to mispredict it
// often — buddy's table of free blocks, asked mostly for addresses it does not hold, took 1.41x
// the tuned floor's time on the training trace at half full and 1.06x at a quarter (the floor's
// table a quarter full too, which made the floor 4-5% faster), and the other policies gained
// about as much as the floor did (docs/benchmarks.md). The price is twice the table's memory:
// 64 to 128 bytes per live buffer (32 to 64 before), not per event.
//
// An id equal to kEmpty is neither stored nor looked up: the Python bridge sends such traces to
// the Python models (sim/kernel/native.py's _ID_EMPTY), and the other keys (addresses) are
// never negative.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "hot_path.hpp"

namespace allocsim {

class IdMap {
 public:
  static constexpr int64_t kEmpty = std::numeric_limits<int64_t>::min();

  IdMap() { slots_.assign(64, Slot{kFree, 0}); mask_ = 63; shift_ = 64 - 6; limit_ = 64 / kLoad; }

  // Insert or replace (an alloc of a live id replaces it, as the Python dict does).
  ALLOCSIM_HOT
  void put(int64_t key, int64_t value) {
    if (size_ >= limit_) grow();
    insert(held(key), value);
  }

  // Remove key; returns whether it was there (its value into *value). The probe tests the
  // key first, as the floor's table does (tuned_best_fit.cpp): a buffer freed is almost always
  // live and at or near its home slot, so the common probe is one compare that matches.
  ALLOCSIM_HOT
  bool pop(int64_t key, int64_t* value) {
    const uint64_t wanted = held(key);
    Slot* slots = slots_.data();
    size_t i = home(wanted);
    while (slots[i].key != wanted) {
      if (slots[i].key == kFree) return false;
      i = (i + 1) & mask_;
    }
    *value = slots[i].value;
    // Backward shift: pull later entries of the probe run into the hole.
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; slots[j].key != kFree; j = (j + 1) & mask_) {
      size_t want = home(slots[j].key);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      bool stays = hole <= j ? (hole < want && want <= j) : (hole < want || want <= j);
      if (!stays) {
        slots[hole].key = slots[j].key;
        slots[hole].value = slots[j].value;
        hole = j;
      }
    }
    slots[hole].key = kFree;
    --size_;
    return true;
  }

  // Every entry as (key, value), in no particular order: for the rare passes over all of
  // them (sim/questions/run_repeats.py's live buffers), never on the per-event path.
  template <class F>
  void each(F f) const {
    for (const Slot& s : slots_) {
      if (s.key != kFree) f(static_cast<int64_t>(s.key ^ (uint64_t{1} << 63)), s.value);
    }
  }

  // Look key up without removing it.
  bool find(int64_t key, int64_t* value) const {
    const uint64_t wanted = held(key);
    size_t i = home(wanted);
    while (slots_[i].key != kFree) {
      if (slots_[i].key == wanted) { *value = slots_[i].value; return true; }
      i = (i + 1) & mask_;
    }
    return false;
  }

  size_t size() const { return size_; }
  size_t bytes() const { return slots_.capacity() * sizeof(Slot); }

 private:
  // A key is held with its sign bit flipped, so that kEmpty is held as 0 and an empty slot is
  // a test against zero: the 10-byte constant INT64_MIN, compared on every probe, was loaded
  // into a register again on each (the engine's loop has none to spare for it). (Holding the
  // key's product below instead, one-to-one as the multiplier is odd, spares the backward
  // shift its multiplies but measured 0.4% more instructions in all: the product is longer
  // to reach than the key.)
  static constexpr uint64_t kFree = 0;
  static constexpr size_t kLoad = 4;  // the table grows when a put would fill 1/kLoad of it
  static uint64_t held(int64_t key) {
    return static_cast<uint64_t>(key) ^ (uint64_t{1} << 63);
  }
  struct Slot { uint64_t key; int64_t value; };
  // Fibonacci hashing: the product's top bits (its best mixed), as many as the table has.
  // Its low bits, which x ^ (x >> 29) kept, left a trace's sequential ids in longer probe runs.
  // (Of a held key: the flipped sign bit flips the product's top bit, the same table rotated
  // by half.)
  size_t home(uint64_t held_key) const {
    return static_cast<size_t>((held_key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  ALLOCSIM_HOT
  void insert(uint64_t held_key, int64_t value) {
    size_t i = home(held_key);
    while (slots_[i].key != kFree) {
      if (slots_[i].key == held_key) { slots_[i].value = value; return; }
      i = (i + 1) & mask_;
    }
    slots_[i].key = held_key;
    slots_[i].value = value;
    ++size_;
  }
  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.size() * 2, Slot{kFree, 0});
    mask_ = slots_.size() - 1;
    limit_ = slots_.size() / kLoad;
    --shift_;  // one more bit of the product
    size_ = 0;
    for (const Slot& s : old) if (s.key != kFree) insert(s.key, s.value);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;  // 64 - log2(slots)
  size_t size_ = 0;
  size_t limit_ = 0;  // slots / kLoad: put() grows the table before it holds more (held, not
                      // computed from the vector per put)
};

}  // namespace allocsim
