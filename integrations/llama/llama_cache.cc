// kvtier::llama::PrefixCache: llama.cpp's sequence state <-> kvtier blocks.
//
// One translation, both ways. A kvtier block of this integration's layout holds, for each layer,
// the K of its blockTokens positions (one llama.cpp K row each, slot after slot) and then their V
// (rows likewise, or with V transposed the n_embd_v columns of blockTokens elements each):
// exactly the rows llama.cpp's state writer emits for those cells, so a store is a scatter of the
// state's rows into blocks and a restore a gather of blocks into a state, each one copy.
#include "kvtier/llama.h"

#include <ggml.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>
#include <vector>

#include "integrations/llama/seq_state.h"
#include "kernels/block_copy.h"
#include "kvtier/block_key.h"

namespace kvtier::llama {
namespace {

using Clock = std::chrono::steady_clock;
// After the daemon went away, how often a call may try to connect again.
constexpr auto kReconnectInterval = std::chrono::seconds(1);
// Adds the nanoseconds of its scope to a counter (CacheStats' time split).
class Timed {
 public:
  explicit Timed(uint64_t& counter) : counter_(counter), start_(Clock::now()) {}
  ~Timed() {
    counter_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count());
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  uint64_t& counter_;
  Clock::time_point start_;
};

// With a scratch sequence, the state of one staged step: small enough to stay in a core's L2
// cache between llama.cpp's copy and kvtier's, so that the KV crosses memory once.
constexpr size_t kStageBytes = 1 << 20;

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

}  // namespace

struct PrefixCache::Impl {
  llama_context* ctx = nullptr;
  CacheOptions options;
  Layout layout;
  StateShape shape;
  uint64_t slotBytes = 0;  // bytes of one position's K (or V) in one layer of a block
  uint32_t streams = 1;
  llama_seq_id scratchSeq = -1;  // CacheOptions::scratchSeq
  std::thread::id owner;

  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;  // borrows client: declared after it, destroyed before it
  Clock::time_point lastAttempt{};  // of a connection, or when the daemon went away
  bool everConnected = false;
  std::string helperSeq;  // the sequence stores write through (storeImpl)
  CacheStats stats;

  // The state buffer, kept across calls so that a restore or store in steady state touches no
  // fresh pages (make_unique_for_overwrite: not zeroed, every byte is written before use).
  std::unique_ptr<uint8_t[]> scratch;
  size_t scratchBytes = 0;
  std::vector<uint32_t> rowScratch;

  uint8_t* scratchOf(size_t bytes) {
    if (bytes > scratchBytes) {
      scratch = std::make_unique_for_overwrite<uint8_t[]>(bytes);
      scratchBytes = bytes;
    }
    return scratch.get();
  }

