/* Tests of the C ABI (kvtier/kvtier.h), written in C99 and compiled as C: they see exactly what a
 * C program sees. Run against a real kvtierd by tests/with_daemon.sh, which sets KVTIER_SOCKET
 * and cleans up the daemon, its data directory, socket and segments whatever happens here.
 *
 *   kvtier_c_api_test CASE    runs one case (ctest registers each as CApi.CASE)
 *   kvtier_c_api_test         runs them all
 *
 * The cases are in c_api_data_test.c, c_api_errors_test.c and c_api_process_test.c, the checks
 * and helpers they share in c_api_test.h; this file has the helpers and the runner. Each case
 * opens its own namespace (a layout with the case's model id), so cases never see each other's
 * blocks. A failed check prints where, what and the library's last error, and fails the
 * case; the wrapper's cleanup still runs. */
#define _POSIX_C_SOURCE 200809L

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_api_test.h"

kvtier_layout layout_for(const char* model_id) {
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

const char* socket_path(void) {
  const char* s = getenv("KVTIER_SOCKET");
  return s ? s : "kvtier-data/kvtierd.sock";
}

/* Tokens and packed KV bytes that differ per seed. */
void fill_tokens(uint32_t* tokens, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) tokens[i] = seed * 100003u + (uint32_t)i * 7919u + 1u;
}

void fill_kv(uint8_t* kv, size_t bytes, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1103515245u + 12345u;
    kv[i] = (uint8_t)(x >> 16);
  }
}

/* Packed bytes of positions [from, to) out of a packed buffer of `n` tokens starting at 0. */
void pack_range(const uint8_t* packed, size_t n, size_t from, size_t to, uint8_t* out) {
  for (size_t lkv = 0; lkv < 2 * kLayers; ++lkv) {
    memcpy(out + lkv * (to - from) * kTokenBytes, packed + (lkv * n + from) * kTokenBytes,
           (to - from) * kTokenBytes);
  }
}

int connect_and_open(const char* model_id, uint32_t flags, kvtier_client** client,
                     kvtier_space** space) {
  kvtier_layout l = layout_for(model_id);
  CHECK_OK(kvtier_connect(socket_path(), "c-api-test", flags, client));
  CHECK_OK(kvtier_open(*client, &l, -1, space));
  return 0;
}

/* Every byte of positions [0, n) of `seq`, read back with get, equals `expected` (packed). */
int check_sequence(kvtier_space* space, const char* seq, const uint8_t* expected, size_t n) {
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
