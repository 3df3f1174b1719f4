// kvtier's C ABI (kvtier/kvtier.h) over the C++ SDK.
//
// Every entry point runs inside `guarded`, which turns any exception into KVTIER_INTERNAL, and
// checks what a C caller can get wrong before the SDK sees it: NULL handles and pointers, a
// handle used in a forked child, a closed client, a released or ended handle.
//
// Lifetimes: the C++ SDK's objects borrow their Client (a Space, a ReadHandle or WriteHandle must
// not outlive it), while C callers may destroy handles in any order and close a client whose
// spaces and handles are still alive. So every handle holds its client's ClientCore by shared
// pointer, read and write handles share their Space with it, and the core keeps a registry of its
// live handles: closing the client first drops the C++ objects of every handle (a Space goes with
// the last handle sharing it), then the Client. The C handles live on, answering KVTIER_RELEASED,
// until destroyed.
#include "kvtier/kvtier.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/client.h"
#include "store/limits.h"

namespace kvtier::capi {

static_assert(KVTIER_OK == static_cast<int>(ErrorCode::kOk));
static_assert(KVTIER_INVALID_ARGUMENT == static_cast<int>(ErrorCode::kInvalidArgument));
static_assert(KVTIER_NOT_FOUND == static_cast<int>(ErrorCode::kNotFound));
static_assert(KVTIER_FULL == static_cast<int>(ErrorCode::kFull));
static_assert(KVTIER_NOT_SUPPORTED == static_cast<int>(ErrorCode::kNotSupported));
static_assert(KVTIER_STALE_REFERENCE == static_cast<int>(ErrorCode::kStaleReference));
static_assert(KVTIER_CHECKSUM_MISMATCH == static_cast<int>(ErrorCode::kChecksumMismatch));
static_assert(KVTIER_PERMISSION_DENIED == static_cast<int>(ErrorCode::kPermissionDenied));
static_assert(KVTIER_UNAVAILABLE == static_cast<int>(ErrorCode::kUnavailable));
static_assert(KVTIER_CONFLICT == static_cast<int>(ErrorCode::kConflict));
static_assert(KVTIER_PROTOCOL_MISMATCH == static_cast<int>(ErrorCode::kProtocolMismatch));
static_assert(KVTIER_INTERNAL == static_cast<int>(ErrorCode::kInternal));
static_assert(KVTIER_RELEASED == static_cast<int>(ErrorCode::kReleased));
static_assert(KVTIER_DTYPE_I8 == static_cast<int>(DType::kInt8));
static_assert(KVTIER_ROPE_GPTJ == static_cast<int>(RopeStyle::kGptj));
static_assert(KVTIER_KEY_BYTES == sizeof(Key128::bytes));

namespace {

// The calling thread's last error message. A fixed buffer: recording an error never allocates,
// so it cannot fail inside an exception handler. Longer messages are cut.
thread_local char lastError[1024] = "";

kvtier_code fail(ErrorCode code, std::string_view message) noexcept {
  std::snprintf(lastError, sizeof lastError, "%s: %.*s", errorName(code),
                static_cast<int>(message.size()), message.data());
  return static_cast<kvtier_code>(code);
}

kvtier_code fail(const Error& error) noexcept { return fail(error.code(), error.message()); }

kvtier_code invalid(std::string_view message) noexcept {
  return fail(ErrorCode::kInvalidArgument, message);
}

kvtier_code check(const Status& status) noexcept {
  return status ? KVTIER_OK : fail(status.error());
}

// Runs one entry point: no exception leaves it.
template <typename F>
kvtier_code guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(ErrorCode::kInternal, "out of memory");
  } catch (const std::exception& e) {
    return fail(ErrorCode::kInternal, e.what());
  } catch (...) {
    return fail(ErrorCode::kInternal, "unknown exception");
  }
}

}  // namespace

// A C handle that holds C++ objects borrowing the client: the client's close drops them first.
struct Borrower {
  virtual ~Borrower() = default;
  // Destroys the C++ objects the handle holds. Called with the core's mutex held: exclusively by
  // close, or shared by the handle's own destroy (which no other call on the handle may race).
  virtual void drop() noexcept = 0;
};

