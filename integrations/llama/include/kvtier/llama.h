// kvtier for llama.cpp: a llama_context's sequences restored from, and stored to, kvtier.
//
//   kvtier::llama::CacheOptions opts;
//   opts.socketPath = "kvtier-data/kvtierd.sock";
//   opts.modelPath = "model.gguf";           // its bytes name the model: other weights never hit
//   opts.contextParams = cparams;            // what the context was made with
//   auto cache = kvtier::llama::PrefixCache::open(ctx, opts).value();
//
//   // A new request on sequence 0: bring back what any process already computed ...
//   uint32_t have = cache->restore(0, prompt.data(), prompt.size() - 1).value().tokens;
//   // ... evaluate prompt[have:] as usual (llama_decode), then hand the KV to kvtier:
//   cache->store(0, prompt.data(), prompt.size());
//
// What it moves: the K and V rows of whole blocks of `blockTokens` positions, read and written
// through llama.cpp's own sequence state API (llama_state_seq_get_data / set_data) and laid out
// in kvtier blocks of a Layout derived from the model and the context: layers, K and V row
// bytes, K and V types, V transposed (flash attention off) or not. Keys are kvtier's chained
// SHA-256 token keys inside a namespace whose model id names the weights and tokenizer (a SHA-256
// of the GGUF file's bytes, or a digest the caller gives) and every context setting that changes
// K or V; other weights, another tokenizer or other settings miss, never share KV.
//
// Exactness: a restored prefix holds the very bytes the storing process computed, so the
// engine's logits after it are bit-for-bit those of a recompute with the same batch split. With
// flash attention, llama.cpp's K and V of a position depend on where the batches before it began
// (up to ~5e-3 in the logits), not on the tokens after it in its batch: a prefix evaluated in one
// batch, with or without more tokens after it, restores exactly what a recompute of that prefix
// in one batch computes.
//
// Threads: no hidden threads. A PrefixCache is used from the thread that opened it (the one that
// drives the llama_context, as llama.cpp expects); other threads get INVALID_ARGUMENT.
//
// When the daemon is gone (never started, restarted, killed): restore() answers 0 tokens and the
// engine computes as on a miss; store() fails with UNAVAILABLE and changes nothing in the
// context. The cache reconnects by itself on a later call (at most once a second).
//
// Supported memories (docs/llama.md): llama.cpp's plain KV cache (llama, mistral, qwen2, ...), its
// interleaved sliding-window cache (gemma2/3, gpt-oss, cohere2, ...), recurrent memories (mamba,
// mamba2, rwkv, ...) and hybrids of attention and recurrent layers (lfm2, granite-hybrid, jamba,
// nemotron-h, qwen3-next, ..., with or without a window). open() says NOT_SUPPORTED for what a
// sequence state cannot carry: M-RoPE and vision positions, encoder-decoder models.
//
// Windowed and recurrent models: the rows of a windowed layer, and a recurrent layer's state,
// exist only while the sequence is at the position they belong to, so they are stored as the
// prompt is evaluated: prefill() evaluates it in chunks that end where kvtier stores (blocks,
// and for recurrent models a state every checkpointTokens), and store() at the end of a turn
// keeps the state there, so that the next turn restores the whole conversation so far:
//
//   uint32_t have = cache->restore(0, prompt.data(), prompt.size() - 1).value().tokens;
//   cache->prefill(0, prompt.data(), prompt.size(), have);    // evaluate the rest, storing
//   ... decode the answer, appending it to `prompt` ...
//   cache->store(0, prompt.data(), prompt.size());            // the turn's end, state included
//
// A restore of a recurrent or hybrid model brings back the KV and the state of one position,
// together or not at all (llama.cpp cannot tell a state that belongs to other KV).
#pragma once

#include <llama.h>

#include <cstdint>
#include <memory>
#include <string>

#include "kvtier/client.h"
#include "kvtier/error.h"
#include "kvtier/layout.h"

