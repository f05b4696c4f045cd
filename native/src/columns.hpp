// The trace's columns as Python holds them, read without copying the trace.
//
// A column arrives as a one-dimensional numpy array of any signed integer width (the trace
// packs columns into the narrowest type that holds them, traces/model.py) and any stride (a
// column of one value throughout is a broadcast view of stride 0). The engine widens a window
// of events at a time into a fixed buffer of int64 (kWindow events), so the per-event loop
// reads plain int64s and the memory it takes stays the same whatever the trace's length.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <vector>

namespace allocsim {

// Events widened at a time: 4 columns x 8 bytes x 4096 = 128 KiB, in cache, and a rounding
// error beside even a short trace's columns (1 << 16 held 2 MiB: 2 bytes/event of a
// million-event trace). Results do not depend on it (a window is only where values are read).
constexpr int64_t kWindow = 1 << 12;

struct Column {
  const void* data = nullptr;
  int64_t stride = 0;  // in elements
  int bits = 64;       // 8, 16, 32 or 64 (signed integers)

  // Values [start, start + count) as int64 into out.
  void widen(int64_t start, int64_t count, int64_t* out) const {
    switch (bits) {
      case 8: copy(static_cast<const int8_t*>(data), start, count, out); break;
      case 16: copy(static_cast<const int16_t*>(data), start, count, out); break;
      case 32: copy(static_cast<const int32_t*>(data), start, count, out); break;
      case 64: copy(static_cast<const int64_t*>(data), start, count, out); break;
      default: throw std::invalid_argument("column of an unsupported integer width");
    }
  }

 private:
  template <class T>
  void copy(const T* values, int64_t start, int64_t count, int64_t* out) const {
    const T* p = values + start * stride;
    if (stride == 1) {
      for (int64_t k = 0; k < count; ++k) out[k] = p[k];
    } else if (stride == 0) {  // one value throughout (a broadcast view): a fill
      const int64_t value = p[0];
      for (int64_t k = 0; k < count; ++k) out[k] = value;
    } else {
      for (int64_t k = 0; k < count; ++k) out[k] = p[k * stride];
    }
  }
};

}  // namespace allocsim
