// allocsim._native: the bindings of the native core (nanobind).
//
// One class, Replay, made from the trace's columns (numpy arrays as the trace holds them, not
// copied), the device's figures and the policy's constants (dicts the Python bridge,
// sim/kernel/native.py, reads off the Python device and the Python policy built for it), with
// advance(end) -> next index (the GIL released while it runs) and state() -> a dict of what
// the bridge needs to build the RunResult. plain_best_fit is the benchmark's floor.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "buddy.hpp"
#include "chunk_policy.hpp"
#include "columns.hpp"
#include "cuda_async.hpp"
#include "cupy_pool.hpp"
#include "device.hpp"
#include "engine.hpp"
#include "limit_window.hpp"
#include "on_demand.hpp"
#include "previous_same_id.hpp"
#include "pytorch.hpp"
#include "tpu.hpp"

namespace nb = nanobind;
using namespace allocsim;

namespace allocsim {
int64_t plain_best_fit(const Column& op, const Column& id, const Column& size, int64_t n,
                       int64_t* peak_heap);
int64_t tuned_best_fit(const Column& op, const Column& id, const Column& size, int64_t n,
                       int64_t page);
int64_t read_columns(const Column& op, const Column& id, const Column& size, int64_t n);
}

namespace {

using Array = nb::ndarray<nb::ro, nb::ndim<1>, nb::device::cpu>;

Column column_of(const Array& array) {
  auto dtype = array.dtype();
  if (dtype.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int) ||
      (dtype.bits != 8 && dtype.bits != 16 && dtype.bits != 32 && dtype.bits != 64)) {
    throw std::invalid_argument("a trace column must be of a signed integer dtype");
  }
  return Column{array.data(), static_cast<int64_t>(array.stride(0)), dtype.bits};
}

template <class T>
nb::object to_numpy(std::vector<T>&& values) {
  auto* owned = new std::vector<T>(std::move(values));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(owned->data(), {owned->size()}, owner));
}

// A dict of named integers: the shape of every block of Replay::state().
nb::dict dict_of(std::initializer_list<std::pair<const char*, int64_t>> items) {
  nb::dict d;
  for (const auto& [name, value] : items) d[name] = value;
  return d;
}

template <class T>
T get(const nb::dict& d, const char* key) {
  if (!d.contains(key)) throw std::invalid_argument(std::string("missing key ") + key);
  return nb::cast<T>(d[key]);
}

Device make_device(const nb::dict& d) {
  CostModel costs{get<double>(d, "malloc_base_s"), get<double>(d, "malloc_per_gib_s"),
                  get<double>(d, "free_base_s"),   get<double>(d, "free_per_gib_s"),
                  get<double>(d, "map_base_s"),    get<double>(d, "map_per_gib_s"),
                  get<double>(d, "unmap_base_s")};
  int64_t capacity = get<int64_t>(d, "capacity"), context = get<int64_t>(d, "context");
  if (context < 0 || context > capacity) throw std::invalid_argument("context out of range");
  return Device(capacity, context, get<int64_t>(d, "granularity"),
                get<int64_t>(d, "map_granularity"), get<int64_t>(d, "range_align"),
                get<int64_t>(d, "gib"), get<int64_t>(d, "next_address"), costs);
}

ChunkConfig chunk_config(const nb::dict& d) {
  ChunkConfig c;
  std::string growth = get<std::string>(d, "growth");
  if (growth == "bfc") c.growth = ChunkConfig::kBfc;
  else if (growth == "best-fit") c.growth = ChunkConfig::kBestFit;
  else throw std::invalid_argument("unknown chunk growth " + growth);
  c.alignment = get<int64_t>(d, "alignment");
  c.max_slack = get<int64_t>(d, "max_slack");
  if (c.growth == ChunkConfig::kBfc) {
    c.memory_limit = get<int64_t>(d, "memory_limit");
    c.first_region = get<int64_t>(d, "first_region");
    c.min_allocation = get<int64_t>(d, "min_allocation");
    c.garbage_collection = get<bool>(d, "garbage_collection");
    c.backpedal_factor = static_cast<float>(get<double>(d, "backpedal_factor"));
  } else {
    c.page = get<int64_t>(d, "page");
    c.heap_base = get<int64_t>(d, "heap_base");
    c.trim = get<bool>(d, "trim");
  }
  return c;
}

