// For each event of a trace, the last earlier event with the same buffer id (-1: none):
// sim/questions/capacity/period.py's _previous_same_id, which a repeating trace's period
// check reads for every event. numpy's way, a stable argsort of the ids and a scatter, took
// ~28 ms of a 1M-event trace, about a replay's time of every search of a repeating trace;
// one pass here remembers each id's last event, in a flat array indexed by id where the ids
// span at most a few times the events (every generator's and recorder's), else in the core's
// id table.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "columns.hpp"
#include "id_map.hpp"

namespace allocsim {

inline std::vector<int64_t> previous_same_id(const Column& ids, int64_t n) {
  std::vector<int64_t> previous(static_cast<size_t>(n));
  if (n == 0) return previous;
  std::vector<int64_t> window(static_cast<size_t>(std::min<int64_t>(n, kWindow)));
  int64_t lowest = 0, highest = 0;
  for (int64_t start = 0; start < n; start += kWindow) {  // the span of the ids
    int64_t count = std::min(kWindow, n - start);
    ids.widen(start, count, window.data());
    auto [low, high] = std::minmax_element(window.begin(), window.begin() + count);
    if (start == 0 || *low < lowest) lowest = *low;
    if (start == 0 || *high > highest) highest = *high;
  }
  // The span as unsigned: ids from INT64_MIN to INT64_MAX span 2**64 - 1, beyond any array.
  uint64_t span = static_cast<uint64_t>(highest) - static_cast<uint64_t>(lowest);
  bool flat = span < static_cast<uint64_t>(4 * n + 1024);
  std::vector<int64_t> last(flat ? static_cast<size_t>(span) + 1 : 0, -1);
  IdMap seen;
  for (int64_t start = 0; start < n; start += kWindow) {
    int64_t count = std::min(kWindow, n - start);
    ids.widen(start, count, window.data());
    for (int64_t k = 0; k < count; ++k) {
      int64_t id = window[static_cast<size_t>(k)], event = start + k;
      if (flat) {
        int64_t& slot = last[static_cast<uint64_t>(id) - static_cast<uint64_t>(lowest)];
        previous[static_cast<size_t>(event)] = slot;
        slot = event;
      } else {
        int64_t before;
        previous[static_cast<size_t>(event)] = seen.find(id, &before) ? before : -1;
        seen.put(id, event);
      }
    }
  }
  return previous;
}

}  // namespace allocsim
