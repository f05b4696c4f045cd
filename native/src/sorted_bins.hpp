// Free chunks ordered by (size, tie), in bins by size class: policies/chunks.py's FreeIndex
// (tie = the address; cuda_async.hpp), cupy_pool.py's _Arena (tie = the chunk's creation
// id; cupy.hpp) and tpu.py's best-fit index (tie = minus the offset; tpu.hpp), which are the
// same structure over different keys.
//
// The bin of a size is table[bit length] (the Python module's table, passed in: chunks.BIN, or
// the bit length itself for CuPy's arena); bins grow with size, so the order of the keys across
// the bins is the order of (size, tie). Each bin is a vector sorted by key, with a bitmask of
// the non-empty bins: the smallest key >= (size, minimum) is a binary search in bin(size), then
// the first key of the next non-empty bin. add/remove O(log k + k) (k: the bin's keys, a
// memmove), lower_bound O(log k) plus an O(1) jump, largest O(1).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <unordered_map>
#include <vector>

namespace allocsim {

class SortedBins {
 public:
  struct Key {
    int64_t size, tie;
    int32_t chunk;
    bool operator<(const Key& o) const { return size < o.size || (size == o.size && tie < o.tie); }
  };

  explicit SortedBins(const std::vector<int>* table) : table_(table) {
    int bins = table->empty() ? 0 : *std::max_element(table->begin(), table->end()) + 1;
    if (bins > 128 || table->size() < 65) throw std::invalid_argument("bin table out of range");
    bins_.resize(bins);
  }

  void add(int64_t size, int64_t tie, int32_t chunk) {
    int number = bin(size);
    std::vector<Key>& keys = bins_[number];
    Key key{size, tie, chunk};
    if (keys.empty()) set(number);
    if (keys.empty() || keys.back() < key) keys.push_back(key);
    else keys.insert(std::lower_bound(keys.begin(), keys.end(), key), key);
    ++count_;
  }

  void remove(int64_t size, int64_t tie) {
    int number = bin(size);
    std::vector<Key>& keys = bins_[number];
    keys.erase(std::lower_bound(keys.begin(), keys.end(), Key{size, tie, 0}));
    if (keys.empty()) clear(number);
    --count_;
  }

  // The smallest key with size >= size into *out (false: none); with pop, it leaves the index.
  bool lower_bound(int64_t size, bool pop, Key* out) {
    int number = bin(size);
    std::vector<Key>& keys = bins_[number];
    if (!keys.empty()) {
      auto it = std::lower_bound(keys.begin(), keys.end(), Key{size, INT64_MIN, 0});
      if (it != keys.end()) {
        *out = *it;
        if (pop) erase(number, it);
        return true;
      }
    }
    int next = next_nonempty(number + 1);
    if (next < 0) return false;
    std::vector<Key>& above = bins_[next];
    *out = above.front();
    if (pop) erase(next, above.begin());
    return true;
  }

  // The smallest key above `key` into *out (false: none). O(log k) plus an O(1) jump.
  bool after(const Key& key, Key* out) const {
    int number = bin(key.size);
    const std::vector<Key>& keys = bins_[number];
    auto it = std::upper_bound(keys.begin(), keys.end(), key);
    if (it != keys.end()) {
      *out = *it;
      return true;
    }
    int next = next_nonempty(number + 1);
    if (next < 0) return false;
    *out = bins_[next].front();
    return true;
  }

  // Every key out; the bins keep their memory.
  void clear() {
    for (std::vector<Key>& keys : bins_) keys.clear();
    mask_[0] = mask_[1] = 0;
    count_ = 0;
  }

  int64_t largest() const {
    int top = top_nonempty();
    return top < 0 ? 0 : bins_[top].back().size;
  }
  int64_t size() const { return count_; }
  const std::vector<std::vector<Key>>& bins() const { return bins_; }
  // Replace bin `number`'s keys by `kept` (a subsequence of them, as free_all keeps).
  void keep(int number, std::vector<Key>&& kept) {
    count_ -= static_cast<int64_t>(bins_[number].size() - kept.size());
    bins_[number] = std::move(kept);
    if (bins_[number].empty()) clear(number);
  }

 private:
  int bin(int64_t size) const {
    int bits = size > 0 ? 64 - __builtin_clzll(static_cast<uint64_t>(size)) : 0;
    return (*table_)[bits];
  }
  void erase(int number, std::vector<Key>::iterator it) {
    std::vector<Key>& keys = bins_[number];
    keys.erase(it);
    if (keys.empty()) clear(number);
    --count_;
  }
  void set(int number) { mask_[number >> 6] |= uint64_t{1} << (number & 63); }
  void clear(int number) { mask_[number >> 6] &= ~(uint64_t{1} << (number & 63)); }
  int next_nonempty(int from) const {
    for (int word = from >> 6; word < 2; ++word) {
      uint64_t bits = mask_[word];
      if (word == from >> 6) bits &= ~uint64_t{0} << (from & 63);
      if (bits) return word * 64 + __builtin_ctzll(bits);
    }
    return -1;
  }
  int top_nonempty() const {
    if (mask_[1]) return 64 + 63 - __builtin_clzll(mask_[1]);
    if (mask_[0]) return 63 - __builtin_clzll(mask_[0]);
    return -1;
  }

  const std::vector<int>* table_;
  std::vector<std::vector<Key>> bins_;
  uint64_t mask_[2] = {0, 0};
  int64_t count_ = 0;
};

// One index per stream (CuPy's arenas, the pool's stream owners), each made on first use and
// kept in that order (the Python dicts' order, which their passes follow), after `first`
// indexes that belong to no stream.
class StreamIndexes {
 public:
  StreamIndexes(const std::vector<int>* table, int first) : table_(table) {
    for (int k = 0; k < first; ++k) all_.emplace_back(table_);
  }
  // The stream's index, made now if it has none.
  int32_t of(int64_t stream) {
    auto it = by_stream_.find(stream);
    if (it != by_stream_.end()) return it->second;
    int32_t index = static_cast<int32_t>(all_.size());
    all_.emplace_back(table_);
    by_stream_.emplace(stream, index);
    return index;
  }
  // The stream's index, or -1 when it has none.
  int32_t find(int64_t stream) const {
    auto it = by_stream_.find(stream);
    return it == by_stream_.end() ? -1 : it->second;
  }
  SortedBins& operator[](int32_t index) { return all_[index]; }
  std::vector<SortedBins>& all() { return all_; }
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
  const std::vector<int>* table_;
  std::vector<SortedBins> all_;
  std::unordered_map<int64_t, int32_t> by_stream_;
};

}  // namespace allocsim
