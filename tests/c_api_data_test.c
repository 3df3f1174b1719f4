/* The C ABI's data path: put, lookup and get, a write lease's begin and commit, the
 * sequence calls and snapshots. (tests/c_api_test.c has the runner). */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "c_api_test.h"

/* put, then lookup and get give the same bytes back: copied packed, and in place per block. */
int test_put_lookup_get(void) {
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
int test_begin_put_commit(void) {
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
int test_sequence_ops(void) {
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
int test_snapshot_restore(void) {
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
