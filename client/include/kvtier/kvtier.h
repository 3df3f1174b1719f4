/* kvtier's C ABI (C99): a flat face over the C++ SDK (kvtier/client.h) for C programs and for
 * other languages' bindings (bindings/go uses it through cgo).
 *
 *   kvtier_client* client;
 *   kvtier_space* space;
 *   kvtier_layout layout = {"llama3", 32, 8, 128, KVTIER_DTYPE_F16, 16, KVTIER_ROPE_NONE, 0, 0};
 *   if (kvtier_connect("kvtier-data/kvtierd.sock", "my-engine", 0, &client) != KVTIER_OK) {
 *     fprintf(stderr, "%s\n", kvtier_last_error());
 *     return 1;
 *   }
 *   kvtier_open(client, &layout, -1, &space);
 *   kvtier_put(space, "req-1", 0, tokens, n, kv, kv_bytes, NULL, NULL);
 *   kvtier_read_handle* hit;
 *   kvtier_lookup(space, prompt, m, NULL, &hit);   // longest cached prefix
 *   ...
 *   kvtier_read_destroy(hit);
 *   kvtier_space_destroy(space);
 *   kvtier_client_destroy(client);
 *
 * Errors: every function but the destroy functions and kvtier_code_name/kvtier_last_error/
 * kvtier_free returns a kvtier_code. KVTIER_OK is 0; the others are kvtier's stable error codes
 * (the numbers of kvtier::ErrorCode and of the protocol). A failed call changes nothing on the
 * caller's side: out-parameters are written only on success. It leaves a message for the calling
 * thread, read with kvtier_last_error(). No C++ exception ever leaves a function of this header,
 * and no input makes one abort: bad input (a NULL handle or pointer, a size that does not match,
 * a handle used after release or close, a client used in a forked child) is KVTIER_INVALID_ARGUMENT
 * or KVTIER_RELEASED, and the daemon sees nothing of it.
 *
 * Handles: kvtier_client, kvtier_space, kvtier_read_handle and kvtier_write_handle are opaque. Each
 * is made by one function and freed by one destroy function; destroy accepts NULL and frees in any
 * order (a space destroyed after its client, a read handle after its space). Closing a client
 * (kvtier_client_close, or kvtier_client_destroy) ends its connection at once: the daemon releases
 * its leases and its non-detached sequences, and every later call on the client or on a space or
 * handle made from it fails with KVTIER_RELEASED (destroy them as usual). Handles belong to the
 * process that made them: in a forked child every call on an inherited handle fails with
 * KVTIER_INVALID_ARGUMENT, and destroying one there frees nothing (the parent owns the connection).
 *
 * Threads: a client and its spaces may be called from any number of threads at once; each call
 * blocks its thread until the daemon answers. Calls on one read or write handle are serialised
 * (a handle is safe to share, not faster for it). A destroy function must not race with other
 * calls on the same handle.
 *
 * Pointers: every pointer passed in is borrowed for the duration of the call only. Pointers
 * returned are owned as each function says: block views (kvtier_read_block, kvtier_write_block)
 * point into the daemon's shared memory and stay valid until the handle is released, ended or
 * destroyed, or its client closed; strings from kvtier_client_stats_json are the caller's, freed
 * with kvtier_free; kvtier_code_name's strings are static; kvtier_last_error's is the thread's
 * until its next failing call.
 *
 * Bytes: as in the C++ SDK, the kv buffers of kvtier_put, kvtier_write and kvtier_read_copy are
 * "packed": [layer][K|V][token][kv_head][head_dim] over the tokens of the call, i.e.
 * (to - from) * token_kv_bytes bytes (kvtier_space_get_info). A block view is one block in the
 * daemon's layout: [layer][K|V][slot][kv_head][head_dim].
 */
#ifndef KVTIER_KVTIER_H
#define KVTIER_KVTIER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a struct or a signature of this header changes. */
#define KVTIER_C_ABI_VERSION 1

/* An end position: "to the end of the sequence" (get, remove) or "everything granted" (commit). */
#define KVTIER_END UINT64_MAX

/* Bytes of one client-supplied block key (kvtier_put_options.keys, kvtier_lookup_keys). */
#define KVTIER_KEY_BYTES 16