PyTorchConfig pytorch_config(const nb::dict& d) {
  PyTorchConfig c{get<int64_t>(d, "min_block_size"),  get<int64_t>(d, "small_size"),
                  get<int64_t>(d, "small_buffer"),    get<int64_t>(d, "large_buffer"),
                  get<int64_t>(d, "min_large_alloc"), get<int64_t>(d, "round_large"),
                  get<bool>(d, "set_fraction"),       get<int64_t>(d, "allowed_memory_maximum"),
                  get<std::vector<int64_t>>(d, "divisions"),
                  get<int64_t>(d, "max_split_size"),  get<int64_t>(d, "no_limit"),
                  get<int64_t>(d, "max_non_split_rounding"),
                  get<bool>(d, "gc_on"),              get<double>(d, "gc_threshold")};
  c.expandable = get<bool>(d, "expandable");
  if (c.expandable) {
    c.range_small = get<int64_t>(d, "range_small");
    c.range_large = get<int64_t>(d, "range_large");
  }
  return c;
}

// What a policy's state holds beyond PolicyStats: nothing, but for the tpu's ...
template <class Policy>
void add_policy_state(nb::dict& /*state*/, const Policy& /*policy*/) {}

// ... compactions (TpuRuntimeAllocator's num_compactions, compaction_moved_bytes and
// compaction_s) and the heap's blocks in address order (its blocks(), with each live buffer's
// handle, 0 for a hole): what the differential tests compare after every event, and where the
// chip's offsets are read from. O(blocks); never on the per-event path.
void add_policy_state(nb::dict& state, const TpuPolicy& policy) {
  std::vector<int64_t> address, size, used, handle;
  policy.each_block([&](int64_t at, int64_t bytes, bool in_use, int64_t of) {
    address.push_back(at);
    size.push_back(bytes);
    used.push_back(in_use);
    handle.push_back(of);
  });
  nb::dict blocks;
  blocks["address"] = to_numpy(std::move(address));
  blocks["size"] = to_numpy(std::move(size));
  blocks["used"] = to_numpy(std::move(used));
  blocks["handle"] = to_numpy(std::move(handle));
  nb::dict extra = dict_of({{"num_compactions", policy.num_compactions},
                            {"compaction_moved_bytes", policy.compaction_moved_bytes}});
  // ... and the two counts in its policy_stats too, after PolicyStats' fields (the Python's
  // PolicyStats.extra): what a run's result reports.
  nb::dict stats = nb::cast<nb::dict>(state["policy_stats"]);
  stats["num_compactions"] = policy.num_compactions;
  stats["compaction_moved_bytes"] = policy.compaction_moved_bytes;
  extra["compaction_s"] = policy.compaction_s;
  extra["blocks"] = blocks;
  state["policy_state"] = extra;
}

TpuConfig tpu_config(const nb::dict& d) {
  return TpuConfig{get<int64_t>(d, "granule"), get<int64_t>(d, "runtime_bytes"),
                   get<double>(d, "compaction_base_s"), get<double>(d, "compaction_per_gb_s"),
                   get<int64_t>(d, "scratch_bytes")};
}

BuddyConfig buddy_config(const nb::dict& d) {
  return BuddyConfig{get<int64_t>(d, "min_block"), get<int64_t>(d, "arena"),
                     get<bool>(d, "release")};
}

OnDemandConfig on_demand_config(const nb::dict& /*d*/) { return OnDemandConfig{}; }

CuPyConfig cupy_config(const nb::dict& d) {
  return CuPyConfig{get<int64_t>(d, "unit"), get<int64_t>(d, "limit")};
}

CudaAsyncConfig cuda_async_config(const nb::dict& d) {
  return CudaAsyncConfig{get<int64_t>(d, "threshold"), get<int64_t>(d, "chunk"),
                         get<int64_t>(d, "alignment"), get<bool>(d, "sync_on_free"),
                         get<bool>(d, "preallocate")};
}

}  // namespace

