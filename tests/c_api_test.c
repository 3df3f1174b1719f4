/* Tests of the C ABI (kvtier/kvtier.h), written in C99 and compiled as C: they see exactly what a
 * C program sees. Run against a real kvtierd by tests/with_daemon.sh, which sets KVTIER_SOCKET
 * and cleans up the daemon, its data directory, socket and segments whatever happens here.
 *
 *   kvtier_c_api_test CASE    runs one case (ctest registers each as CApi.CASE)
 *   kvtier_c_api_test         runs them all
 *
 * Each case opens its own namespace (a layout with the case's model id), so cases never see each
 * other's blocks. A failed check prints where, what and the library's last error, and fails the
 * case; the wrapper's cleanup still runs. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvtier/kvtier.h"

#define CHECK(cond)                                                                            \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, #cond, \
              kvtier_last_error());                                                            \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

/* `call` returns `code`; on anything else the case fails, naming both. */
#define CHECK_CODE(call, code)                                                                     \
  do {                                                                                             \
    kvtier_code got_ = (call);                                                                     \
    if (got_ != (code)) {                                                                          \
      fprintf(stderr, "%s:%d: %s returned %s, expected %s (last error: %s)\n", __FILE__, __LINE__, \
              #call, kvtier_code_name(got_), kvtier_code_name(code), kvtier_last_error());         \
      return 1;                                                                                    \
    }                                                                                              \
  } while (0)

#define CHECK_OK(call) CHECK_CODE(call, KVTIER_OK)

/* 2 layers, 2 KV heads, head dim 8, fp16, 16 tokens per block: 32 bytes per token and layer for
 * K (and V), 128 bytes per token over K and V of all layers, 2 KiB per block. */
enum { kLayers = 2, kBlockTokens = 16, kTokenBytes = 32, kTokenKvBytes = 128 };

static kvtier_layout layout_for(const char* model_id) {
  kvtier_layout l;
  memset(&l, 0, sizeof l);
  l.model_id = model_id;
  l.num_layers = kLayers;
  l.num_kv_heads = 2;
  l.head_dim = 8;
  l.dtype = KVTIER_DTYPE_F16;
  l.block_tokens = kBlockTokens;
  l.rope_style = KVTIER_ROPE_NONE;
  return l;
}

static const char* socket_path(void) {
  const char* s = getenv("KVTIER_SOCKET");
  return s ? s : "kvtier-data/kvtierd.sock";
}

/* Tokens and packed KV bytes that differ per seed. */
static void fill_tokens(uint32_t* tokens, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) tokens[i] = seed * 100003u + (uint32_t)i * 7919u + 1u;
}

static void fill_kv(uint8_t* kv, size_t bytes, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1103515245u + 12345u;
    kv[i] = (uint8_t)(x >> 16);
  }
}

/* Packed bytes of positions [from, to) out of a packed buffer of `n` tokens starting at 0. */
static void pack_range(const uint8_t* packed, size_t n, size_t from, size_t to, uint8_t* out) {
  for (size_t lkv = 0; lkv < 2 * kLayers; ++lkv) {
    memcpy(out + lkv * (to - from) * kTokenBytes, packed + (lkv * n + from) * kTokenBytes,
           (to - from) * kTokenBytes);
  }
}

static int connect_and_open(const char* model_id, uint32_t flags, kvtier_client** client,
                            kvtier_space** space) {
  kvtier_layout l = layout_for(model_id);
  CHECK_OK(kvtier_connect(socket_path(), "c-api-test", flags, client));
  CHECK_OK(kvtier_open(*client, &l, -1, space));
  return 0;
}

/* Every byte of positions [0, n) of `seq`, read back with get, equals `expected` (packed). */
static int check_sequence(kvtier_space* space, const char* seq, const uint8_t* expected, size_t n) {
  kvtier_read_handle* h = NULL;
  kvtier_handle_info info;
  uint8_t* got = malloc(n * kTokenKvBytes);
  CHECK(got != NULL);
  CHECK_OK(kvtier_get(space, seq, 0, KVTIER_END, &h));
  CHECK_OK(kvtier_read_info(h, &info));
  CHECK(info.begin == 0 && info.end == n);
  CHECK_OK(kvtier_read_copy(h, 0, n, got, n * kTokenKvBytes));
  CHECK(memcmp(got, expected, n * kTokenKvBytes) == 0);
  kvtier_read_destroy(h);
  free(got);
  return 0;
}

