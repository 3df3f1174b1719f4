// Scheduler slices for the daemon's threads (EEVDF, Linux 6.12 and later).
//
// Under EEVDF a running thread is protected from preemption by a waking one for up to a slice,
// unless the waking thread asks for a shorter slice than the running one. So the event loop, whose
// work comes in pieces of microseconds, asks for the shortest slice: it gets a core sooner when a
// message wakes it, and while it polls a waiting thread gets the core sooner. Background threads
// (spill, RocksDB's flush and compaction) ask for a long one: any ordinary thread that wakes, a
// client's included, takes the core from them at once. Priorities (niceness) stay as they are.
#pragma once

#include <chrono>

namespace kvtier {

// The kernel's bounds on a requested slice.
inline constexpr std::chrono::microseconds kShortestSlice{100};
inline constexpr std::chrono::milliseconds kBackgroundSlice{20};

// Asks for `slice` for the calling thread, keeping its policy (SCHED_OTHER) and niceness. Older
// kernels accept the request and ignore it; false only if the call itself is refused.
bool requestSlice(std::chrono::nanoseconds slice);

// Niceness of RocksDB's lowered threads (Env::LowerThreadPoolCPUPriority).
inline constexpr int kRocksDbNiceness = 19;

// Lowers the calling thread to RocksDB's background niceness with the long slice and names it
// (15 characters at most). A thread it starts afterwards inherits all three.
void lowerCallingThread(const char* name);

}  // namespace kvtier