// A run's whole state at one event, saved for min-capacity to resume runs at nearby
// capacities from (sim/questions/shared_runs.py): opaque to Python but for where it
// stands.
class Snapshot {
 public:
  virtual ~Snapshot() = default;
  int64_t next_index = 0, ooms = 0;
  // The capacities and limits under which every decision so far goes the same way: the
  // device's [granted_most, refused_least - 1] (refused_least -1: none refused) and the
  // policy's limit window.
  int64_t granted_most = 0, refused_least = -1, limit_lo = kNoLower, limit_hi = kNoUpper;
};

// The limit window of a policy that keeps one (limit_window.hpp): BFC's, PyTorch's, CuPy's,
// the stream-ordered pool's (its release threshold).
template <class Policy>
LimitWindow limit_window_of(const Policy& /*policy*/) { return LimitWindow{}; }
LimitWindow limit_window_of(const ChunkPolicy& policy) { return policy.limit_window; }
LimitWindow limit_window_of(const PyTorchPolicy& policy) { return policy.limit_window; }
LimitWindow limit_window_of(const CuPyPolicy& policy) { return policy.limit_window; }
LimitWindow limit_window_of(const CudaAsyncPolicy& policy) { return policy.limit_window; }

// The policies whose repeat the core checks itself (sim/questions/run_repeats.py): those with
// decision_rows, BFC's family, PyTorch's and CuPy's.
template <class Policy>
constexpr bool kDecisionRows = false;
template <>
constexpr bool kDecisionRows<ChunkPolicy> = true;
template <>
constexpr bool kDecisionRows<PyTorchPolicy> = true;
template <>
constexpr bool kDecisionRows<CuPyPolicy> = true;
// ... and the stream-ordered pool, whose rows name addresses by place (place_rows).
template <class Policy>
constexpr bool kPlaceRows = false;
template <>
constexpr bool kPlaceRows<CudaAsyncPolicy> = true;

// Type-erased over the policy: the bindings see one class.
class Replay {
 public:
  virtual ~Replay() = default;
  virtual int64_t advance(int64_t end) = 0;
  virtual nb::dict state() = 0;
  virtual bool stopped() = 0;
  virtual std::unique_ptr<Snapshot> snapshot() const = 0;
  virtual nb::tuple windows() const = 0;
  virtual void resume(const Snapshot& saved) = 0;
  virtual int64_t tape(int64_t end, bool restart) = 0;
  virtual bool repeat(int64_t length) = 0;
  virtual nb::object decision_state() = 0;
  virtual int64_t next_index() = 0;
  virtual int64_t ooms() = 0;
};

template <class Policy, class Config>
class PolicyReplay final : public Replay {
 public:
  PolicyReplay(nb::tuple columns, const EngineConfig& engine, Device device, Config config)
      : columns_(columns), bucket_(engine.bucket), config_(config), device_(std::move(device)), policy_(std::move(config), device_),
        engine_(engine, column_of(nb::cast<Array>(columns[0])),
                column_of(nb::cast<Array>(columns[1])), column_of(nb::cast<Array>(columns[2])),
                column_of(nb::cast<Array>(columns[3])), device_, policy_) {}

  int64_t advance(int64_t end) override {
    nb::gil_scoped_release release;
    return engine_.advance(end);
  }

  bool stopped() override { return engine_.stopped(); }
  int64_t next_index() override { return engine_.next_index(); }
  int64_t ooms() override { return engine_.ooms; }

  // Engine::tape and Engine::repeat: a run that repeats itself copied to its end.
  int64_t tape(int64_t end, bool restart) override {
    nb::gil_scoped_release release;
    return engine_.tape(end, restart);
  }

  bool repeat(int64_t length) override {
    nb::gil_scoped_release release;
    return engine_.repeat(length);
  }

