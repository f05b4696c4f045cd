// The engine's per-event loop for one process: sim/kernel/engine.py's ProcessReplay._run and
// what its observer keeps (sim/kernel/run_report.py's RunReport and BucketSummary), over a
// policy of this core.
//
// Per event: at most one policy call, the live-buffer map, the running allocated bytes and
// their peak, one comparison of the device's call counter (a call raises the bucket's most
// reserved bytes and maybe the run's peak); a sample of the policy's bytes in use every
// `sample_every` events; a bucket of the timeline closed every `bucket` events. OOMs are noted
// as RunReport.on_out_of_memory notes them. The events are read a window at a time from
// the trace's columns as held (columns.hpp). Nothing is allocated per event but the live map's
// growth, the policy's records and the typed vectors of samples, buckets and skipped events.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <vector>

#include "columns.hpp"
#include "device.hpp"
#include "hot_path.hpp"
#include "id_map.hpp"

namespace allocsim {

constexpr int64_t kOpAlloc = 0;

struct EngineConfig {
  int64_t n;             // events of the trace
  int64_t bucket;        // events per timeline bucket (ceil(n / TIMELINE_POINTS))
  int64_t sample_every;  // max(1, n // TIMELINE_POINTS)
  bool stop_on_oom;
  bool record_addresses;  // keep every malloc's answer (the differential tests read it)
};

struct FirstOOM {
  bool happened = false;
  int64_t event = 0, size = 0, allocated = 0, reserved = 0, largest_free = 0;
};

template <class Policy>
class Engine {
 public:
  Engine(EngineConfig config, Column op, Column id, Column size, Column stream, Device& device,
         Policy& policy)
      : c_(config), op_(op), id_(id), size_(size), stream_(stream), device_(device),
        policy_(policy) {
    last_event_ = std::min(c_.n, c_.bucket) - 1;
    window_.resize(kColumns * kWindow);
  }

  // Replay events up to `end` (exclusive), or to a stopping OOM. Returns the next index.
  int64_t advance(int64_t end) {
    end = std::min(end, c_.n);
    int64_t i = next_index_;
    while (i < end && !stopped_) {
      if (i < base_ || i >= base_ + loaded_) load(i);
      int64_t stop = std::min(end, base_ + loaded_);
      i = c_.record_addresses ? run<true>(i, stop) : run<false>(i, stop);
    }
    next_index_ = i;
    return i;
  }

  // A run resumed from a saved state (sim/questions/shared_runs.py): the saved
  // engine's counters, live buffers and timeline so far, on this run's columns (the same
  // trace), its window of events read again from the next index.
  void adopt(const Engine& saved) {
    allocated = saved.allocated;
    peak_allocated = saved.peak_allocated;
    peak_allocated_event = saved.peak_allocated_event;
    in_use_at_peak_allocated = saved.in_use_at_peak_allocated;
    reserved_at_peak = saved.reserved_at_peak;
    peak_reserved_event = saved.peak_reserved_event;
    in_use_at_peak_reserved = saved.in_use_at_peak_reserved;
    ooms = saved.ooms;
    first_oom = saved.first_oom;
    skipped_events = saved.skipped_events;
    sample_events = saved.sample_events;
    sample_values = saved.sample_values;
    bucket_reserved = saved.bucket_reserved;
    bucket_allocated = saved.bucket_allocated;
    bucket_cost = saved.bucket_cost;
    addresses = saved.addresses;
    live_ = saved.live_;
    base_ = 0;
    loaded_ = 0;
    held_constants_ = false;
    next_index_ = saved.next_index_;
    stopped_ = saved.stopped_;
    next_sample_ = saved.next_sample_;
    first_event_ = saved.first_event_;
    last_event_ = saved.last_event_;
    top_ = saved.top_;
    first_call_ = saved.first_call_;
    carried_ = saved.carried_;
    bucket_top_allocated_ = saved.bucket_top_allocated_;
  }

  // -- a run that repeats itself (sim/questions/run_repeats.py) ---------------------------
  // A training loop's trace repeats a step, and a run of it may settle into repeating its
  // own: from some event b on, every event does what the event a period earlier did. The
  // caller shows that (the Python twin's run, its decision state equal at b and b + length,
  // no device call between); the core then records one period's outcomes (tape) and copies
  // them to the end (repeat) instead of running the policy: the same figures, samples and
  // buckets as running every event, at the cost of reading what each one did.