typedef enum kvtier_code {
  KVTIER_OK = 0,
  KVTIER_INVALID_ARGUMENT = 1,
  KVTIER_NOT_FOUND = 2,
  KVTIER_FULL = 3, /* retryable */
  KVTIER_NOT_SUPPORTED = 4,
  KVTIER_STALE_REFERENCE = 5,
  KVTIER_CHECKSUM_MISMATCH = 6,
  KVTIER_PERMISSION_DENIED = 7,
  KVTIER_UNAVAILABLE = 8, /* retryable: no daemon, or the connection was lost */
  KVTIER_CONFLICT = 9,    /* retryable: e.g. another writer holds the sequence */
  KVTIER_PROTOCOL_MISMATCH = 10,
  KVTIER_INTERNAL = 11,
  KVTIER_RELEASED = 12 /* the handle was released, committed, aborted, or its client closed */
} kvtier_code;

typedef enum kvtier_dtype {
  KVTIER_DTYPE_F16 = 0,
  KVTIER_DTYPE_BF16 = 1,
  KVTIER_DTYPE_F32 = 2,
  KVTIER_DTYPE_F8E4M3 = 3,
  KVTIER_DTYPE_F8E5M2 = 4,
  KVTIER_DTYPE_I8 = 5
} kvtier_dtype;

typedef enum kvtier_rope_style {
  KVTIER_ROPE_NONE = 0,
  KVTIER_ROPE_NEOX = 1, /* pairs (d, d + rotary_dims / 2): GPT-NeoX, Llama (HF), Qwen, Mistral */
  KVTIER_ROPE_GPTJ = 2  /* pairs (2d, 2d + 1): GPT-J, original Llama */
} kvtier_rope_style;

/* kvtier_connect flags. */
#define KVTIER_CONNECT_INLINE 1u /* bytes travel in the RPC messages instead of shared memory */
/* Without it, a client whose daemon went away connects again by itself once one answers on the
 * socket (at most one attempt per 250 ms, however often calls come; spaces open again on the new
 * daemon at their next call, handles from before fail KVTIER_UNAVAILABLE). With it, every call
 * after the loss fails KVTIER_UNAVAILABLE. */
#define KVTIER_CONNECT_NO_RECONNECT 2u

/* kvtier_put_options.flags, kvtier_lookup_options.flags and kvtier_copy_prefix's flags. */
#define KVTIER_DETACHED 1u /* the sequence outlives this client's session */

/* kvtier_lookup_options.remote: what a lookup does about blocks other cluster nodes hold. */
#define KVTIER_REMOTE_FETCH 0u    /* fetch the longest continuation before answering */
#define KVTIER_REMOTE_LOCAL 1u    /* this node only */
#define KVTIER_REMOTE_PREFETCH 2u /* answer with the local hit; fetch the rest meanwhile */

typedef struct kvtier_client kvtier_client;
typedef struct kvtier_space kvtier_space;
typedef struct kvtier_read_handle kvtier_read_handle;
typedef struct kvtier_write_handle kvtier_write_handle;

/* What a block holds (kvtier/layout.h). Blocks are shared only between spaces of equal layouts. */
typedef struct kvtier_layout {
  const char* model_id; /* NUL-terminated, at most 256 bytes */
  uint32_t num_layers;
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t dtype;        /* kvtier_dtype */
  uint32_t block_tokens; /* tokens per block, 16..512 */
  uint32_t rope_style;   /* kvtier_rope_style; with KVTIER_ROPE_NONE the next two are ignored */
  uint32_t rotary_dims;  /* even, <= head_dim */
  double rope_base;      /* 0: 10000 */
  /* Bytes of a recurrent state captured at a prefix's end (0: none; see kvtier_put_state). With
   * a state, num_layers, num_kv_heads and head_dim may all be 0: a model without KV. */
  uint64_t state_bytes;
} kvtier_layout;

typedef struct kvtier_space_info {
  uint64_t fingerprint;
  uint64_t token_kv_bytes; /* one token's K and V over all layers: the unit of packed buffers */
  uint64_t block_bytes;
  uint32_t block_tokens;
  int32_t device; /* -1: the host pool */
} kvtier_space_info;

/* Options of kvtier_put, kvtier_begin_put and kvtier_restore; NULL means all defaults (zeros). */
typedef struct kvtier_put_options {
  uint32_t flags;  /* KVTIER_DETACHED */
  uint64_t window; /* sliding-window attention: keep the last `window` tokens (0: all) */
  uint64_t chunk;  /* chunked attention: keep the current chunk of `chunk` tokens (0: all) */
  /* The client's own keys for the blocks the put completes, KVTIER_KEY_BYTES each, back to
   * back (NULL with num_keys 0: the daemon derives keys from the tokens). */
  const uint8_t* keys;
  size_t num_keys;
} kvtier_put_options;