  // What run_repeats.py compares at two period boundaries: the policy's decision rows (flat,
  // kRowWidth a row), the device's call count, each live buffer's id and address (by place,
  // its region's rank and offset, a pair each, for a policy with place_rows), and the
  // device's used and reserved bytes; None for a policy without decision rows.
  nb::object decision_state() override {
    if constexpr (!kDecisionRows<Policy> && !kPlaceRows<Policy>) {
      return nb::none();
    } else {
      std::vector<int64_t> handles, ids, addresses, rows;
      engine_.each_live([&](int64_t id, int64_t handle) {
        ids.push_back(id);
        handles.push_back(handle);
      });
      if constexpr (kPlaceRows<Policy>) {
        policy_.place_rows(handles, rows, addresses);
      } else {
        for (int64_t handle : handles) addresses.push_back(policy_.address_of(handle));
        policy_.decision_rows(handles, rows);
      }
      return nb::make_tuple(to_numpy(std::move(rows)), device_.calls, to_numpy(std::move(ids)),
                            to_numpy(std::move(addresses)), device_.used, device_.reserved);
    }
  }

  // The windows a snapshot now would hold (granted_most, refused_least, limit_lo, limit_hi),
  // without copying the state: shared_runs.py asks before saving whether any run it may
  // still be asked for could resume from it.
  nb::tuple windows() const override {
    LimitWindow window = limit_window_of(policy_);
    return nb::make_tuple(device_.granted_most, device_.refused_least, window.lo, window.hi);
  }

  std::unique_ptr<Snapshot> snapshot() const override {
    if (engine_.repeated()) {
      throw std::logic_error("a run whose end was copied by repeat() is not a state to save");
    }
    auto saved = std::make_unique<Saved>(device_, policy_, engine_);
    saved->engine.drop_window();
    saved->next_index = engine_.next_index();
    saved->ooms = engine_.ooms;
    saved->granted_most = device_.granted_most;
    saved->refused_least = device_.refused_least;
    LimitWindow window = limit_window_of(policy_);
    saved->limit_lo = window.lo;
    saved->limit_hi = window.hi;
    return saved;
  }

  // This fresh run continues from `saved` (a state of a run of the same family and trace):
  // its device's counters and memory on this capacity, its policy on this device with this
  // run's constants, its engine's counters and live buffers. Whether the two runs would have
  // decided alike up to there is the caller's question (shared_runs.py).
  void resume(const Snapshot& state) override {
    const auto* saved = dynamic_cast<const Saved*>(&state);
    if (saved == nullptr) throw std::invalid_argument("a saved state of another policy family");
    if (engine_.next_index() != 0) throw std::invalid_argument("only a fresh run resumes");
    device_.adopt(saved->device);
    policy_ = saved->policy;
    policy_.resume_on(device_, config_);
    engine_.adopt(saved->engine);
  }

  nb::dict state() override {
    auto& e = engine_;
    nb::dict s = dict_of({{"bucket", bucket_}, {"next_index", e.next_index()},
                          {"allocated", e.allocated}, {"peak_allocated", e.peak_allocated},
                          {"peak_allocated_event", e.peak_allocated_event},
                          {"in_use_at_peak_allocated", e.in_use_at_peak_allocated},
                          {"reserved_at_peak", e.reserved_at_peak},
                          {"peak_reserved_event", e.peak_reserved_event},
                          {"in_use_at_peak_reserved", e.in_use_at_peak_reserved},
                          {"ooms", e.ooms}});
    s["stopped"] = e.stopped();
    const auto& f = e.first_oom;
    s["first_oom"] = f.happened
        ? nb::object(dict_of({{"event", f.event}, {"size", f.size}, {"allocated", f.allocated},
                              {"reserved", f.reserved}, {"largest_free", f.largest_free}}))
        : nb::none();
    for (const auto& [name, values] :
         {std::pair<const char*, const std::vector<int64_t>*>{"skipped_events", &e.skipped_events},
          {"sample_events", &e.sample_events}, {"sample_values", &e.sample_values},
          {"bucket_reserved", &e.bucket_reserved}, {"bucket_allocated", &e.bucket_allocated},
          {"addresses", &e.addresses}}) {
      s[name] = to_numpy(std::vector<int64_t>(*values));
    }
    s["bucket_cost"] = to_numpy(std::vector<double>(e.bucket_cost));
    nb::dict d = dict_of({{"reserved", device_.reserved}, {"peak_reserved", device_.peak_reserved},
                          {"mallocs", device_.mallocs}, {"frees", device_.frees},
                          {"failed_mallocs", device_.failed_mallocs}, {"calls", device_.calls}});
    d["cost_s"] = device_.cost_s;
    d["peak_used"] = device_.peak_used;
    d["granted_most"] = device_.granted_most;
    d["refused_least"] = device_.refused_least;
    s["device"] = d;
    // PolicyStats' fields, in its order.
    s["policy_stats"] = dict_of(
        {{"num_allocs", policy_.num_allocs}, {"num_frees", policy_.num_frees},
         {"num_ooms", policy_.num_ooms}, {"bytes_in_use", policy_.bytes_in_use},
         {"peak_bytes_in_use", policy_.peak_bytes_in_use},
         {"bytes_requested", policy_.bytes_requested()}, {"pool_bytes", policy_.pool_bytes()},
         {"peak_pool_bytes", policy_.peak_pool_bytes()},
         {"largest_free_block", policy_.largest_free()}, {"free_blocks", policy_.free_blocks()}});
    add_policy_state(s, policy_);
    LimitWindow window = limit_window_of(policy_);
    s["limit_window"] = nb::make_tuple(window.lo, window.hi);
    return s;
  }