struct ClientCore {
  const pid_t pid = ::getpid();  // the process that connected: a forked child must not call
  // Calls hold it shared for their whole duration; close holds it exclusively.
  std::shared_mutex mutex;
  std::unique_ptr<Client> client;  // GUARDED_BY(mutex); null once closed
  std::mutex borrowersMutex;       // taken with `mutex` held (shared or exclusive), never before
  std::set<Borrower*> borrowers;   // GUARDED_BY(borrowersMutex)

  void add(Borrower* b) {
    std::lock_guard lock(borrowersMutex);
    borrowers.insert(b);
  }
  void remove(Borrower* b) noexcept {
    std::lock_guard lock(borrowersMutex);
    borrowers.erase(b);
  }
};

namespace {

bool otherProcess(const ClientCore& core) { return core.pid != ::getpid(); }

kvtier_code forked(const ClientCore& core) {
  return invalid("this handle belongs to process " + std::to_string(core.pid) +
                 " (a forked child cannot use its parent's kvtier handles)");
}

// Runs `f(client)` with the core's mutex held shared, if the core belongs to this process and its
// client is open.
template <typename F>
kvtier_code withClient(ClientCore& core, F&& f) {
  if (otherProcess(core)) return forked(core);
  std::shared_lock lock(core.mutex);
  if (!core.client) return fail(ErrorCode::kReleased, "the client was closed");
  return f(*core.client);
}

}  // namespace
}  // namespace kvtier::capi

// The C handles. Each holds its client's core: it outlives every handle made from the client.
struct kvtier_client {
  std::shared_ptr<kvtier::capi::ClientCore> core;
};

struct kvtier_space final : kvtier::capi::Borrower {
  std::shared_ptr<kvtier::capi::ClientCore> core;
  std::shared_ptr<kvtier::Space> space;  // shared with the space's handles; null once dropped
  void drop() noexcept override { space.reset(); }
};

struct kvtier_read_handle final : kvtier::capi::Borrower {
  std::shared_ptr<kvtier::capi::ClientCore> core;
  std::mutex mutex;                      // serialises calls on the handle (taken after core->mutex)
  std::shared_ptr<kvtier::Space> space;  // the C++ handle borrows it
  std::optional<kvtier::ReadHandle> read;  // empty once released or dropped
  void drop() noexcept override {
    read.reset();
    space.reset();
  }
};

struct kvtier_write_handle final : kvtier::capi::Borrower {
  std::shared_ptr<kvtier::capi::ClientCore> core;
  std::mutex mutex;
  std::shared_ptr<kvtier::Space> space;
  std::optional<kvtier::WriteHandle> write;  // empty once committed, aborted or dropped
  void drop() noexcept override {
    write.reset();  // an uncommitted write aborts
    space.reset();
  }
};

namespace kvtier::capi {
namespace {

// Runs `f(space)` on an open space of this process.
template <typename F>
kvtier_code onSpace(kvtier_space* s, F&& f) {
  return guarded([&] {
    if (!s) return invalid("space is NULL");
    return withClient(*s->core, [&](Client&) { return f(*s->space); });
  });
}

// Runs `f(handle)` on a read or write handle of this process whose client is open, with the
// handle's mutex held; `what` names the handle in errors.
template <typename H, typename F>
kvtier_code onHandle(H* h, const char* what, F&& f) {
  return guarded([&] {
    if (!h) return invalid(std::string(what) + " is NULL");
    return withClient(*h->core, [&](Client&) {
      std::lock_guard lock(h->mutex);
      return f(*h);
    });
  });
}

// Makes the C handle for a C++ object borrowing `core`'s client; the caller holds core.mutex
// shared. The handle is registered for the client's close.
template <typename H>
std::unique_ptr<H> makeBorrower(const std::shared_ptr<ClientCore>& core) {
  auto h = std::make_unique<H>();
  h->core = core;
  core->add(h.get());
  return h;
}

// Frees a borrower handle: drops its C++ objects unless the client's close did, then the handle.
// In a forked child it frees nothing: the objects belong to the parent's connection and thread.
template <typename H>
void destroyBorrower(H* h) noexcept {
  if (!h) return;
  if (otherProcess(*h->core)) return;  // deliberately leaked, see above
  std::unique_ptr<H> owned(h);
  std::shared_ptr<ClientCore> core = h->core;  // outlives the handle's own reference
  std::shared_lock lock(core->mutex);
  core->remove(h);
  h->drop();
  owned.reset();
}

Result<std::string_view> seqName(const char* seq) {
  if (!seq) return makeError(ErrorCode::kInvalidArgument, "sequence name is NULL");
  return std::string_view(seq);
}

Result<std::span<const uint32_t>> tokenSpan(const uint32_t* tokens, size_t n) {
  if (!tokens && n > 0) return makeError(ErrorCode::kInvalidArgument, "tokens is NULL");
  return std::span<const uint32_t>(tokens, n);
}

Result<std::vector<Key128>> keyList(const uint8_t* keys, size_t n) {
  if (!keys && n > 0) return makeError(ErrorCode::kInvalidArgument, "keys is NULL");
  // A key names a block, and a call covers at most kMaxTokensPerCall tokens.
  if (n > kMaxTokensPerCall / kMinBlockTokens) {
    return makeError(ErrorCode::kInvalidArgument, n, " keys exceed ",
                     kMaxTokensPerCall / kMinBlockTokens);
  }
  std::vector<Key128> out(n);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out[i].bytes.data(), keys + i * KVTIER_KEY_BYTES, KVTIER_KEY_BYTES);
  }
  return out;
}

