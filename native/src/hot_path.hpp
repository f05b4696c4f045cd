// How the per-event path is written: what the tuned floor (tuned_best_fit.cpp) and `perf` taught.
//
// ALLOCSIM_HOT: the functions called per event (a policy's malloc and free, the binned
// index's add/remove/find, the live table's put/pop) are inlined into the engine's loop, one
// body as the floor's is. Left to itself the compiler's inliner moves them in and out of line
// with unrelated edits (the calls, and the argument structs spilled to the stack for them,
// cost 5-15% of a policy's time), so it is told. The macro stands on the line above the
// definition, which then reads as any other (tests/test_rule_mutations.py finds a rule's
// function by its definition line).
//
// Field by field: records and keys are written where they live, one field at a time, never
// built aside as a whole struct and copied in. Such a copy reads the temporary back in 16-byte
// pieces that the 8-byte stores which built it cannot forward to — a store-forwarding stall
// of ~15 cycles on each split and free (`perf` put the hottest instruction of CuPy's loop and
// of SortedBins::add just after such a read; the floor's own make() has one too).
#pragma once

#if defined(__GNUC__) || defined(__clang__)
#define ALLOCSIM_HOT inline __attribute__((always_inline))
#else
#define ALLOCSIM_HOT inline
#endif