 private:
  struct Saved final : Snapshot {
    Saved(const Device& d, const Policy& p, const Engine<Policy>& e)
        : device(d), policy(p), engine(e) {}
    Device device;
    Policy policy;
    Engine<Policy> engine;
  };

  nb::tuple columns_;  // keeps the trace's arrays alive while the engine reads them
  int64_t bucket_;
  Config config_;      // this run's constants (a resumed policy takes them)
  Device device_;
  Policy policy_;
  Engine<Policy> engine_;
};

// One family's Replay: its policy class, its config read from the policy's dict by `read`.
template <class Policy, auto read>
std::unique_ptr<Replay> replay_of(nb::tuple columns, const EngineConfig& engine,
                                  const nb::dict& device, const nb::dict& policy) {
  auto config = read(policy);
  return std::make_unique<PolicyReplay<Policy, decltype(config)>>(
      columns, engine, make_device(device), std::move(config));
}

using ReplayFactory = std::unique_ptr<Replay> (*)(nb::tuple, const EngineConfig&,
                                                  const nb::dict&, const nb::dict&);

// The families of the core, by the name a policy's NativeTwin declares (policies/base.py): a
// new native policy is one line here, its header and its config reader above.
constexpr std::pair<const char*, ReplayFactory> kFamilies[] = {
    {"chunk", &replay_of<ChunkPolicy, chunk_config>},
    {"pytorch", &replay_of<PyTorchPolicy, pytorch_config>},
    {"on-demand", &replay_of<OnDemandPolicy, on_demand_config>},
    {"buddy", &replay_of<BuddyPolicy, buddy_config>},
    {"cupy", &replay_of<CuPyPolicy, cupy_config>},
    {"cuda-async", &replay_of<CudaAsyncPolicy, cuda_async_config>},
    {"tpu", &replay_of<TpuPolicy, tpu_config>},
};

static std::unique_ptr<Replay> make_replay(nb::tuple columns, int64_t n, int64_t bucket,
                                           int64_t sample_every, bool stop_on_oom,
                                           bool record_addresses, nb::dict device,
                                           nb::dict policy) {
  if (columns.size() != 4) throw std::invalid_argument("columns: (op, id, size, stream)");
  for (size_t k = 0; k < 4; ++k) {
    Array array = nb::cast<Array>(columns[k]);
    if (static_cast<int64_t>(array.shape(0)) < n) throw std::invalid_argument("column too short");
  }
  EngineConfig engine{n, bucket, sample_every, stop_on_oom, record_addresses};
  std::string family = get<std::string>(policy, "family");
  for (const auto& [name, factory] : kFamilies) {
    if (family == name) return factory(columns, engine, device, policy);
  }
  throw std::invalid_argument("no native policy family " + family);
}