/* Options of kvtier_lookup and kvtier_lookup_keys; NULL means all defaults. */
typedef struct kvtier_lookup_options {
  const char* bind_seq; /* also make the matched prefix the whole of this sequence; NULL: none */
  uint32_t flags;       /* KVTIER_DETACHED, for a sequence bind_seq creates */
  uint64_t window;      /* as kvtier_put_options, for a sequence bind_seq creates */
  uint64_t chunk;
  uint32_t remote; /* KVTIER_REMOTE_* */
} kvtier_lookup_options;

typedef struct kvtier_commit_info {
  uint64_t length;        /* of the sequence after the commit */
  uint32_t sealed_blocks; /* blocks the commit sealed (and entered in the prefix index) */
} kvtier_commit_info;

/* The positions a read or write handle covers. */
typedef struct kvtier_handle_info {
  uint64_t begin;          /* lookup: 0 */
  uint64_t end;            /* lookup: tokens matched; get: end of the range held */
  uint64_t first_position; /* position of block 0's first slot */
  uint64_t block_count;
} kvtier_handle_info;

typedef struct kvtier_snapshot_info {
  uint64_t id; /* names the snapshot in its space; any process may restore it */
  uint64_t from;
  uint64_t to;
} kvtier_snapshot_info;

/* The daemon's main counters; kvtier_client_stats_json has all of them. */
typedef struct kvtier_stats {
  uint64_t blocks_total, blocks_used, blocks_pinned, blocks_cached;
  uint64_t bytes_total, bytes_used;
  uint64_t hits, misses, evictions;
  uint64_t clients, sequences, read_leases, write_leases;
  uint64_t bytes_put, bytes_got;
  uint64_t snapshots;
  uint64_t spilled, promoted, cold_records, cold_bytes;
} kvtier_stats;

/* ---- Errors ---------------------------------------------------------------------------------- */

/* "INVALID_ARGUMENT" etc.; "OK" for 0, "UNKNOWN" for a number this build does not know. Static. */
const char* kvtier_code_name(kvtier_code code);

/* The message of the calling thread's last failed call ("" before any): "NOT_FOUND: ...". Owned
 * by the library; valid until the thread's next failing call. */
const char* kvtier_last_error(void);

/* Frees a string this library returned (kvtier_client_stats_json). NULL is fine. */
void kvtier_free(void* p);

/* ---- Client ---------------------------------------------------------------------------------- */

/* Connects to the daemon at `socket_path` (NULL: "kvtier-data/kvtierd.sock") as `client_name`
 * (NULL: "kvtier-c"), maps its pool unless KVTIER_CONNECT_INLINE, and starts the client's own
 * event-loop thread. KVTIER_UNAVAILABLE if no daemon answers. *out: the caller's, freed with
 * kvtier_client_destroy. */
kvtier_code kvtier_connect(const char* socket_path, const char* client_name, uint32_t flags,
                           kvtier_client** out);

/* Ends the connection now (see "Handles" above). Blocks until the client's thread has stopped.
 * KVTIER_RELEASED if it was closed already. */
kvtier_code kvtier_client_close(kvtier_client* client);

/* Closes the client if it is open and frees the handle. */
void kvtier_client_destroy(kvtier_client* client);

/* *out: 1 when bytes move through the mapped pool, 0 when they travel inline. */
kvtier_code kvtier_client_mapped(kvtier_client* client, int* out);

kvtier_code kvtier_client_stats(kvtier_client* client, kvtier_stats* out);

/* Every counter of the daemon as a JSON object. *out: the caller's, freed with kvtier_free. */
kvtier_code kvtier_client_stats_json(kvtier_client* client, char** out);

/* ---- Spaces ---------------------------------------------------------------------------------- */

/* Opens (or joins) the namespace for `layout`, on the host pool (device -1) or on a CUDA device's
 * pool. *out: the caller's, freed with kvtier_space_destroy. */
kvtier_code kvtier_open(kvtier_client* client, const kvtier_layout* layout, int32_t device,
                        kvtier_space** out);

/* Frees the space. Its read and write handles stay usable until destroyed. */
void kvtier_space_destroy(kvtier_space* space);

kvtier_code kvtier_space_get_info(kvtier_space* space, kvtier_space_info* out);

