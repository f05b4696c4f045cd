// No caching: every malloc a device malloc, every free a device free (policies/on_demand.py,
// JAX's allocator=platform). The twin of the Python model, held to it by
// tests/test_native_differential.py. A live block's slot (its address and request) is the
// engine's handle.
#pragma once

#include <cstdint>
#include <vector>

#include "device.hpp"

namespace allocsim {

struct OnDemandConfig {};

class OnDemandPolicy {
 public:
  OnDemandPolicy(OnDemandConfig, Device& device) : device_(&device) {}

  // A run resumed from a saved state (sim/questions/shared_runs.py): this copy of
  // the saved policy, on the resumed run's device, with that run's constants (its limit
  // may differ; the bridge resumes only where nothing else does).
  void resume_on(Device& device, const OnDemandConfig&) { device_ = &device; }

  int64_t malloc(int64_t size, int64_t /*stream*/, int64_t* handle) {
    int64_t address = device_->reserve(size);
    if (address < 0) {
      ++num_ooms;
      return -1;
    }
    int64_t at;
    if (!spare_.empty()) {
      at = spare_.back();
      spare_.pop_back();
    } else {
      at = static_cast<int64_t>(slots_.size());
      slots_.push_back(Slot{});
    }
    slots_[at] = Slot{address, size};
    bytes_in_use += size;
    if (bytes_in_use > peak_bytes_in_use) peak_bytes_in_use = bytes_in_use;
    ++num_allocs;
    *handle = at;
    return address;
  }

  void free(int64_t handle) {
    const Slot& slot = slots_[handle];
    bytes_in_use -= slot.size;
    device_->release(slot.address);
    ++num_frees;
    spare_.push_back(handle);
  }

  int64_t largest_free() const { return 0; }
  int64_t free_blocks() const { return 0; }
  int64_t bytes_requested() const { return bytes_in_use; }
  int64_t pool_bytes() const { return bytes_in_use; }
  int64_t peak_pool_bytes() const { return peak_bytes_in_use; }

  int64_t bytes_in_use = 0, peak_bytes_in_use = 0;
  int64_t num_allocs = 0, num_frees = 0, num_ooms = 0;

 private:
  struct Slot { int64_t address, size; };
  Device* device_;  // a pointer: a run resumed from a saved state points it at its own device
  std::vector<Slot> slots_;
  std::vector<int64_t> spare_;
};

}  // namespace allocsim
