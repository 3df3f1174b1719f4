// Blocking client-side helpers for the daemon's Unix socket, bounded by a deadline: the small side
// connections a client opens besides its Cap'n Proto one (the fast lane's attach, the pool's
// descriptors).
#pragma once

#include <kj/io.h>

#include <chrono>
#include <string>

#include "kvtier/error.h"

namespace kvtier {

// A blocking stream socket connected to `path`. A Unix socket's connect waits without a bound
// while the listener's backlog is full; this one gives up at `deadline` (UNAVAILABLE).
Result<kj::AutoCloseFd> connectUnixSocket(const std::string& path,
                                          std::chrono::steady_clock::time_point deadline);

// Waits until `fd` is readable, at most until `deadline`; false when it is not by then.
bool waitReadable(int fd, std::chrono::steady_clock::time_point deadline);

}  // namespace kvtier
