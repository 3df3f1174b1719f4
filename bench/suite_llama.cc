// The llama suite: llama.cpp reusing KV from kvtier, against the same engine recomputing it.
//
// A medium llama model with random weights (integrations/llama/make_gguf.py: tens of millions of
// parameters, GQA) runs in this process on one thread, as kvtier's llama.cpp integration serves
// it (kvtier/llama.h) against a kvtierd the suite starts. Per repetition:
//   ttft_speedup_1k / _4k    time to first token of a prompt of 1,024 / 4,096 tokens whose
//                            prefix (all but its last block) is in kvtier: restore + evaluate the
//                            last block, against evaluating the whole prompt (same batch split),
//                            same context, same thread
//   llama_restore_vs_memcpy  KV bytes restored per second (PrefixCache::restore of the 4k
//                            prefix: lookup, gather from the pool, llama_state_seq_set_data)
//                            over memcpy of as many bytes
//   llama_restore_vs_memcpy_no_checks  the same restores without checking the blocks against
//                            their writer's checksums (a bench-only switch), in the same rounds
//   llama_store_vs_memcpy    KV bytes stored per second (PrefixCache::store of that prefix as
//                            new blocks: llama_state_seq_get_data, scatter into the pool, commit)
//                            over memcpy of as many bytes
//   llama_restore_vs_state_set_1k / _4k   restores of the 1k / 4k prefix per second against
//                            llama_state_seq_set_data of the same prefix from a host buffer (an
//                            in-process cache such as llama-server's --cache-ram)
//   llama_store_vs_state_get_1k / _4k     stores of it as new blocks against
//                            llama_state_seq_get_data into a host buffer
// Each of those timed calls (and each memcpy) starts with the CPU caches flushed (CacheFlusher),
// so that neither side reads a buffer the step before it just wrote. The breakdown times
// llama.cpp's state calls alone, the copies kvtier cannot avoid, and where a restore and a store
// of the 4k and the 1k prefix spent their time. All of it again on a generated model of
// Llama-3.2-1B's shapes (ratios suffixed _1b).
//
// Then the other memories llama.cpp keeps, each a generated medium model of its family
// (gemma2: interleaved sliding window; mamba: recurrent only; lfm2: short-convolution layers with
// attention between), flash attention on, the integration's default block and checkpoint
// spacing. A first context prefills the 4,096-token prompt but its last block (storing as it goes)
// and stores at that end, as an engine does at the end of a turn; the measured context restores
// the prompt and evaluates the rest:
//   ttft_speedup_4k_swa / _recurrent / _hybrid   time to first token of the 4,096-token prompt
//                                                with the prefix restored, vs evaluating all of it
// with, per family, the bytes of one state (state_bytes_per_checkpoint) and the pool bytes the
// prefill kept per token of the prompt (cached_bytes_per_token: blocks and states, whole blocks).
#include <ggml-backend.h>

#include <cstring>
#include <string>
#include <tuple>

#include "bench/harness.h"
#include "integrations/llama/llama_bench_hooks.h"
#include "integrations/llama/llama_support.h"
#include "kvtier/llama.h"
#include "tools/json_string.h"