namespace kvtier::llama {

struct CacheOptions {
  std::string socketPath = "kvtier-data/kvtierd.sock";
  std::string clientName = "kvtier-llama";
  // The model's identity: `modelDigest` when given (any stable digest of the weights and
  // tokenizer, e.g. the sha256 a model registry names its blob by), else the SHA-256 of the GGUF
  // file at `modelPath` (read once at open: about a second per 2 GB).
  std::string modelPath;
  std::string modelDigest;
  // Everything else that changes the model's weights for this context: each LoRA adapter
  // (llama_set_adapters_lora) and control vector (llama_set_adapter_cvec) it applies, named by a
  // stable digest of the adapter and its scale, e.g. "lora:<sha256>@0.5;cvec:<sha256>@1-32".
  // Part of the identity: another list, or none, never shares KV with this one. llama.cpp has no
  // call to read a context's adapters back, so a context that applies any must name them here.
  std::string adapters;
  // The parameters the context was created with: K and V types, flash attention, RoPE overrides.
  // Flash attention AUTO is taken as enabled (as llama.cpp resolves it on the CPU); a context
  // that resolved otherwise fails store() with INVALID_ARGUMENT and misses on restore().
  llama_context_params contextParams = llama_context_default_params();
  // Tokens per kvtier block (kvtier allows 16..512): the granularity of reuse. A restore brings
  // back whole blocks, so a prompt's partial last block is evaluated again (half a block on
  // average); every block costs the daemon a little work per lookup and store, and with blocks
  // of 64 a 4k-token store runs ~10% faster than with 32 (docs/llama.md).
  uint32_t blockTokens = 64;
  // A sequence id the engine leaves to the cache (-1: none). llama.cpp's state API moves a whole
  // sequence at once, so without one the KV crosses memory twice per restore or store (engine
  // <-> a state buffer as large as the prefix <-> kvtier's pool). With one, in a unified KV cache
  // (contextParams.kv_unified, scratchSeq < n_seq_max), it moves a few blocks at a time through
  // this sequence, whose cells a unified cache shares with the target's without copying: the
  // state buffer stays in the CPU's cache and the KV crosses memory once. The engine must never
  // use this sequence (calls fail with INVALID_ARGUMENT while it holds tokens).
  llama_seq_id scratchSeq = -1;
  // With a scratch sequence: a restore of more than one step copies (and checks) the next steps
  // out of the pool on a second thread of the cache's while llama.cpp loads this one (the calling
  // thread builds one too when it would otherwise wait), so that the restore costs about
  // llama.cpp's own load rather than the load plus kvtier's copy; a store
  // scatters a step into the pool there while llama.cpp writes the next one. The thread runs only
  // during restores and stores (the engine waits for them); false: one thread.
  bool pipelineRestores = true;
  // Recurrent and hybrid models: prefill() stores a state every this many tokens (a multiple of
  // blockTokens; 0: the default, 4 sqrt(S) blocks for a state of S blocks in the pool, within
  // [blockTokens, 2048] — measured the best trade of bytes against recomputed tokens on the shared
  // trace; 512 for a model without KV). A restore recomputes at most this many tokens of a cached
  // prompt; the cache keeps one state per this many tokens (docs/llama.md).
  uint32_t checkpointTokens = 0;
};

struct RestoreInfo {
  // Positions [0, tokens) of the sequence now hold the cached KV (and state); a multiple of
  // blockTokens, or for a recurrent model any position where a state was stored.
  uint32_t tokens = 0;
  uint64_t bytes = 0;        // KV and state bytes restored
  bool unavailable = false;  // 0 tokens because the daemon could not be reached
};

struct StoreInfo {
  uint32_t storedTokens = 0;  // tokens whose blocks this call wrote
  uint32_t cachedTokens = 0;  // leading tokens kvtier already held (not written again)
  uint64_t bytes = 0;         // KV (and state) bytes written
  bool state = false;         // a recurrent model's state at the end was stored
};

struct PrefillInfo {
  uint32_t evaluatedTokens = 0;  // tokens evaluated (llama_decode)
  uint32_t storedTokens = 0;     // tokens whose blocks were written to kvtier
  uint32_t states = 0;           // states stored
  uint32_t chunks = 0;           // llama_decode calls
  bool storeFailed = false;      // a store failed (the daemon gone, full): evaluation went on
};

// Counters of this cache since open().
struct CacheStats {
  uint64_t restores = 0, restoredTokens = 0, restoreMisses = 0, restoreFailures = 0;
  uint64_t stores = 0, storedTokens = 0, storeFailures = 0;
  uint64_t reconnects = 0;
  uint64_t statesStored = 0, statesRestored = 0;
  // Restores refused because a block or state failed its check against its writer's checksum.
  uint64_t restoreCorrupt = 0;
  // Where the time of restores and stores went, in nanoseconds: kvtier's calls to the daemon
  // (lookups; a store's bind, grant, commit and unbind), kvtier's copies between the pool and
  // llama.cpp's state, and llama.cpp's state calls (their copies into or out of the KV cache and
  // their bookkeeping).
  uint64_t restoreDaemonNs = 0, restoreCopyNs = 0, restoreLlamaNs = 0;
  uint64_t storeDaemonNs = 0, storeCopyNs = 0, storeLlamaNs = 0;
};

class PrefixCache {
 public:
  // Connects to kvtierd and opens the namespace of ctx's model and settings. Borrows ctx, which
  // must outlive the cache. INVALID_ARGUMENT for bad options, NOT_SUPPORTED for a model kind the
  // integration cannot map (see above), UNAVAILABLE when no daemon answers (a cache is still
  // returned: it misses until the daemon is back).
  static Result<std::unique_ptr<PrefixCache>> open(llama_context* ctx, const CacheOptions& options);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // Restores into `seq`, which must hold no tokens, the longest prefix of tokens[0, n_tokens)
  // that kvtier holds whole: whole blocks (plain and windowed models), or the deepest position
  // with a state and the blocks before it (recurrent and hybrid models). The rest is the engine's
  // to evaluate (pass all but the last token when the logits of the prompt's last token are
  // wanted). The blocks stay pinned while they are copied, so an eviction cannot change them
  // under the copy; a state is checked against its writer's checksum before llama.cpp sees it.
  // Errors (nothing changed): INVALID_ARGUMENT for a seq out of range or holding tokens, a call
  // from another thread. A miss, an unreachable daemon or a state llama.cpp refuses are 0 tokens.
  Result<RestoreInfo> restore(llama_seq_id seq, const llama_token* tokens, size_t n_tokens);