  // Replay events up to `end` one at a time, recording what each did: the allocated bytes
  // after it, whether it was an alloc that counts towards the tops (event() raises them on
  // those only), whether it was skipped, the policy's bytes in use after it. Starts a tape
  // here with `restart` (or where none ends here), else extends the one that ends here.
  int64_t tape(int64_t end, bool restart) {
    end = std::min(end, c_.n);
    if (restart || tape_.start < 0
        || tape_.start + static_cast<int64_t>(tape_.allocated.size()) != next_index_) {
      tape_ = Tape{};
      tape_.start = next_index_;
      tape_.calls = device_.calls;
      tape_.ooms = ooms;
      tape_.allocated_before = allocated;
    }
    while (next_index_ < end && !stopped_) {
      int64_t i = next_index_, op = 0, size = 0;
      size_t skipped = skipped_events.size();
      op_.widen(i, 1, &op);
      size_.widen(i, 1, &size);
      advance(i + 1);
      uint8_t flags = (op == kOpAlloc && size > 0) ? kTapeAlloc : 0;
      if (skipped_events.size() != skipped) flags |= kTapeSkipped;
      tape_.allocated.push_back(allocated);
      tape_.flags.push_back(flags);
      tape_.in_use.push_back(policy_.bytes_in_use);
    }
    return next_index_;
  }

  // The rest of the run copied from the tape, which must be one whole period ending here
  // (`length` events from its start to the next index) with no device call and no OOM in it,
  // in a run that keeps no malloc's answers (the copy has none); false where it is not
  // (nothing changes then). Sound only where the run from here repeats
  // the run from the tape's start: the caller's argument. A period that does not leave the
  // allocated bytes as it found them cannot be a repeat, and throws.
  //
  // Event i from here does what event start + (i - start) % length did, so each figure is
  // read off the tape, not run: the allocated bytes after each event, each sample, each
  // skipped event, and each bucket's most allocated bytes — the bucket's first event
  // whatever it is, then the most after an alloc, which over a whole period or more is the
  // period's most. The device makes no call, so the buckets' reserved bytes and costs are
  // close_bucket's as they stand. O(buckets + samples + skipped events + length), not O(n).
  bool repeat(int64_t length) {
    if (length <= 0 || tape_.start < 0 || tape_.start + length != next_index_
        || static_cast<int64_t>(tape_.allocated.size()) != length || device_.calls != tape_.calls
        || ooms != tape_.ooms || stopped_ || c_.record_addresses) {
      return false;
    }
    if (allocated != tape_.allocated_before) {
      throw std::logic_error("repeat: the period does not leave the allocated bytes as it "
                             "found them; the run does not repeat from the tape's start");
    }
    const int64_t start = tape_.start, end = c_.n;
    const std::vector<int64_t>& after = tape_.allocated;
    const std::vector<uint8_t>& flags = tape_.flags;
    auto offset = [&](int64_t i) { return (i - start) % length; };
    constexpr int64_t kNone = std::numeric_limits<int64_t>::min();
    int64_t period_most = kNone;  // the most allocated bytes after an alloc, over a period
    std::vector<int64_t> skipped_at;
    for (int64_t j = 0; j < length; ++j) {
      if (flags[j] & kTapeAlloc) period_most = std::max(period_most, after[j]);
      if (flags[j] & kTapeSkipped) skipped_at.push_back(j);
    }
    auto most_after_alloc = [&](int64_t from, int64_t to) {  // events [from, to]
      if (to - from + 1 >= length) return period_most;
      int64_t most = kNone;
      for (int64_t i = from, j = offset(from); i <= to; ++i) {
        if ((flags[j] & kTapeAlloc) && after[j] > most) most = after[j];
        if (++j == length) j = 0;
      }
      return most;
    };
    if (!skipped_at.empty()) {
      for (int64_t period = next_index_; period < end; period += length) {
        for (int64_t j : skipped_at) {
          if (period + j < end) skipped_events.push_back(period + j);
        }
      }
    }
    int64_t top = bucket_top_allocated_;
    for (int64_t i = next_index_; i < end;) {
      int64_t last = std::min(last_event_, end - 1), from = i;
      if (i == first_event_) {  // a bucket's first event counts whatever it is
        top = after[offset(i)];
        from = i + 1;
      }
      if (from <= last) top = std::max(top, most_after_alloc(from, last));
      for (; next_sample_ <= last; next_sample_ += c_.sample_every) {
        sample_events.push_back(next_sample_);
        sample_values.push_back(tape_.in_use[offset(next_sample_)]);
      }
      bucket_top_allocated_ = top;
      if (last == last_event_) {
        close_bucket();
        top = bucket_top_allocated_;
      }
      i = last + 1;
    }
    if (end > next_index_) allocated = after[offset(end - 1)];
    next_index_ = end;
    repeated_ = true;
    return true;
  }

  // Every live buffer's id and the handle its policy gave it (run_repeats.py's places).
  template <class F>
  void each_live(F f) const { live_.each(f); }