namespace kvtier::bench {
namespace {

namespace sup = llama::support;

// The integration's default block (CacheOptions::blockTokens).
const uint32_t kBlockTokens = llama::CacheOptions{}.blockTokens;
constexpr size_t kShort = 1024, kLong = 4096;
// The daemon's pool: a few dozen 4k prompts of the medium model. The suite writes it through once
// before it measures, so that stores land in blocks the pool has used before, as in a cache that
// runs full (a fresh pool's first write of each page is a page fault the pool's
// pre-faulting, not this path, is to remove).
constexpr const char* kPoolBytes = "512M";
constexpr size_t kPoolWarmStores = 36;  // x 16 MiB of the long prompt's prefix
// Restores, stores and memcpys per repetition (their medians make its figures).
constexpr int kCopyRounds = 9;

// One timed call's seconds.
template <typename F>
double timed(F&& f) {
  const auto t0 = Clock::now();
  f();
  return secondsSince(t0);
}

double memcpySeconds(HostBuffer& dst, const HostBuffer& src, size_t bytes) {
  return timed([&] { std::memcpy(dst.data(), src.data(), bytes); });
}

// A prompt of the first part: its prefix (all but its last block) is what kvtier holds.
struct Prompt {
  size_t length;
  std::vector<llama_token> tokens;
  size_t prefix;
};

// The restore and store paths of a prompt's prefix, each the median of kCopyRounds: kvtier's
// restore (checked, and without the checks), its store of the same KV as new blocks (under
// never-stored tokens), a memcpy of as many bytes, and llama.cpp's own state calls for the prefix
// from and into a host buffer (what an in-process cache costs); and where a restore and a store
// spent their time (CacheStats), per call. Each timed call starts with the CPU caches flushed:
// an in-process cache's state, like kvtier's pool, is read back by a later request, after other
// work (a 1B model's 2 GB of weights at every evaluated token) has gone through the caches, so
// neither side is timed reading a buffer the step before it just wrote.
struct PathFigures {
  double restore = 0, uncheckedRestore = 0, store = 0, copy = 0, get = 0, set = 0;
  double restoreDaemon = 0, restoreCopy = 0, restoreLlama = 0;
  double storeDaemon = 0, storeCopy = 0, storeLlama = 0;
};

Result<PathFigures> measurePaths(llama_context* ctx, llama::PrefixCache& cache,
                                 const llama_model* model, const Prompt& p, uint64_t& fresh,
                                 HostBuffer& src, HostBuffer& dst, std::vector<uint8_t>& state,
                                 CacheFlusher& flusher) {
  llama_memory_t mem = llama_get_memory(ctx);
  const size_t kvBytes = p.prefix * cache.layout().tokenKvBytes();
  std::vector<double> restores, uncheckedRestores, stores, copies, gets, sets;
  const llama::CacheStats before = cache.stats();
  for (int round = 0; round < kCopyRounds; ++round) {
    // Checked and unchecked restores; which goes first alternates.
    for (int k = 0; k < 2; ++k) {
      const bool checked = (k + round) % 2 == 0;
      llama_memory_seq_rm(mem, 0, -1, -1);
      llama::bench_hooks::setRestoreChecks(checked);
      flusher.flush();
      Result<llama::RestoreInfo> r = llama::RestoreInfo{};
      (checked ? restores : uncheckedRestores).push_back(timed([&] {
        r = cache.restore(0, p.tokens.data(), p.prefix);
      }));
      llama::bench_hooks::setRestoreChecks(true);
      if (!r) return r.error();
      if (r->tokens != p.prefix) {
        const llama::CacheStats& st = cache.stats();
        return makeError(ErrorCode::kInternal, "restored ", r->tokens, " of ", p.prefix,
                         " tokens (misses ", st.restoreMisses, ", corrupt ", st.restoreCorrupt,
                         ", failures ", st.restoreFailures, ")");
      }
    }
    flusher.flush();
    copies.push_back(memcpySeconds(dst, src, kvBytes));
    std::vector<llama_token> other = sup::randomTokens(model, ++fresh, p.prefix);
    Result<llama::StoreInfo> s = llama::StoreInfo{};
    flusher.flush();
    stores.push_back(timed([&] { s = cache.store(0, other.data(), other.size()); }));
    if (!s) return s.error();
    if (s->storedTokens != p.prefix) return makeError(ErrorCode::kInternal, "store not new");
    flusher.flush();
    copies.push_back(memcpySeconds(dst, src, kvBytes));
    // llama.cpp's own state calls for the whole prefix: the copies the state API makes.
    state.resize(llama_state_seq_get_size(ctx, 0));
    flusher.flush();
    gets.push_back(timed([&] { llama_state_seq_get_data(ctx, state.data(), state.size(), 0); }));
    llama_memory_seq_rm(mem, 0, -1, -1);
    flusher.flush();
    sets.push_back(timed([&] { llama_state_seq_set_data(ctx, state.data(), state.size(), 0); }));
  }
  const llama::CacheStats& after = cache.stats();
  // Two restores and one store a round.
  const auto perCall = [&](uint64_t llama::CacheStats::*field, int calls) {
    return static_cast<double>(after.*field - before.*field) / calls * 1e-9;
  };
  PathFigures f;
  f.restore = medianOf(restores);
  f.uncheckedRestore = medianOf(uncheckedRestores);
  f.store = medianOf(stores);
  f.copy = medianOf(copies);
  f.get = medianOf(gets);
  f.set = medianOf(sets);
  f.restoreDaemon = perCall(&llama::CacheStats::restoreDaemonNs, 2 * kCopyRounds);
  f.restoreCopy = perCall(&llama::CacheStats::restoreCopyNs, 2 * kCopyRounds);
  f.restoreLlama = perCall(&llama::CacheStats::restoreLlamaNs, 2 * kCopyRounds);
  f.storeDaemon = perCall(&llama::CacheStats::storeDaemonNs, kCopyRounds);
  f.storeCopy = perCall(&llama::CacheStats::storeCopyNs, kCopyRounds);
  f.storeLlama = perCall(&llama::CacheStats::storeLlamaNs, kCopyRounds);
  return f;
}

// A family of the second part: its generated model and the ratio it reports.
struct FamilyRun {
  const char* preset;
  const char* ratio;
};
constexpr FamilyRun kFamilies[] = {{"gemma2-medium", "ttft_speedup_4k_swa"},
                                   {"mamba-medium", "ttft_speedup_4k_recurrent"},
                                   {"lfm2-medium", "ttft_speedup_4k_hybrid"}};

// One family: its TTFT ratio filled in `report`, its figures appended to `extra` (JSON members).
Status runFamily(const Options& options, const FamilyRun& family, RatioReport& report,
                 std::vector<std::string>& extra) {
  // A daemon of its own: a pool's memory, once carved into one model's block size, stays with
  // it, and one model per daemon is the common deployment.
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(
          options.daemon, *dir, socket,
          options.daemonFlags({"--host-pool-bytes", kPoolBytes, "--cold-tier", "off"}));
      !s)
    return s;
  const std::string modelPath = dir->file(std::string(family.preset) + ".gguf");
  try {
    sup::makeModel(modelPath, family.preset, 1);
  } catch (const std::exception& e) {
    return unavailable(e.what());
  }
  sup::ModelPtr model = sup::loadModel(modelPath);
  if (!model) return unavailable("llama.cpp cannot load ", modelPath);
  sup::ContextSettings settings;
  settings.nCtx = kLong + 256;
  settings.threads = 1;
  const llama_context_params cp = sup::contextParams(settings);
  llama::CacheOptions co;
  co.socketPath = socket;
  co.modelPath = modelPath;
  co.contextParams = cp;
  // The storing engine first, in a context of its own (a recurrent model's state lives in the
  // context), and its cache closed before the measured one opens (a caller-thread client each,
  // one per thread at a time).
  const std::vector<llama_token> prompt = sup::randomTokens(model.get(), kLong, kLong);
  const size_t prefix = kLong - kBlockTokens;
  double cachedPerToken = 0;
  {
    sup::ContextPtr writer = sup::makeContext(model.get(), cp);
    if (!writer) return unavailable("llama.cpp cannot make a context");
    auto writerCache = llama::PrefixCache::open(writer.get(), co);
    if (!writerCache) return writerCache.error();
    auto filled = (*writerCache)->prefill(0, prompt.data(), prefix, 0);
    if (!filled) return filled.error();
    auto stored = (*writerCache)->store(0, prompt.data(), prefix);
    if (!stored) return stored.error();
    // What the prompt's prefix keeps in the pool: its blocks and its states, whole chunks each.
    const Layout& l = (*writerCache)->layout();
    const llama::CacheStats& written = (*writerCache)->stats();
    cachedPerToken = static_cast<double>(written.storedTokens / kBlockTokens * l.blockBytes() +
                                         written.statesStored * l.stateChunks(0) * l.chunkBytes()) /
                     prefix;
  }
  sup::ContextPtr ctx = sup::makeContext(model.get(), cp);
  if (!ctx) return unavailable("llama.cpp cannot make a context");
  auto opened = llama::PrefixCache::open(ctx.get(), co);
  if (!opened) return opened.error();
  llama::PrefixCache& cache = **opened;
  const Layout& layout = cache.layout();
  std::printf(
      "%s: %s memory, %d layers, %d wide, %.1f M parameters; %llu KV bytes per token, a "
      "state of %llu bytes, prefill chunks of %u tokens\n",
      family.preset, cache.memoryKind(), llama_model_n_layer(model.get()),
      llama_model_n_embd(model.get()), llama_model_n_params(model.get()) / 1e6,
      static_cast<unsigned long long>(layout.tokenKvBytes()),
      static_cast<unsigned long long>(cache.stateBytes()), cache.checkpointTokens());