/* Stores the KV of `tokens` at positions [begin, begin + num_tokens) of `seq` (positions from
 * `begin` on are replaced; begin must be <= the sequence's length). `kv` is packed,
 * num_tokens * token_kv_bytes bytes, and `kv_bytes` must say so. `options` may be NULL; `out`
 * may be NULL. */
kvtier_code kvtier_put(kvtier_space* space, const char* seq, uint64_t begin, const uint32_t* tokens,
                       size_t num_tokens, const void* kv, size_t kv_bytes,
                       const kvtier_put_options* options, kvtier_commit_info* out);

/* The first step of kvtier_put: a write lease on [begin, begin + num_tokens) of `seq`. Nothing is
 * visible to anyone until kvtier_commit. *out: the caller's, freed with kvtier_write_destroy
 * (which aborts an uncommitted write). */
kvtier_code kvtier_begin_put(kvtier_space* space, const char* seq, uint64_t begin,
                             const uint32_t* tokens, size_t num_tokens,
                             const kvtier_put_options* options, kvtier_write_handle** out);

/* A read lease on positions [begin, end) of `seq` (end KVTIER_END: its length). The blocks stay
 * pinned until kvtier_read_release or kvtier_read_destroy. *out: the caller's. */
kvtier_code kvtier_get(kvtier_space* space, const char* seq, uint64_t begin, uint64_t end,
                       kvtier_read_handle** out);

/* The longest cached prefix of `tokens` made of whole sealed blocks, under a read lease (a miss
 * is a handle with end 0, not an error). `options` may be NULL. *out: the caller's. */
kvtier_code kvtier_lookup(kvtier_space* space, const uint32_t* tokens, size_t num_tokens,
                          const kvtier_lookup_options* options, kvtier_read_handle** out);

/* As kvtier_lookup, for a chain of client keys (KVTIER_KEY_BYTES each), one per block. */
kvtier_code kvtier_lookup_keys(kvtier_space* space, const uint8_t* keys, size_t num_keys,
                               const kvtier_lookup_options* options, kvtier_read_handle** out);

/* Prefix states (a layout with state_bytes; docs/cache-shapes.md): stores the state a model had
 * after tokens[0, num_tokens) (`state`, state_bytes bytes), so that a lookup by any process of a
 * prompt beginning with those tokens can restore there. When num_tokens is not a multiple of
 * block_tokens, `partial_kv` holds the KV of the num_tokens % block_tokens positions past the
 * last whole block, packed ((num_tokens % block_tokens) * token_kv_bytes bytes; else NULL, 0).
 * In such a space a lookup (without bind_seq) answers the deepest position whose state is
 * cached with the blocks before it (kvtier_read_state reads it), or nothing. */
kvtier_code kvtier_put_state(kvtier_space* space, const uint32_t* tokens, size_t num_tokens,
                             const void* state, size_t state_bytes, const void* partial_kv,
                             size_t partial_bytes);
/* The same after the client-keyed blocks `keys` (KVTIER_KEY_BYTES each). */
kvtier_code kvtier_put_state_keys(kvtier_space* space, const uint8_t* keys, size_t num_keys,
                                  const void* state, size_t state_bytes);

/* dst becomes positions [0, min(len, length of src)) of src (full blocks shared, not copied). */
kvtier_code kvtier_copy_prefix(kvtier_space* space, const char* src, const char* dst, uint64_t len,
                               uint32_t flags);

/* Removes [begin, end) of `seq`; end KVTIER_END truncates. An unknown sequence or a range past
 * the end is success. A middle range needs the layout's RoPE scheme (else KVTIER_NOT_SUPPORTED). */
kvtier_code kvtier_remove(kvtier_space* space, const char* seq, uint64_t begin, uint64_t end);

/* Keeps [0, len) of `seq`; len >= its length changes nothing. */
kvtier_code kvtier_truncate(kvtier_space* space, const char* seq, uint64_t len);

/* *out: 1 if `seq` holds every position needed to continue at `pos`, else 0. */
kvtier_code kvtier_can_resume(kvtier_space* space, const char* seq, uint64_t pos, int* out);

/* *exists: 1 and *length its length if `seq` exists, else 0 and 0. */
kvtier_code kvtier_length(kvtier_space* space, const char* seq, int* exists, uint64_t* length);

/* An immutable snapshot of [from, length) of `seq` (empty when from >= length); it outlives
 * later writes to, and removal of, the sequence. */
kvtier_code kvtier_snapshot(kvtier_space* space, const char* seq, uint64_t from,
                            kvtier_snapshot_info* out);