Result<PutOptions> putOptions(const kvtier_put_options* o) {
  PutOptions out;
  if (!o) return out;
  if (o->flags & ~KVTIER_DETACHED) {
    return makeError(ErrorCode::kInvalidArgument, "unknown put flags ", o->flags);
  }
  out.detached = (o->flags & KVTIER_DETACHED) != 0;
  out.window = o->window;
  out.chunk = o->chunk;
  auto keys = keyList(o->keys, o->num_keys);
  if (!keys) return keys.error();
  out.keys = std::move(*keys);
  return out;
}

Result<LookupOptions> lookupOptions(const kvtier_lookup_options* o) {
  LookupOptions out;
  if (!o) return out;
  if (o->flags & ~KVTIER_DETACHED) {
    return makeError(ErrorCode::kInvalidArgument, "unknown lookup flags ", o->flags);
  }
  if (o->remote > KVTIER_REMOTE_PREFETCH) {
    return makeError(ErrorCode::kInvalidArgument, "unknown remote mode ", o->remote);
  }
  if (o->bind_seq) out.bindSeq = o->bind_seq;
  out.detached = (o->flags & KVTIER_DETACHED) != 0;
  out.window = o->window;
  out.chunk = o->chunk;
  out.remote = o->remote == KVTIER_REMOTE_LOCAL      ? RemoteMode::kLocal
               : o->remote == KVTIER_REMOTE_PREFETCH ? RemoteMode::kPrefetch
                                                     : RemoteMode::kFetch;
  return out;
}

Result<Layout> toLayout(const kvtier_layout* l) {
  if (!l) return makeError(ErrorCode::kInvalidArgument, "layout is NULL");
  if (!l->model_id) return makeError(ErrorCode::kInvalidArgument, "layout.model_id is NULL");
  if (l->dtype > KVTIER_DTYPE_I8) {
    return makeError(ErrorCode::kInvalidArgument, "unknown dtype ", l->dtype);
  }
  if (l->rope_style > KVTIER_ROPE_GPTJ) {
    return makeError(ErrorCode::kInvalidArgument, "unknown rope style ", l->rope_style);
  }
  Layout out{l->model_id,
             l->num_layers,
             l->num_kv_heads,
             l->head_dim,
             static_cast<DType>(l->dtype),
             l->block_tokens,
             {},
             l->state_bytes};
  // Without RoPE the scheme keeps its defaults, so the fingerprint (and the namespace) is the one
  // a C++ client gets for the same layout.
  if (l->rope_style != KVTIER_ROPE_NONE) {
    out.rope.style = static_cast<RopeStyle>(l->rope_style);
    out.rope.rotaryDims = l->rotary_dims;
    out.rope.base = l->rope_base == 0 ? RopeScheme{}.base : l->rope_base;
  }
  return out;  // open() validates the rest
}

void fillInfo(kvtier_handle_info* out, uint64_t begin, uint64_t end, uint64_t firstPosition,
              uint64_t blocks) {
  out->begin = begin;
  out->end = end;
  out->first_position = firstPosition;
  out->block_count = blocks;
}

kvtier_code released(const char* what) { return fail(ErrorCode::kReleased, std::string(what)); }