NB_MODULE(_native, m) {
  m.doc() = "allocsim's native core: the engine's loop, the device and the policies in C++";
  nb::list families;
  for (const auto& entry : kFamilies) families.append(entry.first);
  m.attr("FAMILIES") = nb::tuple(families);
  nb::class_<Snapshot>(m, "Snapshot")
      .def_ro("next_index", &Snapshot::next_index)
      .def_ro("ooms", &Snapshot::ooms)
      .def_ro("granted_most", &Snapshot::granted_most)
      .def_ro("refused_least", &Snapshot::refused_least)
      .def_ro("limit_lo", &Snapshot::limit_lo)
      .def_ro("limit_hi", &Snapshot::limit_hi);
  nb::class_<Replay>(m, "Replay")
      .def("advance", &Replay::advance, nb::arg("end"))
      .def("state", &Replay::state)
      .def("stopped", &Replay::stopped)
      .def("snapshot", &Replay::snapshot)
      .def("windows", &Replay::windows)
      .def("resume", &Replay::resume, nb::arg("saved"))
      .def("tape", &Replay::tape, nb::arg("end"), nb::arg("restart") = false)
      .def("repeat", &Replay::repeat, nb::arg("length"))
      .def("decision_state", &Replay::decision_state)
      .def("next_index", &Replay::next_index)
      .def("ooms", &Replay::ooms);
  m.def("replay", &make_replay, nb::arg("columns"), nb::arg("n"), nb::arg("bucket"),
        nb::arg("sample_every"), nb::arg("stop_on_oom"), nb::arg("record_addresses"),
        nb::arg("device"), nb::arg("policy"));
  m.def(
      "plain_best_fit",
      [](nb::tuple columns, int64_t n) {
        Column op = column_of(nb::cast<Array>(columns[0]));
        Column id = column_of(nb::cast<Array>(columns[1]));
        Column size = column_of(nb::cast<Array>(columns[2]));
        int64_t peak = 0, fails;
        {
          nb::gil_scoped_release release;
          fails = plain_best_fit(op, id, size, n, &peak);
        }
        return nb::make_tuple(peak, fails);
      },
      nb::arg("columns"), nb::arg("n"),
      "The benchmark's floor: address-ordered best fit with coalescing over an unbounded "
      "heap, written plainly (std::set and std::map). Returns (peak heap bytes, 0).");
  m.def(
      "tuned_best_fit",
      [](nb::tuple columns, int64_t n, int64_t page) {
        if (page <= 0 || page % 256) throw std::invalid_argument("page must be a positive multiple of 256");
        Column op = column_of(nb::cast<Array>(columns[0]));
        Column id = column_of(nb::cast<Array>(columns[1]));
        Column size = column_of(nb::cast<Array>(columns[2]));
        nb::gil_scoped_release release;
        return tuned_best_fit(op, id, size, n, page);
      },
      nb::arg("columns"), nb::arg("n"), nb::arg("page"),
      "The benchmark's tuned floor: best-fit's rule (policies/best_fit.py) over pooled blocks, "
      "size-class bins and a flat id table. Returns its peak mapped bytes.");
  m.def(
      "read_columns",
      [](nb::tuple columns, int64_t n) {
        Column op = column_of(nb::cast<Array>(columns[0]));
        Column id = column_of(nb::cast<Array>(columns[1]));
        Column size = column_of(nb::cast<Array>(columns[2]));
        nb::gil_scoped_release release;
        return read_columns(op, id, size, n);
      },
      nb::arg("columns"), nb::arg("n"),
      "The benchmark's read limit: the columns widened and summed, nothing else.");
  m.def(
      "previous_same_id",
      [](Array ids) {
        Column column = column_of(ids);
        int64_t n = static_cast<int64_t>(ids.shape(0));
        std::vector<int64_t> previous;
        {
          nb::gil_scoped_release release;
          previous = previous_same_id(column, n);
        }
        return to_numpy(std::move(previous));
      },
      nb::arg("ids"),
      "For each event, the last earlier event with the same id, or -1 (period.py's "
      "_previous_same_id).");
}