  llama_memory_t mem = llama_get_memory(ctx.get());
  for (int rep = 0; rep <= options.reps && !gInterrupted; ++rep) {
    llama_memory_seq_rm(mem, 0, -1, -1);
    size_t restored = 0;
    const double withKvtier = timed([&] {
      auto r = cache.restore(0, prompt.data(), kLong - 1);
      restored = r.ok() ? r->tokens : 0;
      sup::decode(ctx.get(), 0, prompt, restored, kLong);
    });
    if (restored != prefix) {
      return makeError(ErrorCode::kInternal, family.preset, ": restored ", restored, " of ", prefix,
                       " tokens");
    }
    llama_memory_seq_rm(mem, 0, -1, -1);
    const double recompute = timed([&] { sup::decode(ctx.get(), 0, prompt, 0, kLong); });
    if (rep == 0) continue;
    report.kvtier.perRep.push_back(1 / withKvtier);
    report.anchor.perRep.push_back(1 / recompute);
  }
  extra.push_back("\"" + std::string(family.preset) + "\": {\"memory\": \"" + cache.memoryKind() +
                  "\", \"state_bytes_per_checkpoint\": " + std::to_string(cache.stateBytes()) +
                  ", \"checkpoint_tokens\": " + std::to_string(cache.checkpointTokens()) +
                  ", \"kv_bytes_per_token\": " + std::to_string(layout.tokenKvBytes()) +
                  ", \"cached_bytes_per_token\": " + std::to_string(cachedPerToken) +
                  ", \"params\": " + std::to_string(llama_model_n_params(model.get())) + "}");
  return {};
}

// A plain llama model of the first part: the medium model every ratio names, and one with
// Llama-3.2-1B's shapes whose ratios carry `suffix` (its prefills take minutes on this machine's
// two cores: fewer repetitions, both threads).
struct PlainModel {
  const char* preset;  // make_gguf.py's
  const char* suffix;
  int threads;
  const char* poolBytes;
  size_t warmStores;  // x the long prompt's prefix: the pool written through once
  int maxReps;
};
constexpr PlainModel kPlainModels[] = {{"medium", "", 1, kPoolBytes, kPoolWarmStores, 1000},
                                       {"llama-1b", "_1b", 2, "2G", 16, 3}};

// The first part for one model: its ratios appended to `reports`, its breakdown to `steps` and
// its description to `extra` (JSON members).
Status runPlain(const Options& options, const PlainModel& pm, std::vector<RatioReport>& reports,
                std::vector<std::pair<std::string, double>>& steps,
                std::vector<std::string>& extra) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  const std::string modelPath = dir->file(std::string(pm.preset) + ".gguf");
  try {
    sup::makeModel(modelPath, pm.preset, 1);
  } catch (const std::exception& e) {
    return unavailable(e.what());
  }
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(
          options.daemon, *dir, socket,
          options.daemonFlags({"--host-pool-bytes", pm.poolBytes, "--cold-tier", "off"}));
      !s)
    return s;

  sup::ModelPtr model = sup::loadModel(modelPath);
  if (!model) return unavailable("llama.cpp cannot load ", modelPath);
  sup::ContextSettings settings;
  settings.nCtx = kLong + 256;
  settings.threads = pm.threads;
  // Sequence 1 is the cache's scratch sequence in a unified KV cache (CacheOptions::scratchSeq):
  // the configuration the integration recommends, whose KV crosses memory once per store or
  // restore.
  settings.nSeq = 2;
  llama_context_params cp = sup::contextParams(settings);
  cp.kv_unified = true;
  sup::ContextPtr ctx = sup::makeContext(model.get(), cp);
  if (!ctx) return unavailable("llama.cpp cannot make a context");
  llama::CacheOptions co;
  co.socketPath = socket;
  co.modelPath = modelPath;
  co.contextParams = cp;
  co.blockTokens = kBlockTokens;
  co.scratchSeq = 1;
  auto opened = llama::PrefixCache::open(ctx.get(), co);
  if (!opened) return opened.error();
  llama::PrefixCache& cache = **opened;
  const Layout& layout = cache.layout();
  char desc[128];
  llama_model_desc(model.get(), desc, sizeof(desc));
  std::printf(
      "model: %s (%s), %d layers, %d wide, %d heads, %d KV heads, %.1f M parameters, "
      "%d thread(s), flash attention on, unified KV with a scratch sequence; %llu KV bytes per "
      "token, blocks of %u tokens\n",
      desc, pm.preset, llama_model_n_layer(model.get()), llama_model_n_embd(model.get()),
      llama_model_n_head(model.get()), llama_model_n_head_kv(model.get()),
      llama_model_n_params(model.get()) / 1e6, pm.threads,
      static_cast<unsigned long long>(layout.tokenKvBytes()), kBlockTokens);
  std::fflush(stdout);

  llama_memory_t mem = llama_get_memory(ctx.get());
  auto clear = [&] { llama_memory_seq_rm(mem, 0, -1, -1); };
  // Each prompt's prefix (all but its last block) evaluated once and stored.
  std::vector<Prompt> prompts;
  uint64_t fresh = 1u << 20;  // seeds of never-stored token lists
  for (size_t n : {kLong, kShort}) {
    Prompt p{n, sup::randomTokens(model.get(), n, n), n - kBlockTokens};
    const std::vector<size_t> split = {p.prefix};
    clear();
    if (!sup::decode(ctx.get(), 0, p.tokens, 0, p.prefix, split))
      return unavailable("llama_decode failed");
    if (n == kLong) {
      // The pool written through once: the long prefix's KV stored under never-stored tokens,
      // the same bytes as new blocks, until the pool has reused its blocks.
      for (size_t i = 0; i < pm.warmStores; ++i) {
        std::vector<llama_token> other = sup::randomTokens(model.get(), ++fresh, p.prefix);
        if (auto s = cache.store(0, other.data(), other.size()); !s) return s.error();
      }
    }
    auto stored = cache.store(0, p.tokens.data(), p.prefix);
    if (!stored) return stored.error();
    prompts.push_back(std::move(p));
  }
  const Prompt& big = prompts.front();
  const size_t kvBytes = big.prefix * layout.tokenKvBytes();
  HostBuffer src(kvBytes), dst(kvBytes);
  std::vector<uint8_t> state;
  CacheFlusher flusher;

  const auto report = [&](const std::string& name, auto&&... rest) {
    return newReport(name + pm.suffix, rest...);
  };
  // Time to first token as its inverse, so that the ratio is the speedup (shown as the time).
  const auto restoreOf = [](size_t n) {
    return "restore " + std::to_string(n - kBlockTokens) + " + evaluate " +
           std::to_string(kBlockTokens) + " tokens";
  };
  const std::string prefix = std::to_string(big.prefix) + " tokens";
  RatioReport speed1k = report("ttft_speedup_1k", restoreOf(kShort), "evaluate 1024 tokens", "1/s",
                               true, std::nullopt);
  RatioReport speed4k = report("ttft_speedup_4k", restoreOf(kLong), "evaluate 4096 tokens", "1/s",
                               true, std::nullopt);
  RatioReport restoreMem = report("llama_restore_vs_memcpy", "PrefixCache::restore of " + prefix,
                                  "memcpy", "bytes/s", true, 0.5);
  // llama_restore_vs_memcpy may be at most 0.05 below this (the check is fused into the copy).
  RatioReport restoreUncheckedMem =
      report("llama_restore_vs_memcpy_no_checks", "the same restores, no checks", "memcpy",
             "bytes/s", true, std::nullopt);
  RatioReport storeMem = report("llama_store_vs_memcpy", "PrefixCache::store of " + prefix,
                                "memcpy", "bytes/s", true, 0.5);
  // Against an in-process cache: llama.cpp's own state call for the same prefix, from or into a
  // host buffer.
  const std::string shortPrefix = std::to_string(prompts.back().prefix) + " tokens";
  RatioReport restoreSet1k =
      report("llama_restore_vs_state_set_1k", "PrefixCache::restore of " + shortPrefix,
             "llama_state_seq_set_data of " + shortPrefix, "1/s", true, 0.8);
  RatioReport restoreSet4k =
      report("llama_restore_vs_state_set_4k", "PrefixCache::restore of " + prefix,
             "llama_state_seq_set_data of " + prefix, "1/s", true, 0.8);
  RatioReport storeGet1k =
      report("llama_store_vs_state_get_1k", "PrefixCache::store of " + shortPrefix,
             "llama_state_seq_get_data of " + shortPrefix, "1/s", true, 0.8);
  RatioReport storeGet4k = report("llama_store_vs_state_get_4k", "PrefixCache::store of " + prefix,
                                  "llama_state_seq_get_data of " + prefix, "1/s", true, 0.8);
  std::vector<double> getData, setData, memcpys;
  // CacheStats' time split per restore and per store, for the long prefix [0] and the short [1].
  std::vector<double> phases[2][6];

  const int reps = std::min(options.reps, pm.maxReps);
  for (int rep = 0; rep <= reps && !gInterrupted; ++rep) {
    const bool warm = rep == 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const Prompt& p = prompts[i];
      const std::vector<size_t> split = {p.prefix};
      clear();
      size_t restored = 0;
      const double withKvtier = timed([&] {
        auto r = cache.restore(0, p.tokens.data(), p.length - 1);
        restored = r.ok() ? r->tokens : 0;
        sup::decode(ctx.get(), 0, p.tokens, restored, p.length, split);
      });
      if (restored != p.prefix)
        return makeError(ErrorCode::kInternal, "restored ", restored, " of ", p.prefix, " tokens");
      if (warm || getenv("QUICK"))
        continue;  // (the recompute, minutes for the large model, is the same each time)
      clear();
      const double recompute =
          timed([&] { sup::decode(ctx.get(), 0, p.tokens, 0, p.length, split); });
      RatioReport& r = p.length == kShort ? speed1k : speed4k;
      r.kvtier.perRep.push_back(1 / withKvtier);
      r.anchor.perRep.push_back(1 / recompute);
    }

    // The restore path alone, then the store path of the same bytes as new blocks, for the long
    // prefix and the short one, each beside its anchors; the medians of kCopyRounds per repetition.
    auto paths = measurePaths(ctx.get(), cache, model.get(), big, fresh, src, dst, state, flusher);
    if (!paths) return paths.error();
    auto shortPaths = measurePaths(ctx.get(), cache, model.get(), prompts.back(), fresh, src, dst,
                                   state, flusher);
    if (!shortPaths) return shortPaths.error();
    if (warm) continue;
    for (auto [figures, split] :
         {std::pair{&*paths, phases[0]}, std::pair{&*shortPaths, phases[1]}}) {
      split[0].push_back(figures->restoreDaemon);
      split[1].push_back(figures->restoreCopy);
      split[2].push_back(figures->restoreLlama);
      split[3].push_back(figures->storeDaemon);
      split[4].push_back(figures->storeCopy);
      split[5].push_back(figures->storeLlama);
    }
    memcpys.push_back(paths->copy);
    restoreMem.kvtier.perRep.push_back(kvBytes / paths->restore);
    restoreMem.anchor.perRep.push_back(kvBytes / paths->copy);
    restoreUncheckedMem.kvtier.perRep.push_back(kvBytes / paths->uncheckedRestore);
    restoreUncheckedMem.anchor.perRep.push_back(kvBytes / paths->copy);
    storeMem.kvtier.perRep.push_back(kvBytes / paths->store);
    storeMem.anchor.perRep.push_back(kvBytes / paths->copy);
    getData.push_back(paths->get);
    setData.push_back(paths->set);
    // Against llama.cpp's own state calls for the same prefix (an in-process cache's cost):
    // calls per second.
    for (auto [figures, restoreR, storeR] :
         {std::tuple{&*paths, &restoreSet4k, &storeGet4k},
          std::tuple{&*shortPaths, &restoreSet1k, &storeGet1k}}) {
      restoreR->kvtier.perRep.push_back(1 / figures->restore);
      restoreR->anchor.perRep.push_back(1 / figures->set);
      storeR->kvtier.perRep.push_back(1 / figures->store);
      storeR->anchor.perRep.push_back(1 / figures->get);
    }
    // One line per repetition, as it ends (a run that stops early still shows what it measured).
    auto last = [](const RatioReport& r) {
      return r.kvtier.perRep.empty() ? 0.0 : r.kvtier.perRep.back() / r.anchor.perRep.back();
    };
    std::printf(
        "%s rep %d: restore/set_data %.3f (1k) %.3f (4k), store/get_data %.3f (1k) %.3f (4k), "
        "TTFT speedup %.2f (1k) %.2f (4k)\n",
        pm.preset, rep, last(restoreSet1k), last(restoreSet4k), last(storeGet1k), last(storeGet4k),
        last(speed1k), last(speed4k));
    std::fflush(stdout);
  }
  for (RatioReport* r : {&speed1k, &speed4k, &restoreMem, &restoreUncheckedMem, &storeMem,
                         &restoreSet1k, &restoreSet4k, &storeGet1k, &storeGet4k}) {
    reports.push_back(std::move(*r));
  }
  const std::string of = std::string(" (") + pm.preset + ")";
  for (auto [name, values] : std::initializer_list<std::pair<const char*, std::vector<double>*>>{
           {"memcpy of the long prefix's KV", &memcpys},
           {"llama_state_seq_get_data alone, the whole prefix", &getData},
           {"llama_state_seq_set_data alone, the whole prefix", &setData}}) {
    steps.emplace_back(name + of, medianOf(*values));
  }
  for (int length = 0; length < 2; ++length) {
    const std::string at = length == 0 ? ", 4k" : ", 1k";
    for (int phase = 0; phase < 6; ++phase) {
      constexpr const char* kPhases[6] = {"restore: kvtierd (lookup, release)",
                                          "restore: kvtier's copies, pool -> state",
                                          "restore: llama.cpp (set_data, seq_cp, seq_rm)",
                                          "store: kvtierd (bind, grant, commit, unbind)",
                                          "store: kvtier's copies, state -> pool",
                                          "store: llama.cpp (seq_cp, get_data, seq_rm)"};
      steps.emplace_back(kPhases[phase] + (of.substr(0, of.size() - 1) + at + ")"),
                         medianOf(phases[length][phase]));
    }
  }
  extra.push_back("\"model" + std::string(pm.suffix) + "\": {\"preset\": \"" + pm.preset +
                  "\", \"layers\": " + std::to_string(llama_model_n_layer(model.get())) +
                  ", \"embd\": " + std::to_string(llama_model_n_embd(model.get())) +
                  ", \"heads\": " + std::to_string(llama_model_n_head(model.get())) +
                  ", \"kv_heads\": " + std::to_string(llama_model_n_head_kv(model.get())) +
                  ", \"params\": " + std::to_string(llama_model_n_params(model.get())) +
                  ", \"threads\": " + std::to_string(pm.threads) +
                  ", \"reps\": " + std::to_string(reps) +
                  ", \"kv_bytes_per_token\": " + std::to_string(layout.tokenKvBytes()) +
                  ", \"block_tokens\": " + std::to_string(kBlockTokens) + "}");
  return {};
}