  // Evaluates tokens[from, n_tokens) into `seq`, which holds exactly positions [0, from), with
  // llama_decode in chunks that end at multiples of the cache's chunk size (checkpointTokens for
  // recurrent models, at most the window for windowed ones, at most the context's n_batch) and
  // at n_tokens, and stores after each chunk: the blocks completed (and for recurrent models the
  // state, at checkpoints). The logits of the last token are computed. A recompute that gives
  // bit-identical logits to a restored prefix splits its batches at the same positions. A store
  // that fails (daemon gone, kvtier full) does not stop the evaluation (storeFailed).
  // Errors: INVALID_ARGUMENT (seq does not hold [0, from), from > n_tokens, another thread),
  // INTERNAL when llama_decode fails (the sequence then holds what was evaluated before it).
  Result<PrefillInfo> prefill(llama_seq_id seq, const llama_token* tokens, size_t n_tokens,
                              size_t from = 0);

  // Stores the whole blocks of `seq`, whose positions [0, n_tokens) hold tokens[0, n_tokens) as
  // the engine evaluated them; a partial last block is not stored (it is the engine's until it
  // fills). Blocks kvtier already holds are not written again. The context is only read. The
  // blocks go through one sequence of the cache's own on the daemon, which keeps the last stored
  // prompt's blocks (so the daemon does not evict them) until the next store or close.
  // Windowed models: a block is stored only while the context still holds its windowed rows
  // (the last n_swa positions); blocks past that are left out, and none after them.
  // Recurrent and hybrid models: `seq` must end at n_tokens, and its state there is stored with
  // the blocks (and the KV of a partial last block), so that a later restore of a prompt that
  // begins with these tokens resumes exactly here: call it at the end of a turn.
  // Errors (nothing stored): INVALID_ARGUMENT if seq does not hold positions [0, n_tokens) once
  // each (or, recurrent, ends elsewhere), or its state does not match this cache's layout;
  // UNAVAILABLE when the daemon is gone; FULL when kvtier has no room.
  Result<StoreInfo> store(llama_seq_id seq, const llama_token* tokens, size_t n_tokens);

  // The memory llama.cpp keeps for the context: "kv", "iswa", "recurrent", "hybrid" or
  // "hybrid-iswa".
  const char* memoryKind() const;
  // Bytes of one recurrent state (0 for a model without), and the spacing prefill() stores them
  // at (its chunk size for the others).
  uint64_t stateBytes() const;
  uint32_t checkpointTokens() const;

  // The kvtier layout of this model and context (modelId names weights and settings).
  const Layout& layout() const;
  const CacheStats& stats() const;

  struct Impl;

 private:
  explicit PrefixCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::llama
