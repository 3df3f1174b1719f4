// kvtier::llama::PrefixCache: llama.cpp's sequence state <-> kvtier blocks and states.
//
// One translation, both ways (state_map.h). A kvtier block of this integration's layout holds,
// for each layer of each KV section of the state, the K of its blockTokens positions (one
// llama.cpp K row each, slot after slot) and then their V (rows likewise, or with V transposed
// the n_embd_v columns of blockTokens elements each): exactly the rows llama.cpp's state writer
// emits for those cells, so a store is a scatter of the state's rows into blocks and a restore a
// gather of blocks into a state, each one copy. A recurrent model's state at a position is the
// state's recurrent section, kept by kvtier as a prefix state (Layout::stateBytes).
//
// This file: open, the connection, restore. llama_store.cc: store and prefill.
#include <ggml.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "integrations/llama/llama_bench_hooks.h"
#include "integrations/llama/llama_cache_impl.h"
#include "kernels/block_copy.h"
#include "kvtier/block_key.h"

namespace kvtier::llama {
namespace {

// After the daemon went away, how often a call may try to connect again.
constexpr auto kReconnectInterval = std::chrono::seconds(1);
// The default spacing of a recurrent model's states: at most this many tokens to recompute.
constexpr uint32_t kMaxDefaultCheckpoint = 2048;
constexpr uint32_t kNoKvCheckpoint = 512;

std::string hex(const uint8_t* bytes, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  return out;
}

Result<std::string> fileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return makeError(ErrorCode::kInvalidArgument, "cannot read model file ", path);
  Sha256 sha;
  sha.begin();
  std::vector<char> chunk(4 << 20);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    sha.update(chunk.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return makeError(ErrorCode::kInvalidArgument, "error reading model file ", path);
  auto digest = sha.finish();
  return hex(digest.data(), digest.size());
}

std::string modelMeta(const llama_model* model, const std::string& key) {
  char buf[256];
  int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
  return n < 0 ? std::string() : std::string(buf);
}

// kvtier's Layout speaks of heads and head dims of one dtype; a slot of this integration is a
// llama.cpp row of raw bytes (any ggml type, quantized ones too), so the layout describes it as
// int8 "heads" whose sizes multiply to the slot's bytes.
bool slotAsHeads(uint64_t slotBytes, uint32_t preferredHeads, uint32_t& heads, uint32_t& dim) {
  for (uint32_t h = std::max(preferredHeads, 1u); h <= kMaxKvHeads; ++h) {
    if (slotBytes % h == 0 && slotBytes / h <= kMaxHeadDim) {
      heads = h;
      dim = static_cast<uint32_t>(slotBytes / h);
      return true;
    }
  }
  return false;
}

// The memory llama.cpp builds for the model (src/llama-model.cpp create_memory), as its sequence
// state shows it.
MemoryKind memoryKindOf(const llama_model* model) {
  const bool window = llama_model_n_swa(model) > 0;
  if (llama_model_is_hybrid(model)) return window ? MemoryKind::kHybridIswa : MemoryKind::kHybrid;
  if (llama_model_is_recurrent(model)) return MemoryKind::kRecurrent;
  return window ? MemoryKind::kIswa : MemoryKind::kKv;
}

// The shape of a plain KV cache's rows, from the model's dimensions and the context's K/V types
// (store() checks it against the state the engine really writes).
Result<MemoryShape> plainShape(const llama_model* model, const llama_context_params& cp,
                               uint32_t streams) {
  const std::string arch = modelMeta(model, "general.architecture");
  const uint32_t nLayer = static_cast<uint32_t>(llama_model_n_layer(model));
  const uint32_t nHead = static_cast<uint32_t>(llama_model_n_head(model));
  const uint32_t nHeadKv = static_cast<uint32_t>(llama_model_n_head_kv(model));
  const uint32_t nEmbd = static_cast<uint32_t>(llama_model_n_embd(model));
  if (nLayer == 0 || nHead == 0 || nHeadKv == 0) {
    return makeError(ErrorCode::kNotSupported, "model has no attention layers");
  }
  auto headDim = [&](const char* key) -> uint32_t {
    std::string v = modelMeta(model, arch + ".attention." + key);
    return v.empty() ? nEmbd / nHead : static_cast<uint32_t>(std::stoul(v));
  };
  const uint32_t nEmbdK = headDim("key_length") * nHeadKv;
  const uint32_t nEmbdV = headDim("value_length") * nHeadKv;
  StateShape shape;
  shape.nLayer = nLayer;
  shape.kType = static_cast<int32_t>(cp.type_k);
  shape.vType = static_cast<int32_t>(cp.type_v);
  shape.kRowBytes = ggml_row_size(cp.type_k, nEmbdK);
  shape.vTrans = cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED;
  shape.vRowBytes = ggml_row_size(cp.type_v, nEmbdV);
  if (shape.vTrans) {
    shape.vElemBytes = static_cast<uint32_t>(ggml_type_size(cp.type_v));
    shape.nEmbdV = nEmbdV;
  }
  MemoryShape memory;
  memory.kind = MemoryKind::kKv;
  memory.kv.push_back(shape);
  memory.streams = streams;
  return memory;
}

// The shape of any other memory, from the state it writes for one token: evaluated in an empty
// sequence of the context, which is emptied again.
Result<MemoryShape> probedShape(llama_context* ctx, MemoryKind kind, uint32_t streams) {
  llama_memory_t mem = llama_get_memory(ctx);
  const llama_model* model = llama_get_model(ctx);
  llama_seq_id seq = -1;
  for (uint32_t s = 0; s < llama_n_seq_max(ctx) && seq < 0; ++s) {
    if (llama_memory_seq_pos_max(mem, static_cast<llama_seq_id>(s)) < 0) {
      seq = static_cast<llama_seq_id>(s);
    }
  }
  if (seq < 0) {
    return makeError(ErrorCode::kInvalidArgument,
                     "open() needs an empty sequence to learn the shape of the model's state: "
                     "open the cache before the context holds tokens in every sequence");
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);
  llama_token token = llama_vocab_bos(vocab);
  if (token < 0) token = 0;
  llama_batch batch = llama_batch_init(1, 0, 1);
  batch.n_tokens = 1;
  batch.token[0] = token;
  batch.pos[0] = 0;
  batch.n_seq_id[0] = 1;
  batch.seq_id[0][0] = seq;
  batch.logits[0] = 0;
  const bool decoded = llama_decode(ctx, batch) == 0;
  llama_batch_free(batch);
  std::vector<uint8_t> state;
  if (decoded) {
    state.resize(llama_state_seq_get_size(ctx, seq));
    state.resize(llama_state_seq_get_data(ctx, state.data(), state.size(), seq));
  }
  llama_memory_seq_rm(mem, seq, -1, -1);
  if (!decoded || state.empty()) {
    return makeError(ErrorCode::kInternal, "llama.cpp could not evaluate the probe token");
  }
  const int32_t nSwa = llama_model_n_swa(model);
  return shapeFromState(state, kind, streams, nSwa > 0 ? static_cast<uint32_t>(nSwa) : 0);
}

}  // namespace

Status PrefixCache::Impl::checkCall(llama_seq_id seq, const llama_token* tokens,
                                    size_t nTokens) const {
  if (std::this_thread::get_id() != owner) {
    return makeError(ErrorCode::kInvalidArgument,
                     "a PrefixCache is used from the thread that opened it");
  }
  if (seq < 0 || static_cast<uint32_t>(seq) >= llama_n_seq_max(ctx) || seq == scratchSeq) {
    return makeError(ErrorCode::kInvalidArgument, "sequence ", seq, " is outside [0, ",
                     llama_n_seq_max(ctx), ") or is the cache's scratch sequence");
  }
  if (nTokens > 0 && tokens == nullptr) {
    return makeError(ErrorCode::kInvalidArgument, "no tokens for ", nTokens, " positions");
  }
  if (scratchSeq >= 0 && llama_memory_seq_pos_max(llama_get_memory(ctx), scratchSeq) >= 0) {
    return makeError(ErrorCode::kInvalidArgument, "the scratch sequence ", scratchSeq,
                     " holds tokens: it is the cache's alone");
  }
  return {};
}

void PrefixCache::Impl::disconnect() {
  space.reset();
  client.reset();
}

bool PrefixCache::Impl::connected() {
  if (space) return true;
  auto now = Clock::now();
  if (lastAttempt != Clock::time_point{} && now - lastAttempt < kReconnectInterval) {
    return false;
  }
  lastAttempt = now;
  ClientOptions co;
  co.socketPath = options.socketPath;
  co.clientName = options.clientName;
  co.threading = ClientThreading::kCallerThread;
  auto c = Client::connect(co);
  if (!c.ok()) return false;
  auto s = c.value()->open(layout);
  if (!s.ok()) return false;
  if (everConnected) ++stats.reconnects;
  everConnected = true;
  client = std::move(c.value());
  space = std::move(s.value());
  return true;
}

void PrefixCache::Impl::noteError(const Error& error) {
  // Only a connection that was there goes: a call refused for want of one must not push the next
  // attempt away (an engine calling without pause would never reconnect).
  if (error.code() == ErrorCode::kUnavailable && space) disconnect();
}

Result<std::unique_ptr<PrefixCache>> PrefixCache::open(llama_context* ctx,
                                                       const CacheOptions& options) {
  if (ctx == nullptr) return makeError(ErrorCode::kInvalidArgument, "no llama_context");
  if (options.blockTokens < kMinBlockTokens || options.blockTokens > kMaxBlockTokens) {
    return makeError(ErrorCode::kInvalidArgument, "blockTokens ", options.blockTokens,
                     " is outside [", kMinBlockTokens, ", ", kMaxBlockTokens, "]");
  }
  if (options.checkpointTokens % options.blockTokens != 0) {
    return makeError(ErrorCode::kInvalidArgument, "checkpointTokens ", options.checkpointTokens,
                     " is not a multiple of blockTokens ", options.blockTokens);
  }
  if (options.modelDigest.empty() && options.modelPath.empty()) {
    return makeError(ErrorCode::kInvalidArgument, "name the model: modelPath or modelDigest");
  }
  const llama_model* model = llama_get_model(ctx);
  const llama_rope_type rope = llama_model_rope_type(model);
  if (llama_model_has_encoder(model) || rope == LLAMA_ROPE_TYPE_MROPE ||
      rope == LLAMA_ROPE_TYPE_IMROPE || rope == LLAMA_ROPE_TYPE_VISION) {
    return makeError(ErrorCode::kNotSupported,
                     "kvtier's llama.cpp integration cannot map encoder-decoder models or M-RoPE "
                     "and vision positions (their cells carry positions a sequence state of "
                     "this format does not)");
  }

  auto impl = std::make_unique<Impl>();
  impl->ctx = ctx;
  impl->options = options;
  impl->owner = std::this_thread::get_id();
  const llama_context_params& cp = options.contextParams;
  // llama.cpp keeps one stream per sequence unless the KV buffer is unified.
  impl->streams = cp.kv_unified ? 1 : llama_n_seq_max(ctx);
  const MemoryKind kind = memoryKindOf(model);
  if (options.scratchSeq >= 0) {
    if (kind != MemoryKind::kKv) {
      return makeError(ErrorCode::kInvalidArgument,
                       "scratchSeq is for plain KV caches; this model's memory is ",
                       memoryKindName(kind));
    }
    if (static_cast<uint32_t>(options.scratchSeq) >= llama_n_seq_max(ctx) || !cp.kv_unified) {
      return makeError(ErrorCode::kInvalidArgument, "scratchSeq ", options.scratchSeq,
                       " needs a unified KV cache (kv_unified) with it below n_seq_max (",
                       llama_n_seq_max(ctx), ")");
    }
    impl->scratchSeq = options.scratchSeq;
  }
  auto memory = kind == MemoryKind::kKv ? plainShape(model, cp, impl->streams)
                                        : probedShape(ctx, kind, impl->streams);
  if (!memory) return memory.error();
  MemoryShape& shape = impl->memory;
  shape = std::move(*memory);
  for (const StateShape& kv : shape.kv) {
    if (kv.nLayer == 0) continue;  // positions only (every layer of it is in another section)
    // The probe's rows must be the ones contextParams says (they name the namespace).
    if (kv.kType != static_cast<int32_t>(cp.type_k) ||
        kv.vType != static_cast<int32_t>(cp.type_v) ||
        kv.vTrans != (cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED)) {
      return makeError(ErrorCode::kInvalidArgument,
                       "the context's K/V state does not match contextParams (K/V types, flash "
                       "attention)");
    }
  }
  const uint32_t bt = options.blockTokens;
  if (shape.windowed() && shape.nSwa < bt) {
    return makeError(ErrorCode::kNotSupported, "a sliding window of ", shape.nSwa,
                     " tokens is shorter than a block of ", bt,
                     ": no block's windowed rows are ever whole (use smaller blocks)");
  }

  // The namespace: the model's identity and every context setting that changes the bytes of K,
  // V or the state (types, arrangement, RoPE overrides, the memory's shape), hashed into the
  // layout's model id.
  std::string digest = options.modelDigest;
  if (digest.empty()) {
    auto d = fileSha256(options.modelPath);
    if (!d.ok()) return d.error();
    digest = d.value();
  }
  const uint64_t kRow = shape.kv.empty() ? 0 : shape.kv.front().kRowBytes;
  const uint64_t vRow = shape.kv.empty() ? 0 : shape.kv.front().vRowBytes;
  const bool vTrans = cp.flash_attn_type == LLAMA_FLASH_ATTN_TYPE_DISABLED;
  char settings[512];
  std::snprintf(settings, sizeof(settings),
                "model=%s;k=%s;v=%s;vtrans=%d;rope_scaling=%d;rope_base=%a;rope_scale=%a;"
                "yarn=%a,%a,%a,%a,%u;rows=%llu,%llu",
                digest.c_str(), ggml_type_name(cp.type_k), ggml_type_name(cp.type_v),
                vTrans ? 1 : 0, static_cast<int>(cp.rope_scaling_type), cp.rope_freq_base,
                cp.rope_freq_scale, cp.yarn_ext_factor, cp.yarn_attn_factor, cp.yarn_beta_fast,
                cp.yarn_beta_slow, cp.yarn_orig_ctx, static_cast<unsigned long long>(kRow),
                static_cast<unsigned long long>(vRow));
  Sha256 sha;
  sha.begin();
  sha.update(settings, std::strlen(settings));
  if (!options.adapters.empty()) {  // (none: the identity a context without adapters always had)
    const std::string adapters = ";adapters=" + options.adapters;
    sha.update(adapters.data(), adapters.size());
  }
  if (shape.kind != MemoryKind::kKv) {  // (plain caches keep the identity they always had)
    std::string memoryId = std::string(";memory=") + memoryKindName(shape.kind) +
                           ";swa=" + std::to_string(shape.nSwa) +
                           ";state=" + std::to_string(shape.stateBytes);
    for (const StateShape& kv : shape.kv) {
      memoryId += ";section=" + std::to_string(kv.nLayer) + "," + std::to_string(kv.kRowBytes) +
                  "," + std::to_string(kv.vRowBytes);
    }
    sha.update(memoryId.data(), memoryId.size());
  }
  auto id = sha.finish();
  const std::string arch = modelMeta(model, "general.architecture");
  Layout& layout = impl->layout;
  layout.modelId = "llama.cpp/" + arch + "/" + ggml_type_name(cp.type_k) + "-" +
                   ggml_type_name(cp.type_v) + (vTrans ? "-vt/" : "/") + hex(id.data(), 20);
  layout.numLayers = shape.kvLayers();
  layout.dtype = DType::kInt8;
  layout.blockTokens = bt;
  layout.stateBytes = shape.stateBytes;
  if (layout.numLayers > 0) {
    const uint32_t nHeadKv = static_cast<uint32_t>(std::max(llama_model_n_head_kv(model), 1));
    if (!slotAsHeads(shape.slotBytes(), nHeadKv, layout.numKvHeads, layout.headDim)) {
      return makeError(ErrorCode::kNotSupported, "a K/V row of ", shape.slotBytes(),
                       " bytes does not fit a kvtier layout");
    }
  }
  if (auto s = layout.validate(); !s.ok()) return s.error();
  impl->map.emplace(shape, layout);

  // prefill()'s chunks: states' spacing for recurrent models (about as many bytes of states as
  // of KV between them), within the window for windowed ones, within a batch.
  uint32_t chunk = options.checkpointTokens;
  if (chunk == 0) {
    chunk = kMaxDefaultCheckpoint;
    if (shape.recurrent() && !layout.hasKv()) chunk = kNoKvCheckpoint;
    if (shape.recurrent() && layout.hasKv()) {
      // Bytes against recomputed tokens: a state every C blocks costs S / C blocks per block of
      // KV (S: a state's whole blocks in the pool), a restore recomputes C / 2 blocks on average;
      // the cost is least at C = sqrt(2 a S / b). Replays of the shared trace put its optimum at
      // C ~ 4 sqrt(S) (docs/llama.md, "The checkpoint spacing").
      const double state =
          static_cast<double>(uint64_t{layout.stateChunks(0)} * layout.chunkBytes()) /
          static_cast<double>(layout.blockBytes());
      const auto blocks = static_cast<uint64_t>(std::llround(4 * std::sqrt(state)));
      chunk = static_cast<uint32_t>(
          std::clamp<uint64_t>(blocks * bt, bt, kMaxDefaultCheckpoint / bt * bt));
    }
  }
  if (shape.windowed()) chunk = std::min(chunk, shape.nSwa / bt * bt);
  const uint32_t batch = llama_n_batch(ctx) / bt * bt;
  if (batch == 0) {
    return makeError(ErrorCode::kInvalidArgument, "the context's n_batch (", llama_n_batch(ctx),
                     ") is smaller than a block of ", bt);
  }
  impl->checkpoint = std::min(chunk, batch);

  // One helper sequence per cache, named apart from every other cache's.
  static std::atomic<uint64_t> caches{0};
  impl->helperSeq = "kvtier-llama/" + std::to_string(::getpid()) + "/" + std::to_string(++caches);
  impl->connected();  // a cache without a daemon misses until one answers
  return std::unique_ptr<PrefixCache>(new PrefixCache(std::move(impl)));
}

PrefixCache::PrefixCache(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PrefixCache::~PrefixCache() = default;

const Layout& PrefixCache::layout() const { return impl_->layout; }
const CacheStats& PrefixCache::stats() const { return impl_->stats; }
const char* PrefixCache::memoryKind() const { return memoryKindName(impl_->memory.kind); }
uint64_t PrefixCache::stateBytes() const { return impl_->memory.stateBytes; }
uint32_t PrefixCache::checkpointTokens() const { return impl_->checkpoint; }

Result<RestoreInfo> PrefixCache::restore(llama_seq_id seq, const llama_token* tokens,
                                         size_t nTokens) {
  Impl& m = *impl_;
  if (auto s = m.checkCall(seq, tokens, nTokens); !s.ok()) return s.error();
  llama_memory_t mem = llama_get_memory(m.ctx);
  if (llama_memory_seq_pos_max(mem, seq) >= 0) {
    return makeError(ErrorCode::kInvalidArgument, "sequence ", seq,
                     " holds tokens: restore into an empty sequence (llama_memory_seq_rm first)");
  }
  ++m.stats.restores;
  RestoreInfo info;
  const uint32_t bt = m.layout.blockTokens;
  // Plain and windowed caches restore whole blocks; a state may sit at any position.
  const size_t asked = m.layout.hasState() ? nTokens : nTokens / bt * bt;
  if (asked == 0 || asked > UINT32_MAX) {
    ++m.stats.restoreMisses;
    return info;
  }
  if (!m.connected()) {
    ++m.stats.restoreMisses;
    info.unavailable = true;
    return info;
  }
  // llama_token is int32_t; kvtier keys tokens as their 4 bytes, the same for both.
  std::span<const uint32_t> keyTokens(reinterpret_cast<const uint32_t*>(tokens), asked);
  Result<ReadHandle> hit = [&] {
    Timed t(m.stats.restoreDaemonNs);
    return m.space->lookup(keyTokens);
  }();
  if (!hit.ok()) {
    m.noteError(hit.error());
    ++m.stats.restoreMisses;
    info.unavailable = hit.code() == ErrorCode::kUnavailable;
    return info;
  }
  const uint64_t cells = hit->matchedTokens();
  const bool shaped =
      m.layout.hasState()
          ? hit->hasState() && hit->blockCount() == (m.layout.hasKv() ? (cells + bt - 1) / bt : 0)
          : hit->blockCount() * bt == cells;
  if (cells == 0 || hit->firstPosition() != 0 || !shaped) {
    ++m.stats.restoreMisses;
    return info;
  }
  // The blocks stay pinned until the copies are done: the bytes copied are the ones looked up.
  const auto r = m.scratchSeq >= 0 ? m.restoreStaged(seq, *hit) : m.restoreWhole(seq, *hit, cells);
  {
    Timed t(m.stats.restoreDaemonNs);
    hit->release();
  }
  if (r.corrupt) ++m.stats.restoreCorrupt;
  if (r.cells == 0 || llama_memory_seq_pos_max(mem, seq) != static_cast<llama_pos>(r.cells) - 1) {
    llama_memory_seq_rm(mem, seq, -1, -1);
    // A damaged block or state is a miss: nothing of it reached llama.cpp.
    if (r.corrupt && !r.failed) {
      ++m.stats.restoreMisses;
    } else {
      ++m.stats.restoreFailures;
    }
    return info;
  }
  info.tokens = static_cast<uint32_t>(r.cells);
  info.bytes = r.cells * m.layout.tokenKvBytes() + m.layout.stateBytes;
  m.stats.restoredTokens += r.cells;
  if (m.layout.hasState()) ++m.stats.statesRestored;
  return info;
}

namespace {
std::atomic<bool> gRestoreChecks{true};  // bench_hooks::setRestoreChecks
}  // namespace

void bench_hooks::setRestoreChecks(bool enabled) { gRestoreChecks = enabled; }

bool PrefixCache::Impl::drainVerified(const StateMap::Build& build, const ReadHandle& hit, size_t b,
                                      uint64_t first, uint32_t slots,
                                      kernels::CopyMethod method) const {
  // Checked against its writer's checksum as it is copied, every byte read once: a byte that
  // changed in the pool never reaches llama.cpp, which would compute on without a word. A block
  // without a checksum (0) is copied as it is.
  const uint64_t want = gRestoreChecks.load(std::memory_order_relaxed) ? hit.sum(b) : 0;
  const uint64_t got = map->drainBlock(build, first, hit.block(b).data(), slots, method, want != 0);
  return got == want;
}

bool PrefixCache::Impl::drainChecked(const StateMap::Build& build, const ReadHandle& hit, size_t b,
                                     uint64_t first, uint32_t slots, kernels::CopyMethod method) {
  if (drainVerified(build, hit, b, first, slots, method)) return true;
  hit.reportCorrupt(b);  // the daemon drops it: the next lookup stops before it
  return false;
}

PrefixCache::Impl::Restored PrefixCache::Impl::restoreWhole(llama_seq_id seq, const ReadHandle& hit,
                                                            uint64_t end) {
  const uint32_t bt = layout.blockTokens;
  const size_t blocks = layout.hasKv() ? (end + bt - 1) / bt : 0;
  const size_t bytes = map->stateBytesAt(0, end);
  std::span<uint8_t> state(scratchOf(bytes), bytes);
  size_t bad = blocks;
  {
    Timed t(stats.restoreCopyNs);
    const StateMap::Build build = map->buildState(state, 0, end, seq);
    const kernels::CopyMethod method = kernels::copyMethod(kernels::CopyDirection::kOutOfPool);
    for (size_t b = 0; b < blocks && bad == blocks; ++b) {
      if (hit.block(b).size() != layout.chunkBytes()) return {.failed = true};
      const uint64_t first = b * uint64_t{bt};
      const auto slots = static_cast<uint32_t>(std::min<uint64_t>(bt, end - first));
      if (!drainChecked(build, hit, b, first, slots, method)) bad = b;
    }
    kernels::copyFence();
    if (bad == blocks && layout.hasState()) {
      if (auto s = hit.copyState(build.recurrent.data(), build.recurrent.size()); !s.ok()) {
        if (s.code() == ErrorCode::kChecksumMismatch) return {.corrupt = true};
        return {.failed = true};
      }
      if (!checkRecurrentSection(build.recurrent, end, memory.stateBytes).ok()) {
        return {.failed = true};
      }
    }
  }
  if (bad < blocks) {
    // A model with a state restores all or nothing; a KV cache the blocks before the bad one.
    if (layout.hasState() || bad == 0) return {.corrupt = true};
    Restored shorter = restoreWhole(seq, hit, bad * uint64_t{bt});
    shorter.corrupt = true;
    return shorter;
  }
  // llama.cpp checks the state against the context (stream count, layers, types, row sizes, V
  // arrangement) and restores nothing from one that does not match.
  Timed t(stats.restoreLlamaNs);
  if (llama_state_seq_set_data(ctx, state.data(), state.size(), seq) != bytes)
    return {.failed = true};
  return {.cells = end};
}

size_t PrefixCache::Impl::buildStep(const ReadHandle& hit, size_t b0, size_t n, uint8_t* buffer,
                                    bool& shapeOk) const {
  const uint32_t bt = layout.blockTokens;
  const uint64_t first = b0 * bt, end = first + n * bt;
  std::span<uint8_t> state(buffer, map->stateBytesAt(first, end));
  const StateMap::Build build = map->buildState(state, first, end, scratchSeq);
  shapeOk = true;
  for (size_t b = 0; b < n; ++b) {
    if (hit.block(b0 + b).size() != layout.blockBytes()) {
      shapeOk = false;
      return b;
    }
    // Read back at once by llama.cpp: a cached copy.
    if (!drainVerified(build, hit, b0 + b, first + b * bt, bt, kernels::CopyMethod::kCached)) {
      return b;
    }
  }
  return n;
}

bool PrefixCache::Impl::loadStep(llama_seq_id seq, const uint8_t* buffer, uint64_t first,
                                 uint64_t end) {
  llama_memory_t mem = llama_get_memory(ctx);
  const size_t bytes = map->stateBytesAt(first, end);
  Timed t(stats.restoreLlamaNs);
  const bool loaded = llama_state_seq_set_data(ctx, buffer, bytes, scratchSeq) == bytes;
  // In a unified KV cache a copy between sequences shares the cells: no bytes move.
  if (loaded) {
    llama_memory_seq_cp(mem, scratchSeq, seq, static_cast<llama_pos>(first),
                        static_cast<llama_pos>(end));
  }
  llama_memory_seq_rm(mem, scratchSeq, -1, -1);
  return loaded;
}

PrefixCache::Impl::Restored PrefixCache::Impl::restoreSteps(llama_seq_id seq, const ReadHandle& hit,
                                                            size_t from) {
  const uint32_t bt = layout.blockTokens;
  const size_t per = stageBlocks();
  Restored done;
  done.cells = from * bt;
  for (size_t b0 = from; b0 < hit.blockCount(); b0 += per) {
    size_t n = std::min(per, hit.blockCount() - b0);
    bool shapeOk = true;
    size_t good;
    {
      Timed t(stats.restoreCopyNs);
      good = buildStep(hit, b0, n, scratchOf(map->stateBytesAt(b0 * bt, (b0 + n) * bt)), shapeOk);
    }
    if (!shapeOk) return {done.cells, done.corrupt, true};
    if (good < n) {
      // The step is built again without the block that failed its check and what follows.
      hit.reportCorrupt(b0 + good);  // the daemon drops it: the next lookup stops before it
      done.corrupt = true;
      if (good == 0) return done;
      n = good;
      {
        Timed t(stats.restoreCopyNs);
        good = buildStep(hit, b0, n, scratchOf(map->stateBytesAt(b0 * bt, (b0 + n) * bt)), shapeOk);
      }
      if (!shapeOk || good < n) return {done.cells, done.corrupt, true};
    }
    const uint64_t first = b0 * bt, end = first + n * bt;
    if (!loadStep(seq, scratch.get(), first, end)) return {done.cells, done.corrupt, true};
    done.cells = end;
    if (done.corrupt) return done;
  }
  return done;
}

PrefixCache::Impl::Restored PrefixCache::Impl::restoreStaged(llama_seq_id seq,
                                                             const ReadHandle& hit) {
  const uint32_t bt = layout.blockTokens;
  const size_t per = stageBlocks();
  const size_t steps = (hit.blockCount() + per - 1) / per;
  if (steps < 2 || !options.pipelineRestores) return restoreSteps(seq, hit, 0);
  // Pipelined: the worker builds step i + 1 (copy out of the pool, checked) while llama.cpp loads
  // step i, in kBuffers buffers that take turns; a caller whose next step is not built yet builds
  // a later one itself. A step whose build failed (a block that fails its check, or a hit of
  // another shape) ends the pipeline; the steps after the last one loaded go the sequential way,
  // which reports the damaged block and loads what comes before it.
  constexpr size_t kBuffers = 3;
  const size_t stepBytes = map->stateBytesAt(0, per * uint64_t{bt});
  uint8_t* const buffers = scratchOf(kBuffers * stepBytes);
  struct Built {
    size_t good = 0;
    bool shapeOk = true;
  };
  std::vector<Built> built(steps);
  if (!worker) worker = std::make_unique<StageWorker>();
  worker->start(
      steps,
      [&](size_t i) {
        const size_t b0 = i * per, n = std::min(per, hit.blockCount() - b0);
        built[i].good = buildStep(hit, b0, n, buffers + i % kBuffers * stepBytes, built[i].shapeOk);
      },
      /*lead=*/kBuffers);
  StageRun run(*worker);
  Restored done;
  for (size_t i = 0; i < steps; ++i) {
    {
      Timed t(stats.restoreCopyNs);  // the time the restore waits for the copies
      while (!worker->filled(i) && worker->fillNext()) {
      }
      worker->await(i);
    }
    const size_t b0 = i * per, n = std::min(per, hit.blockCount() - b0);
    if (!built[i].shapeOk || built[i].good < n) {
      worker->finish();
      Restored rest = restoreSteps(seq, hit, b0);
      rest.corrupt = rest.corrupt || done.corrupt;
      return rest;
    }
    const uint64_t first = b0 * bt, end = first + n * bt;
    const bool loaded = loadStep(seq, buffers + i % kBuffers * stepBytes, first, end);
    worker->release(i);
    if (!loaded) return {done.cells, done.corrupt, true};
    done.cells = end;
  }
  return done;
}

}  // namespace kvtier::llama
