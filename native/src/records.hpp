// What the native policies share: records kept by index with their spares recycled (a record
// in use never moves, so its index is the engine's handle for a live buffer), the counters
// every policy keeps for PolicyStats (policies/base.py), and rounding up to a unit.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "hot_path.hpp"

namespace allocsim {

// The width of a policy's decision rows (decision_rows: address, size, kind and two of the
// policy's own), sim/questions/run_repeats.py's ROW_WIDTH.
constexpr int kRowWidth = 5;

// Record has a field `next` (an int32_t link to a neighbour, -1 at an end): a spare record's
// links the spares, so recycling and reusing one touch no other memory (pooled nodes).
template <class Record>
class Records {
 public:
  // A record holding `value`, at a recycled index if there is one. Invalidates references.
  int32_t make(const Record& value) {
    int32_t at = make();
    items_[at] = value;
    return at;
  }
  // A record's index, recycled if there is one, its fields for the caller to set one by one
  // (field by field: hot_path.hpp). Invalidates references.
  ALLOCSIM_HOT
  int32_t make() {
    int32_t at = spare_;
    if (at < 0) {
      items_.emplace_back();
      return static_cast<int32_t>(items_.size() - 1);
    }
    spare_ = items_[at].next;
    return at;
  }
  // A record no one holds any more: it heads the spares (a vector of spare indexes was an
  // out-of-line push_back per recycle, 2% of CuPy's instructions).
  ALLOCSIM_HOT
  void recycle(int32_t at) {
    items_[at].next = spare_;
    spare_ = at;
  }
  Record& operator[](int32_t at) { return items_[at]; }
  const Record& operator[](int32_t at) const { return items_[at]; }
  // Every index ever made (spares included): a bound for arrays by index.
  size_t size() const { return items_.size(); }

 private:
  std::vector<Record> items_;
  int32_t spare_ = -1;  // the first spare record, -1: none
};

// Join the record after `at` (by address, in `at`'s segment) into it; its record recycled.
// Record has size, prev and next (-1 at the ends).
template <class Record>
ALLOCSIM_HOT
void absorb_next(Records<Record>& records, int32_t at) {
  int32_t gone = records[at].next;
  int32_t beyond = records[gone].next;
  records[at].size += records[gone].size;
  records[at].next = beyond;
  if (beyond >= 0) records[beyond].prev = at;
  records.recycle(gone);
}

// size (>= 0) rounded up to a multiple of unit (> 0), as Python's -(-size // unit) * unit: a
// mask when unit is a power of two (the rounding units always are; a division costs tens of
// cycles on every malloc), else the division.
ALLOCSIM_HOT
int64_t round_up(int64_t size, int64_t unit) {
  if ((unit & (unit - 1)) == 0) return (size + unit - 1) & ~(unit - 1);
  return (size + unit - 1) / unit * unit;
}

// A rounding unit fixed when a policy is built (PyTorch's kMinBlockSize, CuPy's allocation
// unit: 512 B) that round_up_by_mask may take: a power of two, else std::invalid_argument.
inline void require_power_of_two(int64_t unit, const char* what) {
  if (unit <= 0 || (unit & (unit - 1)) != 0) throw std::invalid_argument(what);
}

// round_up for a unit require_power_of_two checked once: the mask alone, no test of the unit
// on every malloc.
ALLOCSIM_HOT
int64_t round_up_by_mask(int64_t size, int64_t unit) { return (size + unit - 1) & -unit; }

// PolicyStats' counters that malloc and free keep.
struct Counters {
  int64_t bytes_in_use = 0, peak_bytes_in_use = 0, requested_sum = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;

  int64_t bytes_requested() const { return requested_sum; }
  ALLOCSIM_HOT
  void handed(int64_t nbytes, int64_t requested) {
    bytes_in_use += nbytes;
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    requested_sum += requested;
    ++num_allocs;
  }
  ALLOCSIM_HOT
  void returned(int64_t nbytes, int64_t requested) {
    bytes_in_use -= nbytes;
    requested_sum -= requested;
    ++num_frees;
  }
};

}  // namespace allocsim