/* `seq` becomes its own [0, snapshot from) plus the snapshot's [from, target). `options` (may be
 * NULL) applies when this creates the sequence. */
kvtier_code kvtier_restore(kvtier_space* space, const char* seq, uint64_t snapshot_id,
                           uint64_t target, const kvtier_put_options* options);

kvtier_code kvtier_drop_snapshot(kvtier_space* space, uint64_t snapshot_id);

/* ---- Read handles (get, lookup) -------------------------------------------------------------- */

kvtier_code kvtier_read_info(kvtier_read_handle* handle, kvtier_handle_info* out);

/* Copies positions [from, to) (within [begin, end) of the handle) into `out`, packed;
 * `out_bytes` must be (to - from) * token_kv_bytes. Each block is checked against its writer's
 * checksum as it is copied: KVTIER_CHECKSUM_MISMATCH when one changed in the pool (use nothing of
 * `out`; see kvtier_read_verify). */
kvtier_code kvtier_read_copy(kvtier_read_handle* handle, uint64_t from, uint64_t to, void* out,
                             size_t out_bytes);

/* Block `index` in place: *data points into the daemon's shared memory (or the handle's private
 * copy for an inline client) and stays valid until the handle is released or destroyed, or its
 * client closed; *bytes is the block's size. KVTIER_NOT_SUPPORTED for a block in GPU memory. */
kvtier_code kvtier_read_block(kvtier_read_handle* handle, uint64_t index, const void** data,
                              size_t* bytes);

/* Checks block `index`'s bytes in the pool against the checksum its writer took (a read of the
 * block), for a reader of kvtier_read_block's views: KVTIER_CHECKSUM_MISMATCH when they changed
 * (use none of them; the daemon is told, checks the block itself and drops it, so the next lookup
 * stops before it), KVTIER_OK when they match or the block has no checksum (a partial block),
 * KVTIER_NOT_SUPPORTED for a block in GPU memory. kvtier_read_copy checks every block it copies
 * the same way, in the same pass as the copy. */
kvtier_code kvtier_read_verify(kvtier_read_handle* handle, uint64_t index);

/* The state a lookup in a space with states answered (at position `end`), checked against its
 * writer's checksum as it is copied into `out` (state_bytes bytes): KVTIER_CHECKSUM_MISMATCH when
 * the bytes in the pool changed (use none of them), KVTIER_NOT_FOUND when the handle holds none. */
kvtier_code kvtier_read_state(kvtier_read_handle* handle, void* out, size_t out_bytes);

/* Unpins the blocks now; later calls on the handle fail with KVTIER_RELEASED. Releasing twice is
 * KVTIER_RELEASED too (and harmless). */
kvtier_code kvtier_read_release(kvtier_read_handle* handle);

/* Releases the blocks if still held and frees the handle. */
void kvtier_read_destroy(kvtier_read_handle* handle);

/* ---- Write handles (begin_put) --------------------------------------------------------------- */

kvtier_code kvtier_write_info(kvtier_write_handle* handle, kvtier_handle_info* out);

/* Writable block `index` of the grant, in the daemon's shared memory, valid until the handle is
 * committed, aborted or destroyed, or its client closed. Slots of block 0 before `begin` hold
 * the sequence's existing bytes: do not write them. KVTIER_NOT_SUPPORTED for an inline client or
 * a block in GPU memory (use kvtier_write). */
kvtier_code kvtier_write_block(kvtier_write_handle* handle, uint64_t index, void** data,
                               size_t* bytes);

/* Writes positions [from, to) (within [begin, end) of the grant) from a packed buffer of
 * (to - from) * token_kv_bytes bytes. */
kvtier_code kvtier_write(kvtier_write_handle* handle, uint64_t from, uint64_t to, const void* kv,
                         size_t kv_bytes);

/* Makes [begin, up_to) visible (KVTIER_END: everything granted) and ends the write; `out` may be
 * NULL. A bad up_to (KVTIER_INVALID_ARGUMENT) leaves the write open for another try. */
kvtier_code kvtier_commit(kvtier_write_handle* handle, uint64_t up_to, kvtier_commit_info* out);

/* Ends the write without making anything visible. */
kvtier_code kvtier_abort(kvtier_write_handle* handle);

/* Aborts the write if still open and frees the handle. */
void kvtier_write_destroy(kvtier_write_handle* handle);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVTIER_KVTIER_H */
