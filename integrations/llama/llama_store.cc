// kvtier::llama::PrefixCache: store and prefill (llama_cache.cc has open and restore).
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "integrations/llama/llama_cache_impl.h"
#include "kernels/block_copy.h"

namespace kvtier::llama {

Result<StoreInfo> PrefixCache::store(llama_seq_id seq, const llama_token* tokens, size_t nTokens) {
  Impl& m = *impl_;
  if (auto s = m.checkCall(seq, tokens, nTokens); !s.ok()) return s.error();
  auto r = m.storeImpl(seq, tokens, nTokens, m.memory.recurrent());
  if (r.ok()) {
    ++m.stats.stores;
    m.stats.storedTokens += r->storedTokens;
    m.stats.statesStored += r->state ? 1 : 0;
  } else {
    ++m.stats.storeFailures;
    m.noteError(r.error());
  }
  return r;
}

Status PrefixCache::Impl::rowsOf(const ParsedState& state, uint64_t from, uint64_t n,
                                 std::vector<const uint32_t*>& rows) {
  const size_t sections = state.kv.size();
  rowScratch.assign(sections * n, UINT32_MAX);
  rows.resize(sections);
  for (size_t s = 0; s < sections; ++s) {
    const SeqStateView& view = state.kv[s];
    uint32_t* out = rowScratch.data() + s * n;
    rows[s] = out;
    for (uint32_t i = 0; i < view.cellCount; ++i) {
      const int64_t p = view.positions[i];
      if (p < static_cast<int64_t>(from) || p >= static_cast<int64_t>(from + n)) continue;
      uint32_t& row = out[p - from];
      if (row != UINT32_MAX) {
        return makeError(ErrorCode::kInvalidArgument, "position ", p, " is held twice");
      }
      row = i;
    }
    if (std::find(out, out + n, UINT32_MAX) != out + n) {
      return makeError(ErrorCode::kInvalidArgument, "the sequence lacks a position in [", from,
                       ", ", from + n, ")", sections > 1 ? " (or its window moved past it)" : "");
    }
  }
  return {};
}

Status PrefixCache::Impl::fillFromState(WriteHandle& w, size_t firstBlock, size_t nBlocks,
                                        const ParsedState& state, uint64_t firstPos) {
  for (size_t s = 0; s < state.kv.size(); ++s) {
    if (!(state.kv[s].shape == memory.kv[s])) {
      return makeError(ErrorCode::kInvalidArgument,
                       "the context's K/V state does not match the settings the cache was opened "
                       "with (contextParams: K/V types, flash attention)");
    }
  }
  // Which state row holds each position to store: every one exactly once.
  const uint32_t bt = layout.blockTokens;
  std::vector<const uint32_t*> rows;
  if (auto s = rowsOf(state, firstPos, nBlocks * bt, rows); !s.ok()) return s;
  std::vector<const uint32_t*> blockRows(rows.size());
  for (size_t b = 0; b < nBlocks; ++b) {
    for (size_t s = 0; s < rows.size(); ++s) blockRows[s] = rows[s] + b * bt;
    std::span<uint8_t> dst = w.block(firstBlock + b);
    if (!dst.empty()) {
      // The block's checksum taken in the copy: the commit need not read the block back.
      const uint64_t sum = map->fillBlockSummed(dst.data(), state, blockRows);
      if (sum != 0) {
        if (auto s = w.blockWritten(firstBlock + b, sum); !s.ok()) return s;
      }
      continue;
    }
    // A client that cannot map the pool sends the block's bytes inline.
    std::vector<uint8_t> bytes(layout.blockBytes());
    map->fillBlock(bytes.data(), state, blockRows, bt);
    const uint64_t from = firstPos + b * bt;
    if (auto s = w.write(from, from + bt, bytes.data(), bytes.size()); !s.ok()) return s.error();
  }
  return {};
}

Result<StoreInfo> PrefixCache::Impl::storeImpl(llama_seq_id seq, const llama_token* tokens,
                                               size_t nTokens, bool withState) {
  StoreInfo info;
  const uint32_t bt = layout.blockTokens;
  const uint64_t whole = layout.hasKv() ? nTokens / bt * bt : 0;
  if (whole == 0 && !withState) return info;
  if (nTokens == 0) return info;
  if (nTokens > UINT32_MAX) return makeError(ErrorCode::kInvalidArgument, "too many tokens");
  llama_memory_t mem = llama_get_memory(ctx);
  const llama_pos last = static_cast<llama_pos>(nTokens) - 1;
  if (memory.recurrent() ? llama_memory_seq_pos_max(mem, seq) != last
      : memory.kind == MemoryKind::kKv
          ? llama_memory_seq_pos_min(mem, seq) != 0 || llama_memory_seq_pos_max(mem, seq) < last
          : llama_memory_seq_pos_max(mem, seq) < last) {
    return makeError(ErrorCode::kInvalidArgument, "sequence ", seq,
                     memory.recurrent() ? " does not end at " : " does not hold positions [0, ",
                     nTokens, memory.recurrent() ? "" : ")");
  }
  if (!connected()) return makeError(ErrorCode::kUnavailable, "kvtierd is not reachable");

  // A plain cache's blocks may be read a few at a time through the scratch sequence
  // (storeBlocks); every other store reads the whole state once.
  std::optional<ParsedState> parsed;
  if (scratchSeq < 0) {
    size_t got = 0;
    {
      Timed t(stats.storeLlamaNs);
      const size_t size = llama_state_seq_get_size(ctx, seq);
      if (size == 0) return makeError(ErrorCode::kInternal, "llama.cpp wrote no state");
      got = llama_state_seq_get_data(ctx, scratchOf(size), size, seq);
    }
    auto p = parseState({scratch.get(), got}, memory.kind, streams);
    if (!p) return p.error();
    parsed = std::move(*p);
  }
  if (whole > 0) {
    auto stored = storeBlocks(tokens, whole, parsed ? &*parsed : nullptr, seq, info);
    if (!stored) return stored.error();
  }
  if (withState) {
    if (auto s = storeState(tokens, nTokens, *parsed); !s.ok()) return s.error();
    info.state = true;
    info.bytes += layout.stateBytes;
  }
  return info;
}

Result<uint32_t> PrefixCache::Impl::storeBlocks(const llama_token* tokens, uint64_t whole,
                                                const ParsedState* parsed, llama_seq_id seq,
                                                StoreInfo& info) {
  const uint32_t bt = layout.blockTokens;
  std::span<const uint32_t> keyTokens(reinterpret_cast<const uint32_t*>(tokens), whole);
  // The blocks are written through this cache's helper sequence, whose sealed blocks stay cached
  // after it moves on: each store replaces its contents, so it holds the last stored prompt only.
  // When part of the prompt is cached, that part is bound to it first, so that it stays while the
  // rest is written after it and is not written again; a new prompt is written whole.
  const std::string& name = helperSeq;
  uint32_t cached = 0;
  if (!layout.hasState()) {
    // Which leading blocks kvtier holds already: a lookup over the fast lane, no sequence bound.
    Timed t(stats.storeDaemonNs);
    auto probe = space->lookup(keyTokens);
    if (!probe.ok()) return probe.error();
    cached = static_cast<uint32_t>(probe->matchedTokens());
    info.cachedTokens = cached;
    if (cached >= whole) return 0u;
  }
  // (In a namespace with states a plain lookup answers positions with a state: the binding
  // lookup, which answers blocks, tells what is cached.)
  if (cached > 0 || layout.hasState()) {
    LookupOptions bind;
    bind.bindSeq = name;
    bind.remote = RemoteMode::kLocal;
    Timed t(stats.storeDaemonNs);
    auto held = space->lookup(keyTokens, bind);
    if (!held.ok()) return held.error();
    cached = static_cast<uint32_t>(held->matchedTokens());
    info.cachedTokens = cached;
    if (cached >= whole) return 0u;
  }
  if (memory.windowed()) {
    // A windowed layer's rows of a block exist only while the block is in the window: blocks
    // that left it cannot be stored, and none after them (a prefix has no holes).
    int64_t first = INT64_MAX;
    for (int32_t p : parsed->kv.back().positions) first = std::min<int64_t>(first, p);
    if (first > static_cast<int64_t>(cached)) return 0u;
  }

  Result<WriteHandle> lease = [&] {
    Timed t(stats.storeDaemonNs);
    return space->beginPut(name, cached, keyTokens.subspan(cached));
  }();
  if (!lease.ok()) return lease.error();
  WriteHandle& w = lease.value();
  const size_t blocks = (whole - cached) / bt;
  if (w.firstPosition() != cached || w.blockCount() != blocks) {
    return makeError(ErrorCode::kInternal, "unexpected grant for positions [", cached, ", ", whole,
                     ")");
  }
  if (parsed != nullptr) {
    Timed t(stats.storeCopyNs);
    if (auto s = fillFromState(w, 0, blocks, *parsed, cached); !s.ok()) return s.error();
  } else if (auto s = storeSteps(w, seq, cached, blocks); !s.ok()) {
    return s.error();
  }
  kernels::copyFence();  // the streaming stores into the pool land before the commit
  Timed t(stats.storeDaemonNs);
  auto commit = w.commit();
  if (!commit.ok()) return commit.error();
  info.storedTokens = static_cast<uint32_t>(whole - cached);
  info.bytes = uint64_t{info.storedTokens} * layout.tokenKvBytes();
  return info.storedTokens;
}

Status PrefixCache::Impl::storeSteps(WriteHandle& w, llama_seq_id seq, uint64_t cached,
                                     size_t blocks) {
  // A few blocks at a time through the scratch sequence: llama.cpp writes step i's state into a
  // buffer, kvtier scatters it into the pool. Pipelined (CacheOptions::pipelineRestores) when the
  // blocks are mapped: the cache's second thread scatters step i while llama.cpp writes step i + 1
  // into the other buffer.
  llama_memory_t mem = llama_get_memory(ctx);
  const uint32_t bt = layout.blockTokens;
  const size_t per = stageBlocks();
  const size_t steps = (blocks + per - 1) / per;
  const size_t stepBytes =
      seqStateBytes(memory.kv.front(), static_cast<uint32_t>(per * bt), streams);
  const bool pipelined = steps > 1 && options.pipelineRestores && !w.block(0).empty();
  uint8_t* buffers[2] = {scratchOf((pipelined ? 2 : 1) * stepBytes), nullptr};
  buffers[1] = pipelined ? buffers[0] + stepBytes : buffers[0];
  std::vector<size_t> sizes(steps, 0);
  std::vector<Status> filled(steps);
  // Step i's scatter into the pool (on the worker when pipelined).
  auto scatter = [&](size_t i) {
    const size_t b0 = i * per, n = std::min(per, blocks - b0);
    auto staged = parseState({buffers[i % 2], sizes[i]}, memory.kind, streams);
    filled[i] =
        staged ? fillFromState(w, b0, n, *staged, cached + b0 * bt) : Status(staged.error());
    // The pool's streaming stores land before the step is handed back (a fence orders only its
    // own thread's stores: the commit's, on the caller's thread, would not order the worker's).
    kernels::copyFence();
  };
  std::optional<StageRun> run;
  if (pipelined) {
    if (!worker) worker = std::make_unique<StageWorker>();
    // The worker trails: step i is scattered once llama.cpp has written it (release(i)).
    worker->start(steps, scatter, /*lead=*/0);
    run.emplace(*worker);
  }
  for (size_t i = 0; i < steps; ++i) {
    const size_t b0 = i * per, n = std::min(per, blocks - b0);
    if (pipelined && i >= 2) {
      Timed t(stats.storeCopyNs);  // the time the store waits for the scatter
      worker->await(i - 2);        // step i - 2's buffer is free again
      if (!filled[i - 2].ok()) return filled[i - 2];
    }
    const auto first = static_cast<llama_pos>(cached + b0 * bt);
    const auto cells = static_cast<uint32_t>(n * bt);
    const size_t size = seqStateBytes(memory.kv.front(), cells, streams);
    {
      Timed t(stats.storeLlamaNs);
      llama_memory_seq_cp(mem, seq, scratchSeq, first, first + static_cast<llama_pos>(cells));
      sizes[i] = llama_state_seq_get_data(ctx, buffers[i % 2], size, scratchSeq);
      llama_memory_seq_rm(mem, scratchSeq, -1, -1);
    }
    if (sizes[i] != size) {
      return makeError(ErrorCode::kInvalidArgument, "sequence ", seq, " holds positions [", first,
                       ", ", first + static_cast<llama_pos>(cells), ") more than once");
    }
    if (pipelined) {
      worker->release(i);
    } else {
      Timed t(stats.storeCopyNs);
      scatter(i);
      if (!filled[i].ok()) return filled[i];
    }
  }
  if (pipelined) {
    Timed t(stats.storeCopyNs);
    worker->await(steps - 1);
    for (const Status& f : filled) {
      if (!f.ok()) return f;
    }
  }
  return {};
}

Status PrefixCache::Impl::storeState(const llama_token* tokens, size_t nTokens,
                                     const ParsedState& parsed) {
  if (auto s = checkRecurrentSection(parsed.recurrent, nTokens, memory.stateBytes); !s.ok()) {
    return s;
  }
  const uint32_t bt = layout.blockTokens;
  const auto partial = static_cast<uint32_t>(layout.hasKv() ? nTokens % bt : 0);
  std::span<const uint32_t> keyTokens(reinterpret_cast<const uint32_t*>(tokens), nTokens);
  Result<WriteHandle> lease = [&] {
    Timed t(stats.storeDaemonNs);
    return space->beginPutState(keyTokens);
  }();
  if (!lease.ok()) return lease.error();
  WriteHandle& w = lease.value();
  Timed t(stats.storeCopyNs);
  uint64_t offset = 0;
  if (partial > 0) {
    // The KV of the positions past the last whole block, in a block's first slots.
    std::vector<const uint32_t*> rows;
    if (auto s = rowsOf(parsed, nTokens - partial, partial, rows); !s.ok()) return s;
    std::span<uint8_t> dst = w.block(0);
    std::vector<uint8_t> bytes;
    if (dst.empty()) {  // a client that cannot map the pool
      bytes.assign(layout.blockBytes(), 0);
      dst = bytes;
    } else {
      std::memset(dst.data(), 0, layout.blockBytes());
    }
    map->fillBlock(dst.data(), parsed, rows, partial);
    if (!bytes.empty()) {
      if (auto s = w.writeState(0, bytes.data(), bytes.size()); !s.ok()) return s;
    }
    offset = layout.blockBytes();
  }
  if (auto s = w.writeState(offset, parsed.recurrent.data(), parsed.recurrent.size()); !s.ok()) {
    return s;
  }
  // The last chunk's bytes past the state are zeros (a chunk is checksummed and spilled whole).
  const uint64_t chunk = layout.chunkBytes(), end = offset + parsed.recurrent.size();
  if (const uint64_t tail = (chunk - end % chunk) % chunk; tail > 0) {
    std::vector<uint8_t> zeros(tail, 0);
    if (auto s = w.writeState(end, zeros.data(), zeros.size()); !s.ok()) return s;
  }
  kernels::copyFence();
  auto commit = w.commit();
  if (!commit.ok()) return commit.error();
  return {};
}

Result<PrefillInfo> PrefixCache::prefill(llama_seq_id seq, const llama_token* tokens,
                                         size_t nTokens, size_t from) {
  Impl& m = *impl_;
  if (auto s = m.checkCall(seq, tokens, nTokens); !s.ok()) return s.error();
  if (from > nTokens || nTokens > INT32_MAX) {
    return makeError(ErrorCode::kInvalidArgument, "prefill of [", from, ", ", nTokens, ")");
  }
  llama_memory_t mem = llama_get_memory(m.ctx);
  if (llama_memory_seq_pos_max(mem, seq) != static_cast<llama_pos>(from) - 1) {
    return makeError(ErrorCode::kInvalidArgument, "sequence ", seq, " does not end at ", from);
  }
  PrefillInfo info;
  const uint32_t step = m.checkpoint;
  const bool recurrent = m.memory.recurrent();
  llama_batch batch = llama_batch_init(static_cast<int32_t>(step), 0, 1);
  for (size_t pos = from; pos < nTokens;) {
    const size_t end = std::min<size_t>(nTokens, (pos / step + 1) * step);
    batch.n_tokens = static_cast<int32_t>(end - pos);
    for (size_t i = pos; i < end; ++i) {
      const size_t j = i - pos;
      batch.token[j] = tokens[i];
      batch.pos[j] = static_cast<llama_pos>(i);
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = seq;
      batch.logits[j] = i + 1 == nTokens;
    }
    if (llama_decode(m.ctx, batch) != 0) {
      llama_batch_free(batch);
      return makeError(ErrorCode::kInternal, "llama_decode failed at positions [", pos, ", ", end,
                       ")");
    }
    ++info.chunks;
    info.evaluatedTokens += static_cast<uint32_t>(end - pos);
    pos = end;
    // A recurrent model's blocks are stored with a state at their end, at checkpoints only (blocks
    // past the deepest state are of no use to anyone); the others' after every chunk.
    if (recurrent && end % step != 0) continue;
    auto stored = m.storeImpl(seq, tokens, end, recurrent);
    if (!stored) {
      info.storeFailed = true;
      ++m.stats.storeFailures;
      m.noteError(stored.error());
      continue;
    }
    ++m.stats.stores;
    m.stats.storedTokens += stored->storedTokens;
    info.storedTokens += stored->storedTokens;
    if (stored->state) {
      ++info.states;
      ++m.stats.statesStored;
    }
  }
  llama_batch_free(batch);
  return info;
}

}  // namespace kvtier::llama