// Wraps a read handle the SDK returned in a C handle.
kvtier_code newReadHandle(kvtier_space* s, Result<ReadHandle>&& r, kvtier_read_handle** out) {
  if (!r) return fail(r.error());
  auto h = makeBorrower<kvtier_read_handle>(s->core);
  h->space = s->space;
  h->read.emplace(std::move(r).value());
  *out = h.release();
  return KVTIER_OK;
}

}  // namespace
}  // namespace kvtier::capi

using kvtier::ErrorCode;
using namespace kvtier::capi;  // NOLINT: the entry points below are thin wrappers over it

extern "C" {

const char* kvtier_code_name(kvtier_code code) {
  if (code == KVTIER_OK) return "OK";
  if (static_cast<unsigned>(code) > UINT16_MAX) return "UNKNOWN";
  return kvtier::errorName(static_cast<ErrorCode>(code));
}

const char* kvtier_last_error(void) { return lastError; }

void kvtier_free(void* p) { std::free(p); }

kvtier_code kvtier_connect(const char* socket_path, const char* client_name, uint32_t flags,
                           kvtier_client** out) {
  return guarded([&] {
    if (!out) return invalid("out is NULL");
    if (flags & ~(KVTIER_CONNECT_INLINE | KVTIER_CONNECT_NO_RECONNECT)) {
      return invalid("unknown connect flags");
    }
    kvtier::ClientOptions options;
    if (socket_path) options.socketPath = socket_path;
    options.clientName = client_name ? client_name : "kvtier-c";
    options.mapPool = (flags & KVTIER_CONNECT_INLINE) == 0;
    options.reconnect = (flags & KVTIER_CONNECT_NO_RECONNECT) == 0;
    // Callers may be on any thread (a Go goroutine moves between threads): the client's own loop.
    options.threading = kvtier::ClientThreading::kOwnThread;
    auto client = kvtier::Client::connect(options);
    if (!client) return fail(client.error());
    auto c = std::make_unique<kvtier_client>();
    c->core = std::make_shared<ClientCore>();
    c->core->client = std::move(client).value();
    *out = c.release();
    return KVTIER_OK;
  });
}

kvtier_code kvtier_client_close(kvtier_client* client) {
  return guarded([&] {
    if (!client) return invalid("client is NULL");
    ClientCore& core = *client->core;
    if (otherProcess(core)) return forked(core);
    std::unique_lock lock(core.mutex);  // waits for calls in flight on other threads
    if (!core.client) return fail(ErrorCode::kReleased, "the client was closed already");
    std::set<Borrower*> borrowers;
    {
      std::lock_guard registry(core.borrowersMutex);
      borrowers.swap(core.borrowers);
    }
    for (Borrower* b : borrowers) b->drop();  // before the client they borrow
    core.client.reset();
    return KVTIER_OK;
  });
}

void kvtier_client_destroy(kvtier_client* client) {
  if (!client) return;
  if (otherProcess(*client->core)) return;  // the parent's: freed by nothing here
  std::unique_ptr<kvtier_client> owned(client);
  (void)kvtier_client_close(client);  // KVTIER_RELEASED if closed already: fine
}

kvtier_code kvtier_client_mapped(kvtier_client* client, int* out) {
  return guarded([&] {
    if (!client) return invalid("client is NULL");
    if (!out) return invalid("out is NULL");
    return withClient(*client->core, [&](kvtier::Client& c) {
      *out = c.mapped() ? 1 : 0;
      return KVTIER_OK;
    });
  });
}

kvtier_code kvtier_client_stats(kvtier_client* client, kvtier_stats* out) {
  return guarded([&] {
    if (!client) return invalid("client is NULL");
    if (!out) return invalid("out is NULL");
    return withClient(*client->core, [&](kvtier::Client& c) {
      auto s = c.stats();
      if (!s) return fail(s.error());
      *out = kvtier_stats{s->blocksTotal, s->blocksUsed, s->blocksPinned, s->blocksCached,
                          s->bytesTotal,  s->bytesUsed,  s->hits,         s->misses,
                          s->evictions,   s->clients,    s->sequences,    s->readLeases,
                          s->writeLeases, s->bytesPut,   s->bytesGot,     s->snapshots,
                          s->spilled,     s->promoted,   s->coldRecords,  s->coldBytes};
      return KVTIER_OK;
    });
  });
}

kvtier_code kvtier_client_stats_json(kvtier_client* client, char** out) {
  return guarded([&] {
    if (!client) return invalid("client is NULL");
    if (!out) return invalid("out is NULL");
    return withClient(*client->core, [&](kvtier::Client& c) {
      auto s = c.stats();
      if (!s) return fail(s.error());
      const std::string json = s->toJson();
      char* copy = static_cast<char*>(std::malloc(json.size() + 1));
      if (!copy) return fail(ErrorCode::kInternal, "out of memory");
      std::memcpy(copy, json.c_str(), json.size() + 1);
      *out = copy;
      return KVTIER_OK;
    });
  });
}

kvtier_code kvtier_open(kvtier_client* client, const kvtier_layout* layout, int32_t device,
                        kvtier_space** out) {
  return guarded([&] {
    if (!client) return invalid("client is NULL");
    if (!out) return invalid("out is NULL");
    auto l = toLayout(layout);
    if (!l) return fail(l.error());
    // Refused with the names the caller wrote (kvtier_layout's fields), before open() would refuse
    // it with the C++ ones.
    if (auto valid = l->validate(kvtier::Layout::FieldNames::kSnakeCase); !valid)
      return fail(valid.error());
    return withClient(*client->core, [&](kvtier::Client& c) {
      auto space = c.open(*l, {.device = device});
      if (!space) return fail(space.error());
      auto s = makeBorrower<kvtier_space>(client->core);
      s->space = std::move(space).value();
      *out = s.release();
      return KVTIER_OK;
    });
  });
}

void kvtier_space_destroy(kvtier_space* space) { destroyBorrower(space); }

kvtier_code kvtier_space_get_info(kvtier_space* space, kvtier_space_info* out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    const kvtier::Layout& l = s.layout();
    *out = kvtier_space_info{s.fingerprint(), l.tokenKvBytes(), l.blockBytes(), l.blockTokens,
                             s.device()};
    return KVTIER_OK;
  });
}

