/* A user's C program on an installed kvtier (C ABI): puts a prompt's KV, looks it up again and
 * checks every byte. Exit 0 on success.
 *   consumer_c NAME     (the daemon's socket in $KVTIER_SOCKET) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier/kvtier.h"

#define N 48

static int fail(const char* name, const char* what) {
  fprintf(stderr, "%s: %s: %s\n", name, what, kvtier_last_error());
  return 1;
}

int main(int argc, char** argv) {
  const char* name = argc > 1 ? argv[1] : "consumer_c";
  char model[64];
  kvtier_client* client = NULL;
  kvtier_space* space = NULL;
  kvtier_read_handle* hit = NULL;
  kvtier_handle_info info;
  kvtier_layout layout;
  uint32_t tokens[N];
  static uint8_t kv[N * 128], got[N * 128];
  size_t i;

  snprintf(model, sizeof model, "consumer/%s", name);
  memset(&layout, 0, sizeof layout);
  layout.model_id = model;
  layout.num_layers = 2;
  layout.num_kv_heads = 2;
  layout.head_dim = 8;
  layout.dtype = KVTIER_DTYPE_F16;
  layout.block_tokens = 16; /* 128 bytes of K and V per token */
  for (i = 0; i < N; ++i) tokens[i] = (uint32_t)(i * 17 + 3);
  for (i = 0; i < sizeof kv; ++i) kv[i] = (uint8_t)(i * 7 + 1);

  if (kvtier_connect(getenv("KVTIER_SOCKET"), name, 0, &client) != KVTIER_OK)
    return fail(name, "connect");
  if (kvtier_open(client, &layout, -1, &space) != KVTIER_OK) return fail(name, "open");
  if (kvtier_put(space, "prompt", 0, tokens, N, kv, sizeof kv, NULL, NULL) != KVTIER_OK)
    return fail(name, "put");
  if (kvtier_lookup(space, tokens, N, NULL, &hit) != KVTIER_OK) return fail(name, "lookup");
  if (kvtier_read_info(hit, &info) != KVTIER_OK || info.end != N) return fail(name, "matched");
  if (kvtier_read_copy(hit, 0, N, got, sizeof got) != KVTIER_OK) return fail(name, "copy");
  if (memcmp(got, kv, sizeof kv) != 0) {
    fprintf(stderr, "%s: the bytes read back differ from those put\n", name);
    return 1;
  }
  kvtier_read_destroy(hit);
  kvtier_space_destroy(space);
  kvtier_client_destroy(client);
  printf("%s: put %d tokens through the C ABI, looked them up, %zu bytes equal\n", name, N,
         sizeof kv);
  return 0;
}
