// The limits under which a policy's decisions so far would have gone the same way: the twin
// of policies/limit_window.py, rule for rule by name (at_least, within). A policy that
// compares a limit of its own (BFC's memory_limit) notes each such decision; min-capacity
// resumes a run under another limit from a saved state of this one only while that limit is
// inside [lo, hi] (sim/questions/shared_runs.py). Noting decides nothing.
#pragma once

#include <cstdint>

namespace allocsim {

constexpr int64_t kNoLower = -(int64_t{1} << 62);
constexpr int64_t kNoUpper = int64_t{1} << 62;

struct LimitWindow {
  int64_t lo = kNoLower, hi = kNoUpper;

  // A decision that read `limit >= threshold` and found it `holds` (or not).
  void at_least(int64_t threshold, bool holds) {
    if (holds) {
      if (threshold > lo) lo = threshold;
    } else if (threshold - 1 < hi) {
      hi = threshold - 1;
    }
  }

  // A decision that used the limit's value itself, the same for every limit in [lo, hi].
  void within(int64_t from, int64_t to) {
    if (from > lo) lo = from;
    if (to < hi) hi = to;
  }
};

}  // namespace allocsim