kvtier_code kvtier_put(kvtier_space* space, const char* seq, uint64_t begin, const uint32_t* tokens,
                       size_t num_tokens, const void* kv, size_t kv_bytes,
                       const kvtier_put_options* options, kvtier_commit_info* out) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    auto t = tokenSpan(tokens, num_tokens);
    if (!t) return fail(t.error());
    if (!kv && kv_bytes > 0) return invalid("kv is NULL");
    auto o = putOptions(options);
    if (!o) return fail(o.error());
    auto r = s.put(*name, begin, *t, kv, kv_bytes, *o);
    if (!r) return fail(r.error());
    if (out) *out = kvtier_commit_info{r->length, r->sealedBlocks};
    return KVTIER_OK;
  });
}

kvtier_code kvtier_begin_put(kvtier_space* space, const char* seq, uint64_t begin,
                             const uint32_t* tokens, size_t num_tokens,
                             const kvtier_put_options* options, kvtier_write_handle** out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    auto t = tokenSpan(tokens, num_tokens);
    if (!t) return fail(t.error());
    auto o = putOptions(options);
    if (!o) return fail(o.error());
    auto w = s.beginPut(*name, begin, *t, *o);
    if (!w) return fail(w.error());
    auto h = makeBorrower<kvtier_write_handle>(space->core);
    h->space = space->space;
    h->write.emplace(std::move(w).value());
    *out = h.release();
    return KVTIER_OK;
  });
}

kvtier_code kvtier_get(kvtier_space* space, const char* seq, uint64_t begin, uint64_t end,
                       kvtier_read_handle** out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    return newReadHandle(space, s.get(*name, begin, end), out);
  });
}

kvtier_code kvtier_lookup(kvtier_space* space, const uint32_t* tokens, size_t num_tokens,
                          const kvtier_lookup_options* options, kvtier_read_handle** out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    auto t = tokenSpan(tokens, num_tokens);
    if (!t) return fail(t.error());
    auto o = lookupOptions(options);
    if (!o) return fail(o.error());
    return newReadHandle(space, s.lookup(*t, *o), out);
  });
}

kvtier_code kvtier_lookup_keys(kvtier_space* space, const uint8_t* keys, size_t num_keys,
                               const kvtier_lookup_options* options, kvtier_read_handle** out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    auto k = keyList(keys, num_keys);
    if (!k) return fail(k.error());
    auto o = lookupOptions(options);
    if (!o) return fail(o.error());
    return newReadHandle(space, s.lookupKeys(*k, *o), out);
  });
}