// The devices llama.cpp computes on, printed and as a JSON array: a GPU's among them when a GPU
// back-end was loaded (GGML_BACKEND_PATH, scripts/build-llama-cuda.sh), and then the models'
// layers and KV cache are on it.
std::string llamaDevices() {
  sup::loadBackends();
  std::string json = "[";
  for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
    ggml_backend_dev_t dev = ggml_backend_dev_get(i);
    std::string name =
        std::string(ggml_backend_dev_name(dev)) + ": " + ggml_backend_dev_description(dev);
    std::printf("llama.cpp device %zu: %s\n", i, name.c_str());
    json += (i ? ", " : "") + jsonString(name);
  }
  return json + "]";
}

Status run(const Options& options) {
  std::vector<RatioReport> reports;
  Breakdown breakdown;
  RunInfo info = runInfoOf("llama", options, {{"llama.cpp", "\"node-llama-cpp 3.22.1\""}});
  info.extra.push_back("\"llama_devices\": " + llamaDevices());
  for (const PlainModel& pm : kPlainModels) {
    if (gInterrupted) break;
    if (auto s = runPlain(options, pm, reports, breakdown.steps, info.extra); !s) return s;
  }
  // The other memories, each a medium model of its family.
  std::vector<std::string> families;
  const std::string restore4k = "restore " + std::to_string(kLong - kBlockTokens) + " + evaluate " +
                                std::to_string(kBlockTokens) + " tokens";
  for (const FamilyRun& family : kFamilies) {
    if (gInterrupted) break;
    RatioReport r = newReport(family.ratio, restore4k, "evaluate 4096 tokens", "1/s", true, 5.0);
    if (auto s = runFamily(options, family, r, families); !s) return s;
    reports.push_back(std::move(r));
  }
  printTable("llama", reports, options.reps);
  printBreakdown(breakdown);
  std::string familyJson = "\"families\": {";
  for (size_t i = 0; i < families.size(); ++i) familyJson += (i ? ", " : "") + families[i];
  info.extra.push_back(familyJson + "}");
  return writeReport(options, reports, breakdown, info);
}

}  // namespace

extern const Suite kLlamaSuite{
    "llama",
    "  --suite llama   llama.cpp on kvtier (a generated medium model, one thread): time to first\n"
    "                  token with the prefix restored vs recomputed (1k, 4k tokens), restore and\n"
    "                  store of KV vs memcpy\n",
    run};

}  // namespace kvtier::bench