/* put, then lookup and get give the same bytes back: copied packed, and in place per block. */
static int test_put_lookup_get(void) {
  enum { n = 40 }; /* two full blocks and 8 tokens of a third */
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  uint32_t tokens[n + 8];
  static uint8_t kv[n * kTokenKvBytes], got[n * kTokenKvBytes], want[n * kTokenKvBytes];
  kvtier_commit_info commit;
  kvtier_space_info si;
  kvtier_read_handle* hit = NULL;
  kvtier_handle_info info;
  kvtier_stats before, after;
  int exists = 0, mapped = -1;
  uint64_t length = 0;
  char* json = NULL;

  if (connect_and_open("c-api/put-lookup-get", 0, &client, &space)) return 1;
  CHECK_OK(kvtier_client_mapped(client, &mapped));
  CHECK(mapped == 1);
  CHECK_OK(kvtier_space_get_info(space, &si));
  CHECK(si.token_kv_bytes == kTokenKvBytes && si.block_bytes == kTokenKvBytes * kBlockTokens);
  CHECK(si.block_tokens == kBlockTokens && si.device == -1 && si.fingerprint != 0);

  fill_tokens(tokens, n + 8, 1);
  fill_kv(kv, sizeof kv, 1);
  CHECK_OK(kvtier_client_stats(client, &before));
  CHECK_OK(kvtier_put(space, "req-1", 0, tokens, n, kv, sizeof kv, NULL, &commit));
  CHECK(commit.length == n && commit.sealed_blocks == 2);
  CHECK_OK(kvtier_length(space, "req-1", &exists, &length));
  CHECK(exists == 1 && length == n);

  /* A longer prompt with the same start: the two sealed blocks match, the partial one never. */
  CHECK_OK(kvtier_lookup(space, tokens, n + 8, NULL, &hit));
  CHECK_OK(kvtier_read_info(hit, &info));
  CHECK(info.begin == 0 && info.end == 32 && info.first_position == 0 && info.block_count == 2);
  CHECK_OK(kvtier_read_copy(hit, 0, 32, got, 32 * kTokenKvBytes));
  pack_range(kv, n, 0, 32, want);
  CHECK(memcmp(got, want, 32 * kTokenKvBytes) == 0);
  /* Block 1 in place: [layer][K|V][slot] holds tokens 16..31 of the put. */
  {
    const void* data = NULL;
    size_t bytes = 0;
    CHECK_OK(kvtier_read_block(hit, 1, &data, &bytes));
    CHECK(bytes == kTokenKvBytes * kBlockTokens);
    for (size_t lkv = 0; lkv < 2 * kLayers; ++lkv) {
      CHECK(memcmp((const uint8_t*)data + lkv * kBlockTokens * kTokenBytes,
                   kv + (lkv * n + 16) * kTokenBytes, kBlockTokens * kTokenBytes) == 0);
    }
  }
  kvtier_read_destroy(hit);

  /* get of a middle range, packed. */
  CHECK_OK(kvtier_get(space, "req-1", 8, KVTIER_END, &hit));
  CHECK_OK(kvtier_read_info(hit, &info));
  CHECK(info.begin == 8 && info.end == n);
  CHECK_OK(kvtier_read_copy(hit, 8, n, got, (n - 8) * kTokenKvBytes));
  pack_range(kv, n, 8, n, want);
  CHECK(memcmp(got, want, (n - 8) * kTokenKvBytes) == 0);
  kvtier_read_destroy(hit);

  /* A lookup that also binds its match to a new sequence, in the same call. */
  {
    kvtier_lookup_options bind;
    memset(&bind, 0, sizeof bind);
    bind.bind_seq = "bound";
    bind.remote = KVTIER_REMOTE_LOCAL;
    CHECK_OK(kvtier_lookup(space, tokens, n, &bind, &hit));
    kvtier_read_destroy(hit);
    CHECK_OK(kvtier_length(space, "bound", &exists, &length));
    CHECK(exists == 1 && length == 32);
    bind.remote = 9;
    CHECK_CODE(kvtier_lookup(space, tokens, n, &bind, &hit), KVTIER_INVALID_ARGUMENT);
  }

  /* A prompt that differs in its first token: no hit (a handle with end 0, not an error). */
  tokens[0] ^= 1u;
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_read_info(hit, &info));
  CHECK(info.end == 0 && info.block_count == 0);
  kvtier_read_destroy(hit);

  CHECK_OK(kvtier_client_stats(client, &after));
  CHECK(after.hits > before.hits && after.misses > before.misses);
  CHECK(after.bytes_put >= before.bytes_put + sizeof kv);
  CHECK_OK(kvtier_client_stats_json(client, &json));
  CHECK(strstr(json, "\"hits\"") != NULL);
  kvtier_free(json);

  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* begin_put / write / commit: nothing is visible before the commit; bytes written through
 * kvtier_write and straight into a block view both read back; an aborted write leaves nothing. */