kvtier_code kvtier_put_state(kvtier_space* space, const uint32_t* tokens, size_t num_tokens,
                             const void* state, size_t state_bytes, const void* partial_kv,
                             size_t partial_bytes) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto t = tokenSpan(tokens, num_tokens);
    if (!t) return fail(t.error());
    return check(s.putState(*t, state, state_bytes, partial_kv, partial_bytes));
  });
}

kvtier_code kvtier_put_state_keys(kvtier_space* space, const uint8_t* keys, size_t num_keys,
                                  const void* state, size_t state_bytes) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto k = keyList(keys, num_keys);
    if (!k) return fail(k.error());
    return check(s.putStateKeys(*k, state, state_bytes));
  });
}

kvtier_code kvtier_copy_prefix(kvtier_space* space, const char* src, const char* dst, uint64_t len,
                               uint32_t flags) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto from = seqName(src);
    if (!from) return fail(from.error());
    auto to = seqName(dst);
    if (!to) return fail(to.error());
    if (flags & ~KVTIER_DETACHED) return invalid("unknown copy-prefix flags");
    return check(s.copyPrefix(*from, *to, len, (flags & KVTIER_DETACHED) != 0));
  });
}

kvtier_code kvtier_remove(kvtier_space* space, const char* seq, uint64_t begin, uint64_t end) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    return check(s.remove(*name, begin, end));
  });
}

kvtier_code kvtier_truncate(kvtier_space* space, const char* seq, uint64_t len) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    return check(s.truncate(*name, len));
  });
}

kvtier_code kvtier_can_resume(kvtier_space* space, const char* seq, uint64_t pos, int* out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    auto r = s.canResume(*name, pos);
    if (!r) return fail(r.error());
    *out = *r ? 1 : 0;
    return KVTIER_OK;
  });
}

kvtier_code kvtier_length(kvtier_space* space, const char* seq, int* exists, uint64_t* length) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!exists || !length) return invalid("exists or length is NULL");
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    auto r = s.length(*name);
    if (!r) return fail(r.error());
    *exists = r->has_value() ? 1 : 0;
    *length = r->value_or(0);
    return KVTIER_OK;
  });
}

kvtier_code kvtier_snapshot(kvtier_space* space, const char* seq, uint64_t from,
                            kvtier_snapshot_info* out) {
  return onSpace(space, [&](kvtier::Space& s) {
    if (!out) return invalid("out is NULL");
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    auto r = s.snapshot(*name, from);
    if (!r) return fail(r.error());
    *out = kvtier_snapshot_info{r->id, r->from, r->to};
    return KVTIER_OK;
  });
}

kvtier_code kvtier_restore(kvtier_space* space, const char* seq, uint64_t snapshot_id,
                           uint64_t target, const kvtier_put_options* options) {
  return onSpace(space, [&](kvtier::Space& s) {
    auto name = seqName(seq);
    if (!name) return fail(name.error());
    auto o = putOptions(options);
    if (!o) return fail(o.error());
    return check(s.restore(*name, snapshot_id, target, *o));
  });
}

kvtier_code kvtier_drop_snapshot(kvtier_space* space, uint64_t snapshot_id) {
  return onSpace(space, [&](kvtier::Space& s) { return check(s.dropSnapshot(snapshot_id)); });
}

kvtier_code kvtier_read_info(kvtier_read_handle* handle, kvtier_handle_info* out) {
  return onHandle(handle, "read handle", [&](kvtier_read_handle& h) {
    if (!h.read) return released("the read handle was released");
    if (!out) return invalid("out is NULL");
    fillInfo(out, h.read->begin(), h.read->end(), h.read->firstPosition(), h.read->blockCount());
    return KVTIER_OK;
  });
}

kvtier_code kvtier_read_copy(kvtier_read_handle* handle, uint64_t from, uint64_t to, void* out,
                             size_t out_bytes) {
  return onHandle(handle, "read handle", [&](kvtier_read_handle& h) {
    if (!h.read) return released("the read handle was released");
    if (!out && out_bytes > 0) return invalid("out is NULL");
    return check(h.read->copyTo(from, to, out, out_bytes));
  });
}

kvtier_code kvtier_read_verify(kvtier_read_handle* handle, uint64_t index) {
  return onHandle(handle, "read handle", [&](kvtier_read_handle& h) {
    if (!h.read) return released("the read handle was released");
    return check(h.read->verify(index));
  });
}