  // The checks every call makes first; nothing has changed when one fails.
  Status checkCall(llama_seq_id seq, const llama_token* tokens, size_t nTokens) const {
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

  // Blocks per staged step: as many as keep the step's state within kStageBytes (at least one).
  size_t stageBlocks() const {
    return std::max<size_t>(1, kStageBytes / layout.blockBytes());
  }

  void disconnect() {
    space.reset();
    client.reset();
    lastAttempt = Clock::now();
  }

  // Connects (again) when there is no connection and the last try is old enough.
  bool connected() {
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

  // A result's error that means the daemon is gone drops the connection.
  void noteError(const Error& error) {
    if (error.code() == ErrorCode::kUnavailable) disconnect();
  }

  // Copies block `b` of `cells` state cells (rows `rows[0..blockTokens)` of the state) into a
  // block's bytes.
  void fillBlock(uint8_t* dst, const SeqStateView& view, const uint32_t* rows) const {
    const uint32_t bt = layout.blockTokens;
    bool consecutive = true;
    for (uint32_t s = 1; s < bt; ++s) consecutive = consecutive && rows[s] == rows[0] + s;
    for (uint32_t l = 0; l < shape.nLayer; ++l) {
      uint8_t* k = dst + layout.slotOffset(l, 0, 0);
      uint8_t* v = dst + layout.slotOffset(l, 1, 0);
      if (consecutive && slotBytes == shape.kRowBytes) {
        kernels::copyBytes(k, view.k[l] + rows[0] * shape.kRowBytes, bt * shape.kRowBytes,
                           kernels::CopyDirection::kIntoPool);
      } else {
        for (uint32_t s = 0; s < bt; ++s) {
          std::memcpy(k + s * slotBytes, view.k[l] + rows[s] * shape.kRowBytes, shape.kRowBytes);
        }
      }
      if (shape.vTrans) {
        const uint32_t el = shape.vElemBytes;
        for (uint32_t j = 0; j < shape.nEmbdV; ++j) {
          const uint8_t* col = view.v[l] + uint64_t{j} * view.cellCount * el;
          uint8_t* out = v + uint64_t{j} * bt * el;
          if (consecutive) {
            std::memcpy(out, col + rows[0] * el, bt * el);
          } else {
            for (uint32_t s = 0; s < bt; ++s) std::memcpy(out + s * el, col + rows[s] * el, el);
          }
        }
      } else if (consecutive && slotBytes == shape.vRowBytes) {
        kernels::copyBytes(v, view.v[l] + rows[0] * shape.vRowBytes, bt * shape.vRowBytes,
                           kernels::CopyDirection::kIntoPool);
      } else {
        for (uint32_t s = 0; s < bt; ++s) {
          std::memcpy(v + s * slotBytes, view.v[l] + rows[s] * shape.vRowBytes, shape.vRowBytes);
        }
      }
    }
  }

  // Copies a block's bytes into the state built by buildSeqState for `cells` cells, as its
  // block number `b` (positions [b * blockTokens, ...)). `stream`: with the pool's outbound
  // copy method (streaming stores where this machine measured them faster), for a state too
  // large to stay in the CPU's cache; else memcpy, which leaves a staged state there.
  void drainBlock(const SeqStateSlots& slots, uint32_t cells, uint32_t b, const uint8_t* src,
                  bool stream) const {
    auto copy = [stream](uint8_t* dst, const uint8_t* from, size_t n) {
      if (stream) {
        kernels::copyBytes(dst, from, n, kernels::CopyDirection::kOutOfPool);
      } else {
        std::memcpy(dst, from, n);
      }
    };
    const uint32_t bt = layout.blockTokens;
    const uint64_t first = uint64_t{b} * bt;
    for (uint32_t l = 0; l < shape.nLayer; ++l) {
      const uint8_t* k = src + layout.slotOffset(l, 0, 0);
      const uint8_t* v = src + layout.slotOffset(l, 1, 0);
      uint8_t* kOut = slots.k[l] + first * shape.kRowBytes;
      if (slotBytes == shape.kRowBytes) {
        copy(kOut, k, bt * shape.kRowBytes);
      } else {
        for (uint32_t s = 0; s < bt; ++s) {
          std::memcpy(kOut + s * shape.kRowBytes, k + s * slotBytes, shape.kRowBytes);
        }
      }
      if (shape.vTrans) {
        const uint32_t el = shape.vElemBytes;
        for (uint32_t j = 0; j < shape.nEmbdV; ++j) {
          std::memcpy(slots.v[l] + (uint64_t{j} * cells + first) * el, v + uint64_t{j} * bt * el,
                      bt * el);
        }
      } else if (slotBytes == shape.vRowBytes) {
        copy(slots.v[l] + first * shape.vRowBytes, v, bt * shape.vRowBytes);
      } else {
        for (uint32_t s = 0; s < bt; ++s) {
          std::memcpy(slots.v[l] + (first + s) * shape.vRowBytes, v + s * slotBytes,
                      shape.vRowBytes);
        }
      }
    }
  }

  bool restoreWhole(llama_seq_id seq, const ReadHandle& hit);
  bool restoreStaged(llama_seq_id seq, const ReadHandle& hit);
  // Writes blocks [firstBlock, firstBlock + nBlocks) of `w`, positions from firstPos on, from a
  // state llama.cpp wrote.
  Status fillFromState(WriteHandle& w, size_t firstBlock, size_t nBlocks,
                       std::span<const uint8_t> state, uint64_t firstPos);
  Result<StoreInfo> storeImpl(llama_seq_id seq, const llama_token* tokens, size_t nTokens);
};

Result<std::unique_ptr<PrefixCache>> PrefixCache::open(llama_context* ctx,
                                                        const CacheOptions& options) {
  if (ctx == nullptr) return makeError(ErrorCode::kInvalidArgument, "no llama_context");
  if (options.blockTokens < kMinBlockTokens || options.blockTokens > kMaxBlockTokens) {
    return makeError(ErrorCode::kInvalidArgument, "blockTokens ", options.blockTokens,
                     " is outside [", kMinBlockTokens, ", ", kMaxBlockTokens, "]");
  }
  if (options.modelDigest.empty() && options.modelPath.empty()) {
    return makeError(ErrorCode::kInvalidArgument, "name the model: modelPath or modelDigest");
  }
  const llama_model* model = llama_get_model(ctx);
  const llama_rope_type rope = llama_model_rope_type(model);
  if (llama_model_n_swa(model) > 0 || llama_model_is_recurrent(model) ||
      llama_model_is_hybrid(model) || llama_model_has_encoder(model) ||
      rope == LLAMA_ROPE_TYPE_MROPE || rope == LLAMA_ROPE_TYPE_IMROPE ||
      rope == LLAMA_ROPE_TYPE_VISION) {
    return makeError(ErrorCode::kNotSupported,
                     "kvtier's llama.cpp integration maps models whose memory is the plain KV "
                     "cache (no sliding window, recurrent, hybrid, encoder or M-RoPE models)");
  }

  auto impl = std::make_unique<Impl>();
  impl->ctx = ctx;
  impl->options = options;
  impl->owner = std::this_thread::get_id();
  const llama_context_params& cp = options.contextParams;

  // The shape of one layer's K and V rows in this context's state, from the model's dimensions
  // and the context's K/V types (store() checks it against the state the engine really writes).
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
  StateShape& shape = impl->shape;
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
  impl->slotBytes = std::max(shape.kRowBytes, shape.vRowBytes);
  // llama.cpp keeps one stream per sequence unless the KV buffer is unified.
  impl->streams = cp.kv_unified ? 1 : llama_n_seq_max(ctx);
  if (options.scratchSeq >= 0) {
    if (static_cast<uint32_t>(options.scratchSeq) >= llama_n_seq_max(ctx) || !cp.kv_unified) {
      return makeError(ErrorCode::kInvalidArgument, "scratchSeq ", options.scratchSeq,
                       " needs a unified KV cache (kv_unified) with it below n_seq_max (",
                       llama_n_seq_max(ctx), ")");
    }
    impl->scratchSeq = options.scratchSeq;
  }

  // The namespace: the model's identity and every context setting that changes the bytes of K
  // or V (types, arrangement, RoPE overrides), hashed into the layout's model id.
  std::string digest = options.modelDigest;
  if (digest.empty()) {
    auto d = fileSha256(options.modelPath);
    if (!d.ok()) return d.error();
    digest = d.value();
  }
  char settings[512];
  std::snprintf(settings, sizeof(settings),
                "model=%s;k=%s;v=%s;vtrans=%d;rope_scaling=%d;rope_base=%a;rope_scale=%a;"
                "yarn=%a,%a,%a,%a,%u;rows=%llu,%llu",
                digest.c_str(), ggml_type_name(cp.type_k), ggml_type_name(cp.type_v),
                shape.vTrans ? 1 : 0, static_cast<int>(cp.rope_scaling_type),
                cp.rope_freq_base, cp.rope_freq_scale, cp.yarn_ext_factor, cp.yarn_attn_factor,
                cp.yarn_beta_fast, cp.yarn_beta_slow, cp.yarn_orig_ctx,
                static_cast<unsigned long long>(shape.kRowBytes),
                static_cast<unsigned long long>(shape.vRowBytes));
  Sha256 sha;
  sha.begin();
  sha.update(settings, std::strlen(settings));
  if (!options.adapters.empty()) {  // (none: the identity a context without adapters always had)
    const std::string adapters = ";adapters=" + options.adapters;
    sha.update(adapters.data(), adapters.size());
  }
  auto id = sha.finish();
  Layout& layout = impl->layout;
  layout.modelId = "llama.cpp/" + arch + "/" + ggml_type_name(cp.type_k) + "-" +
                   ggml_type_name(cp.type_v) + (shape.vTrans ? "-vt/" : "/") + hex(id.data(), 20);
  layout.numLayers = nLayer;
  layout.dtype = DType::kInt8;
  layout.blockTokens = options.blockTokens;
  if (!slotAsHeads(impl->slotBytes, nHeadKv, layout.numKvHeads, layout.headDim)) {
    return makeError(ErrorCode::kNotSupported, "a K/V row of ", impl->slotBytes,
                     " bytes does not fit a kvtier layout");
  }
  if (auto s = layout.validate(); !s.ok()) return s.error();

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
  const size_t whole = nTokens / bt * bt;
  if (whole == 0 || whole > UINT32_MAX) {
    ++m.stats.restoreMisses;
    return info;
  }
  if (!m.connected()) {
    ++m.stats.restoreMisses;
    info.unavailable = true;
    return info;
  }
  // llama_token is int32_t; kvtier keys tokens as their 4 bytes, the same for both.
  std::span<const uint32_t> keyTokens(reinterpret_cast<const uint32_t*>(tokens), whole);
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
  const uint32_t cells = static_cast<uint32_t>(hit->matchedTokens());
  if (cells == 0 || hit->firstPosition() != 0 || hit->blockCount() * bt != cells) {
    ++m.stats.restoreMisses;
    return info;
  }
  // The blocks stay pinned until the copies are done: the bytes copied are the ones looked up.
  const bool restored = m.scratchSeq >= 0 ? m.restoreStaged(seq, *hit) : m.restoreWhole(seq, *hit);
  {
    Timed t(m.stats.restoreDaemonNs);
    hit->release();
  }
  if (!restored || llama_memory_seq_pos_max(mem, seq) != static_cast<llama_pos>(cells) - 1) {
    llama_memory_seq_rm(mem, seq, -1, -1);
    ++m.stats.restoreFailures;
    return info;
  }
  info.tokens = cells;
  info.bytes = uint64_t{cells} * m.layout.tokenKvBytes();
  m.stats.restoredTokens += cells;
  return info;
}

bool PrefixCache::Impl::restoreWhole(llama_seq_id seq, const ReadHandle& hit) {
  const uint32_t cells = static_cast<uint32_t>(hit.matchedTokens());
  const size_t bytes = seqStateBytes(shape, cells, streams);
  std::span<uint8_t> state(scratchOf(bytes), bytes);
  {
    Timed t(stats.restoreCopyNs);
    SeqStateSlots slots = buildSeqState(state, shape, cells, streams, seq);
    for (uint32_t b = 0; b < hit.blockCount(); ++b) {
      if (hit.block(b).size() != layout.blockBytes()) return false;
      drainBlock(slots, cells, b, hit.block(b).data(), true);
    }
    kernels::copyFence();
  }
  // llama.cpp checks the state against the context (stream count, layers, types, row sizes, V
  // arrangement) and restores nothing from one that does not match.
  Timed t(stats.restoreLlamaNs);
  return llama_state_seq_set_data(ctx, state.data(), state.size(), seq) == bytes;
}

bool PrefixCache::Impl::restoreStaged(llama_seq_id seq, const ReadHandle& hit) {
  llama_memory_t mem = llama_get_memory(ctx);
  const uint32_t bt = layout.blockTokens;
  const size_t per = stageBlocks();
  for (size_t b0 = 0; b0 < hit.blockCount(); b0 += per) {
    const size_t n = std::min(per, hit.blockCount() - b0);
    const uint32_t cells = static_cast<uint32_t>(n * bt);
    const auto first = static_cast<llama_pos>(b0 * bt);
    const size_t bytes = seqStateBytes(shape, cells, streams);
    std::span<uint8_t> state(scratchOf(bytes), bytes);
    {
      Timed t(stats.restoreCopyNs);
      SeqStateSlots slots = buildSeqState(state, shape, cells, streams, scratchSeq, first);
      for (size_t b = 0; b < n; ++b) {
        if (hit.block(b0 + b).size() != layout.blockBytes()) return false;
        drainBlock(slots, cells, static_cast<uint32_t>(b), hit.block(b0 + b).data(), false);
      }
    }
    Timed t(stats.restoreLlamaNs);
    const bool loaded =
        llama_state_seq_set_data(ctx, state.data(), state.size(), scratchSeq) == bytes;
    // In a unified KV cache a copy between sequences shares the cells: no bytes move.
    if (loaded) {
      llama_memory_seq_cp(mem, scratchSeq, seq, first, first + static_cast<llama_pos>(cells));
    }
    llama_memory_seq_rm(mem, scratchSeq, -1, -1);
    if (!loaded) return false;
  }
  return true;
}

Result<StoreInfo> PrefixCache::store(llama_seq_id seq, const llama_token* tokens,
                                     size_t nTokens) {
  Impl& m = *impl_;
  if (auto s = m.checkCall(seq, tokens, nTokens); !s.ok()) return s.error();
  auto r = m.storeImpl(seq, tokens, nTokens);
  if (r.ok()) {
    ++m.stats.stores;
    m.stats.storedTokens += r->storedTokens;
  } else {
    ++m.stats.storeFailures;
    m.noteError(r.error());
  }
  return r;
}

Status PrefixCache::Impl::fillFromState(WriteHandle& w, size_t firstBlock, size_t nBlocks,
                                        std::span<const uint8_t> state, uint64_t firstPos) {
  auto view = parseSeqState(state, streams);
  if (!view.ok()) return view.error();
  if (!(view->shape == shape)) {
    return makeError(ErrorCode::kInvalidArgument,
                     "the context's K/V state does not match the settings the cache was opened "
                     "with (contextParams: K/V types, flash attention)");
  }
  // Which state row holds each position to store: every one exactly once.
  const uint32_t bt = layout.blockTokens;
  const uint64_t end = firstPos + nBlocks * bt;
  std::vector<uint32_t>& rows = rowScratch;
  rows.assign(nBlocks * bt, UINT32_MAX);
  for (uint32_t i = 0; i < view->cellCount; ++i) {
    const int64_t p = view->positions[i];
    if (p < static_cast<int64_t>(firstPos) || p >= static_cast<int64_t>(end)) continue;
    uint32_t& row = rows[p - firstPos];
    if (row != UINT32_MAX) {
      return makeError(ErrorCode::kInvalidArgument, "position ", p, " is held twice");
    }
    row = i;
  }
  if (std::find(rows.begin(), rows.end(), UINT32_MAX) != rows.end()) {
    return makeError(ErrorCode::kInvalidArgument, "the sequence lacks a position in [", firstPos,
                     ", ", end, ")");
  }
  for (size_t b = 0; b < nBlocks; ++b) {
    std::span<uint8_t> dst = w.block(firstBlock + b);
    if (!dst.empty()) {
      fillBlock(dst.data(), *view, rows.data() + b * bt);
      continue;
    }
    // A client that cannot map the pool sends the block's bytes inline.
    std::vector<uint8_t> bytes(layout.blockBytes());
    fillBlock(bytes.data(), *view, rows.data() + b * bt);
    const uint64_t from = firstPos + b * bt;
    if (auto s = w.write(from, from + bt, bytes.data(), bytes.size()); !s.ok()) return s.error();
  }
  return {};
}

Result<StoreInfo> PrefixCache::Impl::storeImpl(llama_seq_id seq, const llama_token* tokens,
                                               size_t nTokens) {
  StoreInfo info;
  const uint32_t bt = layout.blockTokens;
  const size_t whole = nTokens / bt * bt;
  if (whole == 0) return info;
  if (whole > UINT32_MAX) return makeError(ErrorCode::kInvalidArgument, "too many tokens");
  llama_memory_t mem = llama_get_memory(ctx);
  if (llama_memory_seq_pos_min(mem, seq) != 0 ||
      llama_memory_seq_pos_max(mem, seq) < static_cast<llama_pos>(nTokens) - 1) {
    return makeError(ErrorCode::kInvalidArgument, "sequence ", seq, " does not hold positions [0, ",
                     nTokens, ")");
  }
  if (!connected()) return makeError(ErrorCode::kUnavailable, "kvtierd is not reachable");

  // Which leading blocks kvtier holds already: a lookup over the fast lane, no sequence bound.
  std::span<const uint32_t> keyTokens(reinterpret_cast<const uint32_t*>(tokens), whole);
  uint32_t cached = 0;
  {
    Timed t(stats.storeDaemonNs);
    auto probe = space->lookup(keyTokens);
    if (!probe.ok()) return probe.error();
    cached = static_cast<uint32_t>(probe->matchedTokens());
  }
  info.cachedTokens = cached;
  if (cached >= whole) return info;
  // The blocks are written through this cache's helper sequence, whose sealed blocks stay cached
  // after it moves on: each store replaces its contents, so it holds the last stored prompt only.
  // When part of the prompt is cached, that part is bound to it first, so that it stays while the
  // rest is written after it and is not written again; a new prompt is written whole.
  const std::string& name = helperSeq;
  if (cached > 0) {
    LookupOptions bind;
    bind.bindSeq = name;
    bind.remote = RemoteMode::kLocal;
    Timed t(stats.storeDaemonNs);
    auto held = space->lookup(keyTokens, bind);
    if (!held.ok()) return held.error();
    cached = static_cast<uint32_t>(held->matchedTokens());
    info.cachedTokens = cached;
    if (cached >= whole) return info;
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
  if (scratchSeq < 0) {
    // The whole sequence's state, as llama.cpp writes it (one copy out of the KV tensors).
    size_t got = 0;
    {
      Timed t(stats.storeLlamaNs);
      const size_t size = llama_state_seq_get_size(ctx, seq);
      if (size == 0) return makeError(ErrorCode::kInternal, "llama.cpp wrote no state");
      got = llama_state_seq_get_data(ctx, scratchOf(size), size, seq);
    }
    Timed t(stats.storeCopyNs);
    if (auto s = fillFromState(w, 0, blocks, {scratch.get(), got}, cached); !s.ok()) {
      return s.error();
    }
  } else {
    // A few blocks at a time through the scratch sequence, whose state stays in the cache.
    const size_t per = stageBlocks();
    for (size_t b0 = 0; b0 < blocks; b0 += per) {
      const size_t n = std::min(per, blocks - b0);
      const auto first = static_cast<llama_pos>(cached + b0 * bt);
      const auto cells = static_cast<uint32_t>(n * bt);
      const size_t size = seqStateBytes(shape, cells, streams);
      size_t got = 0;
      {
        Timed t(stats.storeLlamaNs);
        llama_memory_seq_cp(mem, seq, scratchSeq, first, first + static_cast<llama_pos>(cells));
        got = llama_state_seq_get_data(ctx, scratchOf(size), size, scratchSeq);
        llama_memory_seq_rm(mem, scratchSeq, -1, -1);
      }
      if (got != size) {
        return makeError(ErrorCode::kInvalidArgument, "sequence ", seq, " holds positions [",
                         first, ", ", first + static_cast<llama_pos>(cells), ") more than once");
      }
      Timed t(stats.storeCopyNs);
      if (auto s = fillFromState(w, b0, n, {scratch.get(), got}, static_cast<uint64_t>(first));
          !s.ok()) {
        return s.error();
      }
    }
  }
  kernels::copyFence();  // the streaming stores into the pool land before the commit
  Timed t(stats.storeDaemonNs);
  auto commit = w.commit();
  if (!commit.ok()) return commit.error();
  info.storedTokens = static_cast<uint32_t>(whole - cached);
  info.bytes = uint64_t{info.storedTokens} * layout.tokenKvBytes();
  return info;
}

}  // namespace kvtier::llama