static int test_begin_put_commit(void) {
  enum { n = 32 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_write_handle* w = NULL;
  kvtier_read_handle* hit = NULL;
  kvtier_handle_info info;
  kvtier_commit_info commit;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], part[16 * kTokenKvBytes];
  int exists = -1;
  uint64_t length = 99;

  if (connect_and_open("c-api/begin-put", 0, &client, &space)) return 1;
  fill_tokens(tokens, n, 2);
  fill_kv(kv, sizeof kv, 2);
  CHECK_OK(kvtier_begin_put(space, "w", 0, tokens, n, NULL, &w));
  CHECK_OK(kvtier_write_info(w, &info));
  CHECK(info.begin == 0 && info.end == n && info.block_count == 2);
  /* Positions [0, 16) through kvtier_write, block 1 (positions [16, 32)) in place. */
  pack_range(kv, n, 0, 16, part);
  CHECK_OK(kvtier_write(w, 0, 16, part, sizeof part));
  {
    void* data = NULL;
    size_t bytes = 0;
    CHECK_OK(kvtier_write_block(w, 1, &data, &bytes));
    CHECK(bytes == kTokenKvBytes * kBlockTokens);
    for (size_t lkv = 0; lkv < 2 * kLayers; ++lkv) {
      memcpy((uint8_t*)data + lkv * kBlockTokens * kTokenBytes, kv + (lkv * n + 16) * kTokenBytes,
             kBlockTokens * kTokenBytes);
    }
  }
  /* Not visible before the commit. */
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_read_info(hit, &info));
  CHECK(info.end == 0);
  kvtier_read_destroy(hit);
  /* A bad up_to leaves the write open; then the real commit. */
  CHECK_CODE(kvtier_commit(w, n + 1, &commit), KVTIER_INVALID_ARGUMENT);
  CHECK_OK(kvtier_commit(w, KVTIER_END, &commit));
  CHECK(commit.length == n && commit.sealed_blocks == 2);
  if (check_sequence(space, "w", kv, n)) return 1;
  /* The handle has ended. */
  CHECK_CODE(kvtier_write(w, 0, 16, part, sizeof part), KVTIER_RELEASED);
  CHECK_CODE(kvtier_commit(w, KVTIER_END, NULL), KVTIER_RELEASED);
  CHECK_CODE(kvtier_abort(w), KVTIER_RELEASED);
  CHECK_CODE(kvtier_write_info(w, &info), KVTIER_RELEASED);
  kvtier_write_destroy(w);

  /* An aborted write, and one destroyed without a commit, leave no sequence behind. */
  CHECK_OK(kvtier_begin_put(space, "aborted", 0, tokens, 16, NULL, &w));
  CHECK_OK(kvtier_write(w, 0, 16, part, sizeof part));
  CHECK_OK(kvtier_abort(w));
  kvtier_write_destroy(w);
  CHECK_OK(kvtier_length(space, "aborted", &exists, &length));
  CHECK(exists == 0 && length == 0);
  CHECK_OK(kvtier_begin_put(space, "dropped", 0, tokens, 16, NULL, &w));
  kvtier_write_destroy(w);
  CHECK_OK(kvtier_length(space, "dropped", &exists, &length));
  CHECK(exists == 0);

  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* copy_prefix, truncate, remove, can_resume, length: DESIGN.md's semantics seen through C. */
