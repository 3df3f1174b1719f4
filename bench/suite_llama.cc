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
// The breakdown times llama.cpp's state calls alone, the copies kvtier cannot avoid.
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
#include <cstring>

#include "bench/harness.h"
#include "integrations/llama/llama_bench_hooks.h"
#include "integrations/llama/llama_support.h"
#include "kvtier/llama.h"

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

Status run(const Options& options) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  const std::string modelPath = dir->file("medium.gguf");
  try {
    sup::makeModel(modelPath, "medium", 1);
  } catch (const std::exception& e) {
    return unavailable(e.what());
  }
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(
          options.daemon, *dir, socket,
          options.daemonFlags({"--host-pool-bytes", kPoolBytes, "--cold-tier", "off"}));
      !s)
    return s;

  sup::ModelPtr model = sup::loadModel(modelPath);
  if (!model) return unavailable("llama.cpp cannot load ", modelPath);
  sup::ContextSettings settings;
  settings.nCtx = kLong + 256;
  settings.threads = 1;
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
      "model: %s, %d layers, %d wide, %d heads, %d KV heads, %.1f M parameters, "
      "1 thread, flash attention on, unified KV with a scratch sequence; %llu KV bytes per "
      "token, blocks of %u tokens\n",
      desc, llama_model_n_layer(model.get()), llama_model_n_embd(model.get()),
      llama_model_n_head(model.get()), llama_model_n_head_kv(model.get()),
      llama_model_n_params(model.get()) / 1e6,
      static_cast<unsigned long long>(layout.tokenKvBytes()), kBlockTokens);

  llama_memory_t mem = llama_get_memory(ctx.get());
  auto clear = [&] { llama_memory_seq_rm(mem, 0, -1, -1); };
  // Each prompt's prefix (all but its last block) evaluated once and stored.
  struct Prompt {
    size_t length;
    std::vector<llama_token> tokens;
    size_t prefix;
  };
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
      for (size_t i = 0; i < kPoolWarmStores; ++i) {
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

  const auto report = newReport;
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
  std::vector<double> getData, setData, memcpys;
  std::vector<double> phases[6];  // CacheStats' time split per restore and per store

  for (int rep = 0; rep <= options.reps && !gInterrupted; ++rep) {
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
      clear();
      const double recompute =
          timed([&] { sup::decode(ctx.get(), 0, p.tokens, 0, p.length, split); });
      if (warm) continue;
      RatioReport& r = p.length == kShort ? speed1k : speed4k;
      r.kvtier.perRep.push_back(1 / withKvtier);
      r.anchor.perRep.push_back(1 / recompute);
    }

    // The restore path alone, then the store path of the same bytes as new blocks (the KV of the
    // long prefix under never-stored tokens: the same bytes, a store of new blocks every time),
    // each beside a memcpy of as many bytes; the median of kCopyRounds of each per repetition.
    std::vector<double> restores, uncheckedRestores, stores, copies, gets, sets;
    const llama::CacheStats before = cache.stats();
    for (int round = 0; round < kCopyRounds; ++round) {
      clear();
      // Checked and unchecked restores; which goes first alternates.
      for (int k = 0; k < 2; ++k) {
        const bool checked = (k + round) % 2 == 0;
        clear();
        llama::bench_hooks::setRestoreChecks(checked);
        Result<llama::RestoreInfo> r = llama::RestoreInfo{};
        (checked ? restores : uncheckedRestores).push_back(timed([&] {
          r = cache.restore(0, big.tokens.data(), big.prefix);
        }));
        llama::bench_hooks::setRestoreChecks(true);
        if (!r || r->tokens != big.prefix) {
          return makeError(ErrorCode::kInternal, "restore missed");
        }
      }
      copies.push_back(memcpySeconds(dst, src, kvBytes));
      std::vector<llama_token> other = sup::randomTokens(model.get(), ++fresh, big.prefix);
      Result<llama::StoreInfo> s = llama::StoreInfo{};
      stores.push_back(timed([&] { s = cache.store(0, other.data(), other.size()); }));
      if (!s) return s.error();
      if (s->storedTokens != big.prefix) return makeError(ErrorCode::kInternal, "store not new");
      copies.push_back(memcpySeconds(dst, src, kvBytes));
      // llama.cpp's own state calls for the whole prefix: the copies the state API makes.
      state.resize(llama_state_seq_get_size(ctx.get(), 0));
      gets.push_back(
          timed([&] { llama_state_seq_get_data(ctx.get(), state.data(), state.size(), 0); }));
      clear();
      sets.push_back(
          timed([&] { llama_state_seq_set_data(ctx.get(), state.data(), state.size(), 0); }));
    }
    if (warm) continue;
    const llama::CacheStats& after = cache.stats();
    auto perCall = [&](uint64_t llama::CacheStats::*field) {
      return static_cast<double>(after.*field - before.*field) / kCopyRounds * 1e-9;
    };
    phases[0].push_back(perCall(&llama::CacheStats::restoreDaemonNs));
    phases[1].push_back(perCall(&llama::CacheStats::restoreCopyNs));
    phases[2].push_back(perCall(&llama::CacheStats::restoreLlamaNs));
    phases[3].push_back(perCall(&llama::CacheStats::storeDaemonNs));
    phases[4].push_back(perCall(&llama::CacheStats::storeCopyNs));
    phases[5].push_back(perCall(&llama::CacheStats::storeLlamaNs));
    memcpys.push_back(medianOf(copies));
    const double copy = medianOf(copies);
    restoreMem.kvtier.perRep.push_back(kvBytes / medianOf(restores));
    restoreMem.anchor.perRep.push_back(kvBytes / copy);
    restoreUncheckedMem.kvtier.perRep.push_back(kvBytes / medianOf(uncheckedRestores));
    restoreUncheckedMem.anchor.perRep.push_back(kvBytes / copy);
    storeMem.kvtier.perRep.push_back(kvBytes / medianOf(stores));
    storeMem.anchor.perRep.push_back(kvBytes / copy);
    getData.push_back(medianOf(gets));
    setData.push_back(medianOf(sets));
  }

  // The other memories. The plain model's cache is closed first (a caller-thread client per
  // thread at a time); the figures below that name it were taken before.
  const uint64_t plainKvPerToken = layout.tokenKvBytes();
  opened.value().reset();
  std::vector<RatioReport> reports = {speed1k, speed4k, restoreMem, restoreUncheckedMem, storeMem};
  std::vector<std::string> families;
  for (const FamilyRun& family : kFamilies) {
    if (gInterrupted) break;
    RatioReport r =
        report(family.ratio, restoreOf(kLong), "evaluate 4096 tokens", "1/s", true, 5.0);
    if (auto s = runFamily(options, family, r, families); !s) return s;
    reports.push_back(std::move(r));
  }
  printTable("llama", reports, options.reps);
  Breakdown breakdown;
  breakdown.steps = {{"memcpy of the long prefix's KV", medianOf(memcpys)},
                     {"restore: kvtierd (lookup, release)", medianOf(phases[0])},
                     {"restore: kvtier's copies, pool -> state", medianOf(phases[1])},
                     {"restore: llama.cpp (set_data, seq_cp, seq_rm)", medianOf(phases[2])},
                     {"store: kvtierd (bind, grant, commit, unbind)", medianOf(phases[3])},
                     {"store: kvtier's copies, state -> pool", medianOf(phases[4])},
                     {"store: llama.cpp (seq_cp, get_data, seq_rm)", medianOf(phases[5])},
                     {"llama_state_seq_get_data alone, the whole prefix", medianOf(getData)},
                     {"llama_state_seq_set_data alone, the whole prefix", medianOf(setData)}};
  printBreakdown(breakdown);
  RunInfo info = runInfoOf("llama", options, {{"llama.cpp", "\"node-llama-cpp 3.22.1\""}});
  info.extra.push_back(
      "\"model\": {\"layers\": " + std::to_string(llama_model_n_layer(model.get())) +
      ", \"embd\": " + std::to_string(llama_model_n_embd(model.get())) +
      ", \"heads\": " + std::to_string(llama_model_n_head(model.get())) +
      ", \"kv_heads\": " + std::to_string(llama_model_n_head_kv(model.get())) +
      ", \"params\": " + std::to_string(llama_model_n_params(model.get())) +
      ", \"kv_bytes_per_token\": " + std::to_string(plainKvPerToken) +
      ", \"block_tokens\": " + std::to_string(kBlockTokens) + "}");
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
