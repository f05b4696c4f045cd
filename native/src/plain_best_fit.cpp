// The benchmark's floor (benchmarks/native.py): a plain C++ best fit over the same
// events, written the obvious way with the standard library — free blocks in a std::set by
// (size, address) and a std::map by address for coalescing, live buffers in an
// std::unordered_map, an unbounded heap grown at its top. No device, no timeline, no stats:
// what a replay of these events costs at the least, for the native policies' ratios.
#include <cstdint>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "columns.hpp"

namespace allocsim {

int64_t plain_best_fit(const Column& op, const Column& id, const Column& size, int64_t n,
                       int64_t* peak_heap) {
  std::set<std::pair<int64_t, int64_t>> by_size;  // (size, address) of free blocks
  std::map<int64_t, int64_t> by_address;          // address -> size of free blocks
  std::unordered_map<int64_t, std::pair<int64_t, int64_t>> live;  // id -> (address, size)
  int64_t top = 0;
  std::vector<int64_t> ops(kWindow), ids(kWindow), sizes(kWindow);
  for (int64_t base = 0; base < n; base += kWindow) {
    int64_t count = std::min(kWindow, n - base);
    op.widen(base, count, ops.data());
    id.widen(base, count, ids.data());
    size.widen(base, count, sizes.data());
    for (int64_t k = 0; k < count; ++k) {
      if (ops[k] == 0) {
        if (sizes[k] <= 0) continue;
        int64_t want = (sizes[k] + 255) / 256 * 256;
        auto it = by_size.lower_bound({want, INT64_MIN});
        int64_t address;
        if (it == by_size.end()) {
          address = top;
          top += want;
        } else {
          auto [got, at] = *it;
          by_size.erase(it);
          by_address.erase(at);
          address = at;
          if (got > want) {
            by_size.insert({got - want, at + want});
            by_address[at + want] = got - want;
          }
        }
        live[ids[k]] = {address, want};
      } else {
        auto found = live.find(ids[k]);
        if (found == live.end()) continue;
        auto [address, bytes] = found->second;
        live.erase(found);
        auto next = by_address.find(address + bytes);
        if (next != by_address.end()) {
          by_size.erase({next->second, next->first});
          bytes += next->second;
          by_address.erase(next);
        }
        auto after = by_address.lower_bound(address);
        if (after != by_address.begin()) {
          auto before = std::prev(after);
          if (before->first + before->second == address) {
            by_size.erase({before->second, before->first});
            address = before->first;
            bytes += before->second;
            by_address.erase(before);
          }
        }
        by_size.insert({bytes, address});
        by_address[address] = bytes;
      }
      if (top > *peak_heap) *peak_heap = top;
    }
  }
  return 0;
}

}  // namespace allocsim