static int test_sequence_ops(void) {
  enum { n = 40 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], want[n * kTokenKvBytes];
  int exists = -1, ok = -1;
  uint64_t length = 0;

  if (connect_and_open("c-api/sequence-ops", 0, &client, &space)) return 1;
  fill_tokens(tokens, n, 3);
  fill_kv(kv, sizeof kv, 3);
  CHECK_OK(kvtier_put(space, "src", 0, tokens, n, kv, sizeof kv, NULL, NULL));

  /* dst gets [0, 20) of src, shared and copied-on-write. */
  CHECK_OK(kvtier_copy_prefix(space, "src", "dst", 20, 0));
  CHECK_OK(kvtier_length(space, "dst", &exists, &length));
  CHECK(exists == 1 && length == 20);
  pack_range(kv, n, 0, 20, want);
  if (check_sequence(space, "dst", want, 20)) return 1;

  CHECK_OK(kvtier_truncate(space, "dst", 10));
  CHECK_OK(kvtier_length(space, "dst", &exists, &length));
  CHECK(length == 10);
  CHECK_OK(kvtier_truncate(space, "dst", 30)); /* past the end: no change */
  CHECK_OK(kvtier_length(space, "dst", &exists, &length));
  CHECK(length == 10);
  CHECK_OK(kvtier_can_resume(space, "dst", 10, &ok));
  CHECK(ok == 1);
  CHECK_OK(kvtier_can_resume(space, "dst", 11, &ok));
  CHECK(ok == 0);
  CHECK_OK(kvtier_can_resume(space, "never-made", 0, &ok));
  CHECK(ok == 1);
  CHECK_OK(kvtier_can_resume(space, "never-made", 1, &ok));
  CHECK(ok == 0);

  /* src is unchanged by everything done to dst. */
  if (check_sequence(space, "src", kv, n)) return 1;

  /* A middle range needs a RoPE scheme: NOT_SUPPORTED, nothing changes. */
  CHECK_CODE(kvtier_remove(space, "src", 4, 8), KVTIER_NOT_SUPPORTED);
  if (check_sequence(space, "src", kv, n)) return 1;
  /* To the end: truncates; an unknown sequence is success. */
  CHECK_OK(kvtier_remove(space, "src", 16, KVTIER_END));
  CHECK_OK(kvtier_length(space, "src", &exists, &length));
  CHECK(exists == 1 && length == 16);
  CHECK_OK(kvtier_remove(space, "never-made", 0, KVTIER_END));

  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* A snapshot outlives its sequence and restores into another one, byte for byte. */
static int test_snapshot_restore(void) {
  enum { n = 48 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_snapshot_info snap, untouched;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], want[n * kTokenKvBytes];
  int exists = -1;
  uint64_t length = 0;

  if (connect_and_open("c-api/snapshot", 0, &client, &space)) return 1;
  fill_tokens(tokens, n, 4);
  fill_kv(kv, sizeof kv, 4);
  CHECK_OK(kvtier_put(space, "s", 0, tokens, n, kv, sizeof kv, NULL, NULL));
  CHECK_OK(kvtier_snapshot(space, "s", 0, &snap));
  CHECK(snap.from == 0 && snap.to == n);
  CHECK_OK(kvtier_remove(space, "s", 0, KVTIER_END));

  CHECK_OK(kvtier_restore(space, "r", snap.id, 32, NULL));
  CHECK_OK(kvtier_length(space, "r", &exists, &length));
  CHECK(exists == 1 && length == 32);
  pack_range(kv, n, 0, 32, want);
  if (check_sequence(space, "r", want, 32)) return 1;

  /* Past the snapshot's end: INVALID_ARGUMENT, r unchanged. */
  CHECK_CODE(kvtier_restore(space, "r", snap.id, n + 1, NULL), KVTIER_INVALID_ARGUMENT);
  if (check_sequence(space, "r", want, 32)) return 1;

  CHECK_OK(kvtier_drop_snapshot(space, snap.id));
  CHECK_CODE(kvtier_restore(space, "r2", snap.id, 16, NULL), KVTIER_NOT_FOUND);
  CHECK(strncmp(kvtier_last_error(), "NOT_FOUND", 9) == 0);
  /* Out-parameters are written only on success. */
  memset(&untouched, 0xab, sizeof untouched);
  snap = untouched;
  CHECK_CODE(kvtier_snapshot(space, NULL, 0, &snap), KVTIER_INVALID_ARGUMENT);
  CHECK(memcmp(&snap, &untouched, sizeof snap) == 0);

  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* Bad input: NULL handles and pointers, sizes that do not match, unknown enums and flags, no
 * daemon. Each is a typed error with a message, writes no out-parameter and changes nothing. */
static int test_bad_input(void) {
  enum { n = 32 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  static int marker; /* out-parameters point at it before a failing call and must still after */
  kvtier_client* no_client = (kvtier_client*)&marker;
  kvtier_space* no_space = (kvtier_space*)&marker;
  kvtier_read_handle* no_read = (kvtier_read_handle*)&marker;
  kvtier_read_handle* hit = NULL;
  kvtier_layout l = layout_for("c-api/bad-input");
  kvtier_stats stats, before, after;
  kvtier_space_info si;
  kvtier_put_options bad_flags;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], out[n * kTokenKvBytes], sentinel[n * kTokenKvBytes];
  int exists = -1, ok = 7;
  uint64_t length = 0;
  const void* data = NULL;
  size_t bytes = 0;

  /* No daemon there. */
  CHECK_CODE(kvtier_connect("/nonexistent/kvtierd.sock", NULL, 0, &no_client), KVTIER_UNAVAILABLE);
  CHECK(no_client == (kvtier_client*)&marker);
  CHECK(strncmp(kvtier_last_error(), "UNAVAILABLE: ", 13) == 0);
  CHECK_CODE(kvtier_connect(socket_path(), NULL, 0, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_connect(socket_path(), NULL, 0x80, &no_client), KVTIER_INVALID_ARGUMENT);
  CHECK(no_client == (kvtier_client*)&marker);
  /* Both flags are known (a client that does not reconnect is an ordinary one until its daemon
   * goes away). */
  CHECK_OK(kvtier_connect(socket_path(), NULL, KVTIER_CONNECT_INLINE | KVTIER_CONNECT_NO_RECONNECT,
                          &no_client));
  kvtier_client_destroy(no_client);
  no_client = (kvtier_client*)&marker;

  if (connect_and_open("c-api/bad-input", 0, &client, &space)) return 1;
  fill_tokens(tokens, n, 5);
  fill_kv(kv, sizeof kv, 5);

  /* NULL handles. */
  CHECK_CODE(kvtier_client_stats(NULL, &stats), KVTIER_INVALID_ARGUMENT);
  CHECK(strncmp(kvtier_last_error(), "INVALID_ARGUMENT: ", 18) == 0);
  CHECK_CODE(kvtier_client_close(NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_open(NULL, &l, -1, &no_space), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_put(NULL, "x", 0, tokens, n, kv, sizeof kv, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_get(NULL, "x", 0, KVTIER_END, &no_read), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_lookup(NULL, tokens, n, NULL, &no_read), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_read_copy(NULL, 0, 0, out, 0), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_read_release(NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_write(NULL, 0, 0, kv, 0), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_commit(NULL, KVTIER_END, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_truncate(NULL, "x", 0), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_snapshot(NULL, "x", 0, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK(no_space == (kvtier_space*)&marker && no_read == (kvtier_read_handle*)&marker);
  kvtier_client_destroy(NULL); /* NULL is fine for every destroy */
  kvtier_space_destroy(NULL);
  kvtier_read_destroy(NULL);
  kvtier_write_destroy(NULL);
  kvtier_free(NULL);

  /* NULL pointers and out-parameters. */
  CHECK_CODE(kvtier_put(space, NULL, 0, tokens, n, kv, sizeof kv, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_put(space, "x", 0, NULL, n, kv, sizeof kv, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_put(space, "x", 0, tokens, n, NULL, sizeof kv, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_begin_put(space, "x", 0, tokens, n, NULL, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_client_stats(client, NULL), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_length(space, "x", NULL, &length), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_can_resume(space, NULL, 0, &ok), KVTIER_INVALID_ARGUMENT);
  CHECK(ok == 7);

  /* Layouts: NULL, an unknown dtype, a block size out of bounds. */
  CHECK_CODE(kvtier_open(client, NULL, -1, &no_space), KVTIER_INVALID_ARGUMENT);
  l.dtype = 99;
  CHECK_CODE(kvtier_open(client, &l, -1, &no_space), KVTIER_INVALID_ARGUMENT);
  l = layout_for("c-api/bad-input");
  l.block_tokens = 7;
  CHECK_CODE(kvtier_open(client, &l, -1, &no_space), KVTIER_INVALID_ARGUMENT);
  /* The error names the field as kvtier_layout does. */
  CHECK(strstr(kvtier_last_error(), "block_tokens") != NULL);
  CHECK(strstr(kvtier_last_error(), "blockTokens") == NULL);
  l = layout_for(NULL);
  CHECK_CODE(kvtier_open(client, &l, -1, &no_space), KVTIER_INVALID_ARGUMENT);
  CHECK(no_space == (kvtier_space*)&marker);

  /* Wrong sizes: the daemon sees nothing, the sequence does not appear. */
  CHECK_OK(kvtier_client_stats(client, &before));
  CHECK_CODE(kvtier_put(space, "x", 0, tokens, n, kv, sizeof kv - 1, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_put(space, "x", 0, tokens, n, kv, sizeof kv + kTokenKvBytes, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_put(space, "x", 5, tokens, n, kv, sizeof kv, NULL, NULL),
             KVTIER_INVALID_ARGUMENT); /* begin past the end of a new sequence */
  memset(&bad_flags, 0, sizeof bad_flags);
  bad_flags.flags = 0x40;
  CHECK_CODE(kvtier_put(space, "x", 0, tokens, n, kv, sizeof kv, &bad_flags, NULL),
             KVTIER_INVALID_ARGUMENT);
  bad_flags.flags = 0;
  bad_flags.num_keys = 2; /* keys NULL */
  CHECK_CODE(kvtier_put(space, "x", 0, tokens, n, kv, sizeof kv, &bad_flags, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_OK(kvtier_length(space, "x", &exists, &length));
  CHECK(exists == 0);
  CHECK_OK(kvtier_client_stats(client, &after));
  CHECK(after.bytes_put == before.bytes_put && after.write_leases == 0);

  /* Handles: sizes and ranges. */
  CHECK_OK(kvtier_put(space, "y", 0, tokens, n, kv, sizeof kv, NULL, NULL));
  CHECK_OK(kvtier_get(space, "y", 0, KVTIER_END, &hit));
  memset(out, 0x5a, sizeof out);
  memcpy(sentinel, out, sizeof out);
  CHECK_CODE(kvtier_read_copy(hit, 0, n, out, sizeof out - 1), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_read_copy(hit, 0, n + 1, out, (n + 1) * kTokenKvBytes),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_read_copy(hit, 8, 4, out, 0), KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_read_copy(hit, 0, n, NULL, sizeof out), KVTIER_INVALID_ARGUMENT);
  CHECK(memcmp(out, sentinel, sizeof out) == 0);
  CHECK_CODE(kvtier_read_block(hit, 2, &data, &bytes), KVTIER_INVALID_ARGUMENT);
  CHECK(data == NULL && bytes == 0);
  CHECK_CODE(kvtier_read_info(hit, NULL), KVTIER_INVALID_ARGUMENT);
  kvtier_read_destroy(hit);
  CHECK_CODE(kvtier_space_get_info(space, NULL), KVTIER_INVALID_ARGUMENT);
  memset(&si, 0, sizeof si);
  CHECK_OK(kvtier_space_get_info(space, &si));
  CHECK(si.token_kv_bytes == kTokenKvBytes);

  CHECK(strcmp(kvtier_code_name(KVTIER_OK), "OK") == 0);
  CHECK(strcmp(kvtier_code_name(KVTIER_RELEASED), "RELEASED") == 0);
  CHECK(strcmp(kvtier_code_name((kvtier_code)999), "UNKNOWN") == 0);

  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* A released read handle: every call on it is RELEASED, and its pins are gone. */
static int test_use_after_release(void) {
  enum { n = 32 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_read_handle* hit = NULL;
  kvtier_handle_info info;
  kvtier_stats stats;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], out[n * kTokenKvBytes];
  const void* data = NULL;
  size_t bytes = 0;

  if (connect_and_open("c-api/use-after-release", 0, &client, &space)) return 1;
  fill_tokens(tokens, n, 6);
  fill_kv(kv, sizeof kv, 6);
  CHECK_OK(kvtier_put(space, "r", 0, tokens, n, kv, sizeof kv, NULL, NULL));
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_client_stats(client, &stats));
  CHECK(stats.blocks_pinned == 2 && stats.read_leases == 1);

  CHECK_OK(kvtier_read_release(hit));
  CHECK_CODE(kvtier_read_copy(hit, 0, n, out, sizeof out), KVTIER_RELEASED);
  CHECK(strncmp(kvtier_last_error(), "RELEASED: ", 10) == 0);
  CHECK_CODE(kvtier_read_block(hit, 0, &data, &bytes), KVTIER_RELEASED);
  CHECK(data == NULL);
  CHECK_CODE(kvtier_read_info(hit, &info), KVTIER_RELEASED);
  CHECK_CODE(kvtier_read_release(hit), KVTIER_RELEASED);
  /* The release reaches the daemon before this client's next call. */
  CHECK_OK(kvtier_client_stats(client, &stats));
  CHECK(stats.blocks_pinned == 0 && stats.read_leases == 0);
  kvtier_read_destroy(hit);

  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* Closing a client ends its connection at once: its leases go, its uncommitted writes vanish, and
 * every later call on it, its spaces and its handles is RELEASED. Handles are then destroyed in
 * any order. */
static int test_closed_client(void) {
  enum { n = 32 };
  kvtier_client* client = NULL;
  kvtier_client* watcher = NULL;
  kvtier_space* space = NULL;
  kvtier_space* watcher_space = NULL;
  kvtier_read_handle* hit = NULL;
  kvtier_write_handle* w = NULL;
  kvtier_stats stats;
  kvtier_handle_info info;
  kvtier_layout l = layout_for("c-api/closed-client");
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], out[n * kTokenKvBytes];
  int exists = -1, mapped = -1, tries;
  uint64_t length = 0;
  const struct timespec pause = {0, 5 * 1000 * 1000};

  if (connect_and_open("c-api/closed-client", 0, &client, &space)) return 1;
  if (connect_and_open("c-api/closed-client", 0, &watcher, &watcher_space)) return 1;
  fill_tokens(tokens, n, 7);
  fill_kv(kv, sizeof kv, 7);
  CHECK_OK(kvtier_put(space, "held", 0, tokens, n, kv, sizeof kv, NULL, NULL));
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_begin_put(space, "open-write", 0, tokens, 16, NULL, &w));

  CHECK_OK(kvtier_client_close(client));
  CHECK_CODE(kvtier_client_close(client), KVTIER_RELEASED);
  CHECK_CODE(kvtier_client_stats(client, &stats), KVTIER_RELEASED);
  CHECK_CODE(kvtier_client_mapped(client, &mapped), KVTIER_RELEASED);
  CHECK(mapped == -1);
  CHECK_CODE(kvtier_open(client, &l, -1, &space), KVTIER_RELEASED);
  CHECK_CODE(kvtier_put(space, "held", 0, tokens, n, kv, sizeof kv, NULL, NULL), KVTIER_RELEASED);
  CHECK_CODE(kvtier_length(space, "held", &exists, &length), KVTIER_RELEASED);
  CHECK_CODE(kvtier_read_copy(hit, 0, n, out, sizeof out), KVTIER_RELEASED);
  CHECK_CODE(kvtier_read_info(hit, &info), KVTIER_RELEASED);
  CHECK_CODE(kvtier_write(w, 0, 16, kv, 16 * kTokenKvBytes), KVTIER_RELEASED);
  CHECK_CODE(kvtier_commit(w, KVTIER_END, NULL), KVTIER_RELEASED);
  CHECK(strstr(kvtier_last_error(), "closed") != NULL);

  /* The daemon sees the connection end: the lease and the write go (it drops them as it notices
   * the closed socket, so the watcher waits for that, bounded). */
  for (tries = 0; tries < 2000; ++tries) {
    CHECK_OK(kvtier_client_stats(watcher, &stats));
    if (stats.read_leases == 0 && stats.write_leases == 0 && stats.clients == 1) break;
    nanosleep(&pause, NULL);
  }
  CHECK(stats.read_leases == 0 && stats.write_leases == 0 && stats.clients == 1);
  CHECK_OK(kvtier_length(watcher_space, "open-write", &exists, &length));
  CHECK(exists == 0);

  /* Destroyed client first, then the space, then the handles. */
  kvtier_client_destroy(client);
  kvtier_space_destroy(space);
  kvtier_read_destroy(hit);
  kvtier_write_destroy(w);

  kvtier_space_destroy(watcher_space);
  kvtier_client_destroy(watcher);
  return 0;
}

/* Destroying a client with its spaces and handles still alive closes it; they answer RELEASED. */
static int test_destroy_order(void) {
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_read_handle* hit = NULL;
  uint32_t tokens[16];
  kvtier_handle_info info;

  if (connect_and_open("c-api/destroy-order", 0, &client, &space)) return 1;
  fill_tokens(tokens, 16, 8);
  CHECK_OK(kvtier_lookup(space, tokens, 16, NULL, &hit));
  /* The space first: its handle keeps working. */
  kvtier_space_destroy(space);
  CHECK_OK(kvtier_read_info(hit, &info));
  CHECK(info.end == 0);
  kvtier_client_destroy(client);
  CHECK_CODE(kvtier_read_info(hit, &info), KVTIER_RELEASED);
  kvtier_read_destroy(hit);
  return 0;
}

/* A forked child cannot use its parent's handles (INVALID_ARGUMENT, nothing sent), may destroy
 * them harmlessly, and may connect on its own; the parent's client goes on working. */
static int child_after_fork(kvtier_client* client, kvtier_space* space) {
  enum { n = 16 };
  kvtier_stats stats;
  kvtier_client* own = NULL;
  kvtier_space* own_space = NULL;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes];
  int exists = -1;
  uint64_t length = 0;

  fill_tokens(tokens, n, 9);
  fill_kv(kv, sizeof kv, 9);
  CHECK_CODE(kvtier_client_stats(client, &stats), KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "forked") != NULL);
  CHECK_CODE(kvtier_put(space, "from-child", 0, tokens, n, kv, sizeof kv, NULL, NULL),
             KVTIER_INVALID_ARGUMENT);
  CHECK_CODE(kvtier_client_close(client), KVTIER_INVALID_ARGUMENT);
  kvtier_space_destroy(space);
  kvtier_client_destroy(client);

  if (connect_and_open("c-api/fork", 0, &own, &own_space)) return 1;
  CHECK_OK(kvtier_length(own_space, "from-child", &exists, &length));
  CHECK(exists == 0);
  kvtier_space_destroy(own_space);
  kvtier_client_destroy(own);
  return 0;
}

static int test_fork(void) {
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_stats stats;
  pid_t pid;
  int status = 0;

  if (connect_and_open("c-api/fork", 0, &client, &space)) return 1;
  fflush(NULL);
  pid = fork();
  CHECK(pid >= 0);
  if (pid == 0) _exit(child_after_fork(client, space));
  CHECK(waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  CHECK_OK(kvtier_client_stats(client, &stats));
  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* A client that does not map the pool: bytes travel inline and still round-trip; there is no
 * writable view, and a read view is the handle's private copy. */
static int test_inline_client(void) {
  enum { n = 32 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_write_handle* w = NULL;
  kvtier_read_handle* hit = NULL;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], out[n * kTokenKvBytes];
  int mapped = -1;
  void* wdata = NULL;
  const void* rdata = NULL;
  size_t bytes = 0;

  if (connect_and_open("c-api/inline", KVTIER_CONNECT_INLINE, &client, &space)) return 1;
  CHECK_OK(kvtier_client_mapped(client, &mapped));
  CHECK(mapped == 0);
  fill_tokens(tokens, n, 10);
  fill_kv(kv, sizeof kv, 10);
  CHECK_OK(kvtier_begin_put(space, "i", 0, tokens, n, NULL, &w));
  CHECK_CODE(kvtier_write_block(w, 0, &wdata, &bytes), KVTIER_NOT_SUPPORTED);
  CHECK(wdata == NULL);
  CHECK_OK(kvtier_write(w, 0, n, kv, sizeof kv));
  CHECK_OK(kvtier_commit(w, KVTIER_END, NULL));
  kvtier_write_destroy(w);
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_read_copy(hit, 0, n, out, sizeof out));
  CHECK(memcmp(out, kv, sizeof kv) == 0);
  CHECK_OK(kvtier_read_block(hit, 0, &rdata, &bytes));
  CHECK(rdata != NULL && bytes == kTokenKvBytes * kBlockTokens);
  kvtier_read_destroy(hit);
  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* One client, one space, several threads: each puts and looks up its own sequence. */
enum { kThreads = 4, kRounds = 20 };
struct thread_arg {
  kvtier_space* space;
  uint32_t seed;
  int failed;
};

static int thread_body(struct thread_arg* arg) {
  enum { n = 32 };
  uint32_t tokens[n];
  uint8_t kv[n * kTokenKvBytes], out[n * kTokenKvBytes]; /* 8 KiB of stack */
  char seq[32];
  kvtier_read_handle* hit = NULL;
  kvtier_handle_info info;
  for (int round = 0; round < kRounds; ++round) {
    const uint32_t seed = arg->seed * 1000u + (uint32_t)round;
    snprintf(seq, sizeof seq, "t%u", (unsigned)seed);
    fill_tokens(tokens, n, seed);
    fill_kv(kv, sizeof kv, seed);
    CHECK_OK(kvtier_put(arg->space, seq, 0, tokens, n, kv, sizeof kv, NULL, NULL));
    CHECK_OK(kvtier_lookup(arg->space, tokens, n, NULL, &hit));
    CHECK_OK(kvtier_read_info(hit, &info));
    CHECK(info.end == n);
    CHECK_OK(kvtier_read_copy(hit, 0, n, out, sizeof out));
    CHECK(memcmp(out, kv, sizeof kv) == 0);
    kvtier_read_destroy(hit);
  }
  return 0;
}

static void* thread_main(void* p) {
  struct thread_arg* arg = p;
  arg->failed = thread_body(arg);
  return NULL;
}

static int test_threads(void) {
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  pthread_t threads[kThreads];
  struct thread_arg args[kThreads];
  if (connect_and_open("c-api/threads", 0, &client, &space)) return 1;
  for (int i = 0; i < kThreads; ++i) {
    args[i].space = space;
    args[i].seed = 100u + (uint32_t)i;
    args[i].failed = 1;
    CHECK(pthread_create(&threads[i], NULL, thread_main, &args[i]) == 0);
  }
  for (int i = 0; i < kThreads; ++i) CHECK(pthread_join(threads[i], NULL) == 0);
  for (int i = 0; i < kThreads; ++i) CHECK(args[i].failed == 0);
  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

/* A byte of a block changed in the pool (a stray write of another process of the same user): a
 * copy or a check of that block is CHECKSUM_MISMATCH, and the daemon, told, drops the block, so
 * the next lookup stops before it. */
static int test_corrupt_block(void) {
  enum { n = 48 };
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_read_handle* hit = NULL;
  kvtier_handle_info info;
  uint32_t tokens[n];
  static uint8_t kv[n * kTokenKvBytes], out[n * kTokenKvBytes], want[n * kTokenKvBytes];
  const void* data = NULL;
  size_t bytes = 0;
  char* json = NULL;

  if (connect_and_open("c-api/corrupt-block", 0, &client, &space)) return 1;
  fill_tokens(tokens, n, 9);
  fill_kv(kv, sizeof kv, 9);
  CHECK_OK(kvtier_put(space, "r", 0, tokens, n, kv, sizeof kv, NULL, NULL));
  CHECK_OK(kvtier_remove(space, "r", 0, KVTIER_END));
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_read_verify(hit, 2));
  CHECK_CODE(kvtier_read_verify(hit, 3), KVTIER_INVALID_ARGUMENT);
  CHECK_OK(kvtier_read_block(hit, 1, &data, &bytes));
  ((uint8_t*)data)[bytes / 2] ^= 0x08;
  CHECK_CODE(kvtier_read_verify(hit, 1), KVTIER_CHECKSUM_MISMATCH);
  CHECK_CODE(kvtier_read_copy(hit, 0, n, out, sizeof out), KVTIER_CHECKSUM_MISMATCH);
  CHECK(strstr(kvtier_last_error(), "positions from 16") != NULL);
  kvtier_read_destroy(hit);
  CHECK_OK(kvtier_client_stats_json(client, &json));
  CHECK(strstr(json, "\"corrupt\": 1}") != NULL);
  kvtier_free(json);
  CHECK_OK(kvtier_lookup(space, tokens, n, NULL, &hit));
  CHECK_OK(kvtier_read_info(hit, &info));
  CHECK(info.end == 16 && info.block_count == 1);
  CHECK_OK(kvtier_read_copy(hit, 0, 16, out, 16 * kTokenKvBytes));
  pack_range(kv, n, 0, 16, want);
  CHECK(memcmp(out, want, 16 * kTokenKvBytes) == 0);
  CHECK_OK(kvtier_read_release(hit));
  CHECK_CODE(kvtier_read_verify(hit, 0), KVTIER_RELEASED);
  kvtier_read_destroy(hit);
  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  return 0;
}

struct test_case {
  const char* name;
  int (*run)(void);
};

static const struct test_case kCases[] = {
    {"PutLookupGet", test_put_lookup_get},
    {"BeginPutCommit", test_begin_put_commit},
    {"SequenceOps", test_sequence_ops},
    {"SnapshotRestore", test_snapshot_restore},
    {"BadInput", test_bad_input},
    {"UseAfterRelease", test_use_after_release},
    {"ClosedClient", test_closed_client},
    {"DestroyOrder", test_destroy_order},
    {"Fork", test_fork},
    {"InlineClient", test_inline_client},
    {"Threads", test_threads},
    {"CorruptBlock", test_corrupt_block},
};

int main(int argc, char** argv) {
  const size_t count = sizeof kCases / sizeof kCases[0];
  int passed = 0, failed = 0;
  if (argc > 2) {
    fprintf(stderr, "usage: %s [CASE]\n", argv[0]);
    return 2;
  }
  for (size_t i = 0; i < count; ++i) {
    if (argc == 2 && strcmp(argv[1], kCases[i].name) != 0) continue;
    if (kCases[i].run() == 0) {
      printf("[ OK ] %s\n", kCases[i].name);
      ++passed;
    } else {
      printf("[FAIL] %s\n", kCases[i].name);
      ++failed;
    }
    fflush(stdout);
  }
  if (passed + failed == 0) {
    fprintf(stderr, "no case named %s\n", argv[1]);
    return 2;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
