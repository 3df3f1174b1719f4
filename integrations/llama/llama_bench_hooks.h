// Hooks for kvtier-bench only (not part of the integration's API, not installed).
#pragma once

namespace kvtier::llama::bench_hooks {

// With false, PrefixCache::restore copies blocks into llama.cpp's state without checking them
// against their writer's checksums (as for blocks that have none). For the llama suite's figure
// of what the check costs, in the same run; nothing else may call it. Default true.
void setRestoreChecks(bool enabled);

}  // namespace kvtier::llama::bench_hooks
