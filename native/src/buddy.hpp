// The binary buddy system: policies/buddy.py (Knuth's algorithms R and S, arenas taken on
// demand, the refusal path: free arenas, then halves), its twin held to it by
// tests/test_native_differential.py. Constants (min_block, arena, release) come from the
// Python policy.
//
// The Python free lists are one dict per order, LIFO by insertion (popitem takes the block
// freed last); here each order is a doubly linked list in insertion order over one node pool,
// with free blocks found by address in one map (free blocks never share an address), so
// "is my buddy free at this order?" is one lookup and the pop takes the list's tail. Arenas
// are kept in the order they were taken (the Python dict's), for the release pass.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "device.hpp"
#include "id_map.hpp"

namespace allocsim {

struct BuddyConfig {
  int64_t min_block, arena;
  bool release;
};

class BuddyPolicy {
 public:
  static constexpr int kOrders = 64;

  BuddyPolicy(BuddyConfig config, Device& device) : c_(config), device_(&device) {
    min_bits_ = 63 - __builtin_clzll(static_cast<uint64_t>(c_.min_block));
    for (int k = 0; k < kOrders; ++k) head_[k] = tail_[k] = -1;
  }

  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const BuddyConfig& config) { device_ = &device; c_ = config; }

  // order_of: k such that min_block << k is the block for a request of size bytes (the
  // smallest power of two >= size).
  int order_of(int64_t size) const {
    int bits = size - 1 > 0 ? 64 - __builtin_clzll(static_cast<uint64_t>(size - 1)) : 0;
    return std::max(0, bits - min_bits_);
  }

  int64_t malloc(int64_t size, int64_t /*stream*/, int64_t* handle) {
    int order = order_of(size);
    uint64_t above = order < 64 ? nonempty_ >> order : 0;
    int j;
    if (above) {
      j = order + __builtin_ctzll(above);
    } else {
      j = new_arena(order);
      if (j < 0) {
        ++num_ooms;
        return -1;
      }
    }
    int32_t node = tail_[j];  // popitem: the block freed last
    int64_t address = nodes_[node].address, base = nodes_[node].base;
    remove(node);
    while (j > order) {  // split: keep the low half, free the upper one
      --j;
      insert(address + (c_.min_block << j), base, j);
    }
    int64_t at;
    if (!spare_slots_.empty()) {
      at = spare_slots_.back();
      spare_slots_.pop_back();
    } else {
      at = static_cast<int64_t>(slots_.size());
      slots_.push_back(Slot{});
    }
    slots_[at] = Slot{address, base, size, order};
    requested_ += size;
    bytes_in_use += c_.min_block << order;
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    ++num_allocs;
    *handle = at;
    return address;
  }

  void free(int64_t handle) {  // algorithm S
    Slot slot = slots_[handle];
    spare_slots_.push_back(handle);
    requested_ -= slot.size;
    int order = slot.order;
    int64_t address = slot.address, base = slot.base;
    bytes_in_use -= c_.min_block << order;
    ++num_frees;
    int root = arena_root(base);
    while (order < root) {
      int64_t size = c_.min_block << order;
      int64_t buddy = base + ((address - base) ^ size);
      int64_t node;
      if (!free_at_.find(buddy, &node) || nodes_[node].order != order) break;
      remove(static_cast<int32_t>(node));
      if (buddy < address) address = buddy;
      ++order;
    }
    if (order == root && c_.release) {
      drop_arena(base);
      return;
    }
    insert(address, base, order);
  }

  int64_t largest_free() const {
    return nonempty_ ? c_.min_block << (63 - __builtin_clzll(nonempty_)) : 0;
  }
  int64_t free_blocks() const { return free_count_; }
  int64_t bytes_requested() const { return requested_; }
  int64_t pool_bytes() const { return pool_bytes_; }
  int64_t peak_pool_bytes() const { return peak_pool_bytes_; }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;

 private:
  struct Node { int64_t address, base; int32_t prev, next; int order; };
  struct Slot { int64_t address, base, size; int order; };

  void insert(int64_t address, int64_t base, int order) {  // free_lists[order][address] = base
    int32_t at;
    if (!spare_nodes_.empty()) {
      at = spare_nodes_.back();
      spare_nodes_.pop_back();
    } else {
      at = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
    }
    nodes_[at] = Node{address, base, tail_[order], -1, order};
    if (tail_[order] >= 0) nodes_[tail_[order]].next = at;
    else head_[order] = at;
    tail_[order] = at;
    nonempty_ |= uint64_t{1} << order;
    free_at_.put(address, at);
    ++free_count_;
  }

  void remove(int32_t at) {  // del free_lists[order][address]
    Node& node = nodes_[at];
    int order = node.order;
    if (node.prev >= 0) nodes_[node.prev].next = node.next;
    else head_[order] = node.next;
    if (node.next >= 0) nodes_[node.next].prev = node.prev;
    else tail_[order] = node.prev;
    if (head_[order] < 0) nonempty_ &= ~(uint64_t{1} << order);
    int64_t ignored;
    free_at_.pop(node.address, &ignored);
    spare_nodes_.push_back(at);
    --free_count_;
  }

  // An arena's root order, asked by every free: the flat table, not a node-based map.
  int arena_root(int64_t base) const {
    int64_t root = 0;
    arena_roots_.find(base, &root);  // a block's base is always an arena's
    return static_cast<int>(root);
  }

  int new_arena(int order) {
    int64_t block = c_.min_block << order;
    int64_t nbytes = std::max(c_.arena, block);
    int64_t base = device_->reserve(nbytes);
    if (base < 0 && release_free_arenas()) base = device_->reserve(nbytes);
    while (base < 0 && nbytes > block) {
      nbytes >>= 1;
      base = device_->reserve(nbytes);
    }
    if (base < 0) return -1;
    int root = 63 - __builtin_clzll(static_cast<uint64_t>(nbytes)) - min_bits_;
    arena_roots_.put(base, root);
    arena_order_.push_back(base);
    insert(base, base, root);
    pool_bytes_ += nbytes;
    if (pool_bytes_ > peak_pool_bytes_) peak_pool_bytes_ = pool_bytes_;
    return root;
  }

  void drop_arena(int64_t base) {
    int64_t root = 0;
    arena_roots_.pop(base, &root);
    arena_order_.erase(std::find(arena_order_.begin(), arena_order_.end(), base));
    pool_bytes_ -= c_.min_block << root;
    device_->release(base);
  }

  bool release_free_arenas() {  // cudaFree every wholly free arena, in the order taken
    bool released = false;
    std::vector<int64_t> bases(arena_order_);
    for (int64_t base : bases) {
      int root = arena_root(base);
      int64_t node;
      if (free_at_.find(base, &node) && nodes_[node].order == root) {
        remove(static_cast<int32_t>(node));
        drop_arena(base);
        released = true;
      }
    }
    return released;
  }

  BuddyConfig c_;
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  int min_bits_;
  std::vector<Node> nodes_;
  std::vector<int32_t> spare_nodes_;
  int32_t head_[kOrders], tail_[kOrders];
  uint64_t nonempty_ = 0;
  IdMap free_at_;  // free block address -> its node
  int64_t free_count_ = 0;
  std::vector<Slot> slots_;
  std::vector<int64_t> spare_slots_;
  IdMap arena_roots_;  // arena base -> its root order
  std::vector<int64_t> arena_order_;
  int64_t requested_ = 0, pool_bytes_ = 0, peak_pool_bytes_ = 0;
};

}  // namespace allocsim