  // Whether the run's end was copied by repeat(): its live buffers are those of the tape's
  // end, not of the run's, so it is not a state to save.
  bool repeated() const { return repeated_; }

  // A saved copy reads no events: its window of them goes (adopt reads them again).
  void drop_window() {
    window_ = {};
    base_ = 0;
    loaded_ = 0;
    held_constants_ = false;
  }

  // -- state read back by the Python bridge ------------------------------------------
  int64_t next_index() const { return next_index_; }
  bool stopped() const { return stopped_; }
  int64_t allocated = 0, peak_allocated = 0, peak_allocated_event = -1;
  int64_t in_use_at_peak_allocated = 0, reserved_at_peak = 0, peak_reserved_event = -1;
  int64_t in_use_at_peak_reserved = 0, ooms = 0;
  FirstOOM first_oom;
  std::vector<int64_t> skipped_events, sample_events, sample_values;
  std::vector<int64_t> bucket_reserved, bucket_allocated;
  std::vector<double> bucket_cost;
  std::vector<int64_t> addresses;

 private:
  // The window holds the four columns one after another, kWindow events each: the loop reads
  // them through one pointer at fixed offsets (four pointers were four stack slots, reloaded
  // around every policy call). A column of one value throughout (stride 0: a trace's single
  // stream) is written into the window once, not again with every window.
  static constexpr int64_t kColumns = 4;
  static constexpr int64_t kOp = 0, kId = kWindow, kSize = 2 * kWindow, kStream = 3 * kWindow;

  void load(int64_t start) {
    int64_t count = std::min(kWindow, c_.n - start);
    const Column* columns[kColumns] = {&op_, &id_, &size_, &stream_};
    for (int64_t k = 0; k < kColumns; ++k) {
      const Column& column = *columns[k];
      int64_t* out = window_.data() + k * kWindow;
      if (column.stride != 0) column.widen(start, count, out);
      else if (!held_constants_) column.widen(start, kWindow, out);  // every slot: any window
    }
    held_constants_ = true;
    base_ = start;
    loaded_ = count;
  }

  // What the per-event body updates, held in locals for a call of run() (written back at its
  // stretches' ends): as members they were loaded and stored again around every policy call,
  // which may write any int64_t.
  struct Running {
    const int64_t* events;  // the window, less base_: column k of event i at [k * kWindow + i]
    int64_t calls, allocated, peak_allocated, bucket_top_allocated;
    // The lower of the two tops: an alloc that leaves the allocated bytes at or under it
    // raises neither, one compare per alloc rather than two. (The bucket's most is mostly the
    // lower, but not always: its first event counts whatever it is, and a free of a negative
    // size, taken as the trace gives it, raises the allocated bytes.)
    int64_t raise_above;
  };

  // Events [i, stop), in stretches that end where a sample is taken or a bucket closes
  // (after that event), so the per-event body checks neither.
  // kRecord: whether every malloc's answer is kept (EngineConfig::record_addresses), a
  // constant of each instance rather than a branch per alloc.
  template <bool kRecord>
  int64_t run(int64_t i, int64_t stop) {
    Running r{window_.data() - base_, device_.calls, allocated, peak_allocated,
              bucket_top_allocated_, std::min(peak_allocated, bucket_top_allocated_)};
    bool going = true;
    while (going && i < stop) {
      int64_t until = std::min(stop, std::min(next_sample_, last_event_) + 1);
      if (i == first_event_) {
        // A bucket's most allocated bytes count its first event whatever it is; after it only
        // an alloc can raise them (event() does).
        going = event<kRecord>(i, r);
        if (r.allocated > r.bucket_top_allocated) r.bucket_top_allocated = r.allocated;
        r.raise_above = std::min(r.peak_allocated, r.bucket_top_allocated);
        ++i;
        if (!going) until = i;  // a stopping OOM ends the stretch there
      }
      if (i < until) {
        do {
          if (!event<kRecord>(i, r)) {
            ++i;
            going = false;
            break;
          }
        } while (++i != until);
      }
      allocated = r.allocated;
      peak_allocated = r.peak_allocated;
      bucket_top_allocated_ = r.bucket_top_allocated;
      int64_t done = i - 1;
      if (done == next_sample_) {
        sample_events.push_back(done);
        sample_values.push_back(policy_.bytes_in_use);
        next_sample_ += c_.sample_every;
      }
      if (done == last_event_) {
        close_bucket();
        r.bucket_top_allocated = bucket_top_allocated_;
        r.raise_above = std::min(r.peak_allocated, r.bucket_top_allocated);
      }
    }
    return i;
  }