kvtier_code kvtier_read_state(kvtier_read_handle* handle, void* out, size_t out_bytes) {
  return onHandle(handle, "read handle", [&](kvtier_read_handle& h) {
    if (!h.read) return released("the read handle was released");
    if (!out && out_bytes > 0) return invalid("out is NULL");
    return check(h.read->copyState(out, out_bytes));
  });
}

kvtier_code kvtier_read_block(kvtier_read_handle* handle, uint64_t index, const void** data,
                              size_t* bytes) {
  return onHandle(handle, "read handle", [&](kvtier_read_handle& h) {
    if (!h.read) return released("the read handle was released");
    if (!data || !bytes) return invalid("data or bytes is NULL");
    if (index >= h.read->blockCount()) {
      return invalid("block " + std::to_string(index) + " of a handle holding " +
                     std::to_string(h.read->blockCount()));
    }
    const auto view = h.read->block(index);
    if (!view.data()) {
      return fail(ErrorCode::kNotSupported, "block is in GPU memory: it has no host view");
    }
    *data = view.data();
    *bytes = view.size();
    return KVTIER_OK;
  });
}

kvtier_code kvtier_read_release(kvtier_read_handle* handle) {
  return onHandle(handle, "read handle", [&](kvtier_read_handle& h) {
    if (!h.read) return released("the read handle was released already");
    h.read.reset();  // unpins: the release reaches the daemon before this client's next call
    return KVTIER_OK;
  });
}

void kvtier_read_destroy(kvtier_read_handle* handle) { destroyBorrower(handle); }

kvtier_code kvtier_write_info(kvtier_write_handle* handle, kvtier_handle_info* out) {
  return onHandle(handle, "write handle", [&](kvtier_write_handle& h) {
    if (!h.write) return released("the write handle was committed or aborted");
    if (!out) return invalid("out is NULL");
    fillInfo(out, h.write->begin(), h.write->end(), h.write->firstPosition(),
             h.write->blockCount());
    return KVTIER_OK;
  });
}

kvtier_code kvtier_write_block(kvtier_write_handle* handle, uint64_t index, void** data,
                               size_t* bytes) {
  return onHandle(handle, "write handle", [&](kvtier_write_handle& h) {
    if (!h.write) return released("the write handle was committed or aborted");
    if (!data || !bytes) return invalid("data or bytes is NULL");
    if (index >= h.write->blockCount()) {
      return invalid("block " + std::to_string(index) + " of a grant of " +
                     std::to_string(h.write->blockCount()));
    }
    const auto view = h.write->block(index);
    if (!view.data()) {
      return fail(ErrorCode::kNotSupported,
                  "no host view of this block (an inline client, or GPU memory): use kvtier_write");
    }
    *data = view.data();
    *bytes = view.size();
    return KVTIER_OK;
  });
}

kvtier_code kvtier_write(kvtier_write_handle* handle, uint64_t from, uint64_t to, const void* kv,
                         size_t kv_bytes) {
  return onHandle(handle, "write handle", [&](kvtier_write_handle& h) {
    if (!h.write) return released("the write handle was committed or aborted");
    if (!kv && kv_bytes > 0) return invalid("kv is NULL");
    return check(h.write->write(from, to, kv, kv_bytes));
  });
}

kvtier_code kvtier_commit(kvtier_write_handle* handle, uint64_t up_to, kvtier_commit_info* out) {
  return onHandle(handle, "write handle", [&](kvtier_write_handle& h) {
    if (!h.write) return released("the write handle was committed or aborted");
    auto r = h.write->commit(up_to);
    // As WriteHandle::commit: a bad upTo leaves the lease open for another try; anything else
    // ends it.
    if (r || r.code() != ErrorCode::kInvalidArgument) h.write.reset();
    if (!r) return fail(r.error());
    if (out) *out = kvtier_commit_info{r->length, r->sealedBlocks};
    return KVTIER_OK;
  });
}

kvtier_code kvtier_abort(kvtier_write_handle* handle) {
  return onHandle(handle, "write handle", [&](kvtier_write_handle& h) {
    if (!h.write) return released("the write handle was committed or aborted");
    auto s = h.write->abort();
    h.write.reset();
    return check(s);
  });
}

void kvtier_write_destroy(kvtier_write_handle* handle) { destroyBorrower(handle); }

}  // extern "C"
