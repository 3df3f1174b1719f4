// Scheduling hints for the daemon's threads.
#pragma once

#include <chrono>

namespace kvtier {

// Asks the kernel (EEVDF, Linux 6.12 and later) for a short time slice for the calling thread, at
// the same priority: a thread with a short slice is preempted sooner by waiting threads and, on
// waking, preempts threads with longer slices. For the event loop, whose work comes in pieces of
// microseconds and which polls when idle. Older kernels accept the request and ignore it; false
// only if the call itself is refused.
bool requestShortSlice(std::chrono::nanoseconds slice);

}  // namespace kvtier
