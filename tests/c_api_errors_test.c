/* The C ABI's refusals: bad input changing nothing, handles used after their release, a
 * closed client, destruction in any order, and a damaged block never served. (tests/c_api_test.c
 * has the runner). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "c_api_test.h"

/* Bad input: NULL handles and pointers, sizes that do not match, unknown enums and flags, no
 * daemon. Each is a typed error with a message, writes no out-parameter and changes nothing. */
int test_bad_input(void) {
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
int test_use_after_release(void) {
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
int test_closed_client(void) {
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
int test_destroy_order(void) {
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

/* A byte of a block changed in the pool (a stray write of another process of the same user): a
 * copy or a check of that block is CHECKSUM_MISMATCH, and the daemon, told, drops the block, so
 * the next lookup stops before it. */
int test_corrupt_block(void) {
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
