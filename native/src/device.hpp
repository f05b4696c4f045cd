// The simulated device as one process sees it: sim/kernel/device.py's SimulatedDevice and
// ProcessDevice, call for call, for a run with one process.
//
// Every figure (capacity in whole granules, granularity, the bump pointer's alignment and gap,
// the cost model's coefficients) comes from the Python device the run was asked on; the
// arithmetic is the Python's in the same order, so the modelled cost sums to the same double.
#pragma once

#include <cstdint>

#include "id_map.hpp"
#include "records.hpp"

namespace allocsim {

struct CostModel {
  double malloc_base_s, malloc_per_gib_s, free_base_s, free_per_gib_s;
  double map_base_s, map_per_gib_s, unmap_base_s;
};

class Device {
 public:
  // capacity: whole granules (SimulatedDevice.capacity); context: the device's own share,
  // taken before any process allocates (SimulatedDevice.context: whole granules, at most the
  // capacity), so `used` starts at it, as the Python device's does; next_address: the bump
  // pointer now.
  Device(int64_t capacity, int64_t context, int64_t granularity, int64_t map_granularity,
         int64_t range_align, int64_t gib, int64_t next_address, CostModel costs)
      : capacity(capacity), granularity(granularity), map_granularity(map_granularity),
        used(context), peak_used(context), range_align_(range_align),
        gib_(static_cast<double>(gib)), next_address_(next_address), costs_(costs) {}

  // cudaMalloc (ProcessDevice.reserve): nbytes rounded up to the granularity at a fresh
  // range; -1 when the device is full.
  int64_t reserve(int64_t nbytes) {
    int64_t taken = round_up(nbytes, granularity);  // a mask where a power of two
    int64_t now_used = used + taken;
    if (now_used > capacity) {
      charge(costs_.malloc_base_s);  // CostModel.refused_malloc
      ++failed_mallocs;
      refused(now_used);
      return -1;
    }
    used = now_used;
    granted(now_used);
    if (used > peak_used) peak_used = used;
    ++mallocs;
    int64_t base = bump(taken);
    charge(costs_.malloc_base_s + costs_.malloc_per_gib_s * static_cast<double>(nbytes) / gib_);
    ranges_.put(base, taken);
    grew(taken);
    return base;
  }

  // cudaFree of a range reserve gave (ProcessDevice.release).
  void release(int64_t base) {
    int64_t taken = 0;
    ranges_.pop(base, &taken);  // a range reserve() gave: always there
    used -= taken;
    reserved -= taken;
    ++frees;
    charge(costs_.free_base_s + costs_.free_per_gib_s * static_cast<double>(taken) / gib_);
  }

  // cuMemAddressReserve: a fresh virtual range, no memory, no call charged.
  int64_t address_range(int64_t nbytes) { return bump(nbytes); }

  // cuMemMap nbytes (whole granules: the caller's rule) at address; false when full.
  bool map(int64_t /*address*/, int64_t nbytes) {
    int64_t now_used = used + nbytes;
    if (now_used > capacity) {
      charge(costs_.map_base_s);  // CostModel.refused_map
      ++failed_mallocs;
      refused(now_used);
      return false;
    }
    used = now_used;
    granted(now_used);
    if (used > peak_used) peak_used = used;
    charge(costs_.map_base_s + costs_.map_per_gib_s * static_cast<double>(nbytes) / gib_);
    ++mallocs;
    grew(nbytes);
    return true;
  }

  // cuMemUnmap [address, address + nbytes).
  void unmap(int64_t /*address*/, int64_t nbytes) {
    used -= nbytes;
    reserved -= nbytes;
    ++frees;
    charge(costs_.unmap_base_s);
  }

  // The device works for the process with no memory taken or given (ProcessDevice.busy: the
  // TPU runtime's compaction): one call costing the policy's own seconds.
  void busy(double seconds) { charge(seconds); }

  // A run resumed from a saved state (sim/questions/shared_runs.py): everything the
  // saved device had counted and handed out, on this device's capacity. The bridge resumes
  // only between devices alike in every other figure.
  void adopt(const Device& saved) {
    used = saved.used;
    peak_used = saved.peak_used;
    reserved = saved.reserved;
    peak_reserved = saved.peak_reserved;
    calls = saved.calls;
    mallocs = saved.mallocs;
    frees = saved.frees;
    failed_mallocs = saved.failed_mallocs;
    cost_s = saved.cost_s;
    granted_most = saved.granted_most;
    refused_least = saved.refused_least;
    next_address_ = saved.next_address_;
    ranges_ = saved.ranges_;
  }

  const int64_t capacity, granularity, map_granularity;
  int64_t used, peak_used;  // bytes taken: the context and this process
  int64_t reserved = 0, peak_reserved = 0;
  int64_t calls = 0, mallocs = 0, frees = 0, failed_mallocs = 0;
  double cost_s = 0.0;
  // min-capacity's record (sim/questions/capacity/oracle.py, _RecordingDevice): the largest
  // `used + bytes` the device granted and the smallest it refused (-1: none), so the oracle
  // knows the capacities at which every call would be answered alike.
  int64_t granted_most = 0, refused_least = -1;

 private:
  void granted(int64_t need) { if (need > granted_most) granted_most = need; }
  void refused(int64_t need) {
    if (refused_least < 0 || need < refused_least) refused_least = need;
  }
  int64_t bump(int64_t nbytes) {  // SimulatedDevice._address_range
    int64_t base = next_address_;
    int64_t span = nbytes > 0 ? nbytes : 1;
    next_address_ = base + round_up(span, range_align_) + range_align_;
    return base;
  }
  void charge(double cost) { ++calls; cost_s += cost; }
  void grew(int64_t nbytes) {
    reserved += nbytes;
    if (reserved > peak_reserved) peak_reserved = reserved;
  }

  const int64_t range_align_;
  const double gib_;
  int64_t next_address_;
  const CostModel costs_;
  // reserve()d base -> bytes taken: the engine's flat table (id_map.hpp), as a policy with no
  // cache (on-demand, jax:allocator=platform) reserves and releases a range per event and a
  // node-based map allocated a node on each (301k of on-demand's 678k mispredicts per 300k
  // events were that allocator's indirect calls). Bases are bump addresses, never
  // IdMap::kEmpty.
  IdMap ranges_;
};

}  // namespace allocsim