  // One event: at most one policy call, the live-buffer map, the allocated bytes, their peak
  // and the bucket's most, the device's call counter. False when an OOM stops the run.
  template <bool kRecord>
  ALLOCSIM_HOT
  bool event(int64_t i, Running& r) {
    int64_t size = r.events[kSize + i];
    if (r.events[kOp + i] == kOpAlloc) {
      if (size > 0) {
        int64_t handle = 0;
        int64_t address = policy_.malloc(size, r.events[kStream + i], &handle);
        if (kRecord) addresses.push_back(address);
        if (address < 0) return out_of_memory(i, size, r);
        live_.put(r.events[kId + i], handle);
        r.allocated += size;
        if (r.allocated > r.raise_above) raise_allocated_tops(i, r);
      }
    } else {
      int64_t handle;
      if (live_.pop(r.events[kId + i], &handle)) {
        policy_.free(handle);
        r.allocated -= size;
      } else if (size) {
        skipped_events.push_back(i);
      }
    }
    note_device_calls(i, r);
    return true;
  }

  // An alloc that took the allocated bytes above the run's peak or the bucket's most, or both.
  ALLOCSIM_HOT
  void raise_allocated_tops(int64_t i, Running& r) {
    if (r.allocated > r.peak_allocated) {
      r.peak_allocated = r.allocated;
      peak_allocated_event = i;
      in_use_at_peak_allocated = policy_.bytes_in_use;
    }
    if (r.allocated > r.bucket_top_allocated) r.bucket_top_allocated = r.allocated;
    r.raise_above = std::min(r.peak_allocated, r.bucket_top_allocated);
  }

  // A malloc refused: the OOM noted, then the device's calls it made, as after any event.
  // Its own return, so that the common path holds no flag of whether to go on (one kept
  // through every event cost three instructions each).
  bool out_of_memory(int64_t i, int64_t size, Running& r) {
    allocated = r.allocated;  // the first OOM's record reads it
    note_out_of_memory(i, size);
    note_device_calls(i, r);
    return !stopped_;
  }

  // A device call since the last event raises the bucket's most reserved bytes and maybe the
  // run's peak.
  ALLOCSIM_HOT
  void note_device_calls(int64_t i, Running& r) {
    if (device_.calls != r.calls) {
      r.calls = device_.calls;
      int64_t reserved = device_.reserved;
      if (reserved > top_) {  // the bucket's most (-1: none yet)
        if (top_ < 0) first_call_ = i;
        top_ = reserved;
        if (reserved > reserved_at_peak) {
          reserved_at_peak = reserved;
          peak_reserved_event = i;
          in_use_at_peak_reserved = policy_.bytes_in_use;
        }
      }
    }
  }

  void note_out_of_memory(int64_t i, int64_t size) {
    ++ooms;
    skipped_events.push_back(i);
    if (!first_oom.happened) {
      first_oom = FirstOOM{true, i, size, allocated, device_.reserved, policy_.largest_free()};
    }
    if (c_.stop_on_oom) stopped_ = true;
  }

  void close_bucket() {  // BucketSummary.close
    int64_t most;
    if (top_ < 0) most = carried_;
    else if (first_call_ == first_event_) most = top_;
    else most = std::max(top_, carried_);
    bucket_reserved.push_back(most);
    bucket_cost.push_back(device_.cost_s);
    bucket_allocated.push_back(bucket_top_allocated_);
    bucket_top_allocated_ = std::numeric_limits<int64_t>::min();
    carried_ = device_.reserved;
    top_ = -1;
    first_event_ += c_.bucket;
    last_event_ = std::min(c_.n, first_event_ + c_.bucket) - 1;
  }

  static constexpr uint8_t kTapeAlloc = 1, kTapeSkipped = 2;
  struct Tape {  // what each event of [start, start + allocated.size()) did (tape())
    // Where it starts, and the device's calls, the OOMs and the allocated bytes then.
    int64_t start = -1, calls = 0, ooms = 0, allocated_before = 0;
    std::vector<int64_t> allocated, in_use;  // after each event
    std::vector<uint8_t> flags;
  };

  const EngineConfig c_;
  Column op_, id_, size_, stream_;
  Device& device_;
  Policy& policy_;
  IdMap live_;
  std::vector<int64_t> window_;  // kColumns x kWindow
  int64_t base_ = 0, loaded_ = 0, next_index_ = 0;
  bool held_constants_ = false;  // the window holds the constant columns' values
  bool stopped_ = false;
  bool repeated_ = false;
  Tape tape_;
  int64_t next_sample_ = 0;
  int64_t first_event_ = 0, last_event_ = -1, top_ = -1, first_call_ = -1, carried_ = 0;
  int64_t bucket_top_allocated_ = std::numeric_limits<int64_t>::min();
};

}  // namespace allocsim
