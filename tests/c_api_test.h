/* What the C ABI tests share (tests/c_api_*.c, one program: kvtier_c_api_test): the checks,
 * the layout every case opens, and helpers that connect, fill tokens and KV and read a
 * sequence back. Each case is a function returning 0 when it passed. */
#ifndef KVTIER_TESTS_C_API_TEST_H
#define KVTIER_TESTS_C_API_TEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

kvtier_layout layout_for(const char* model_id);
/* $KVTIER_SOCKET, else the default data directory's socket. */
const char* socket_path(void);
/* Tokens and packed KV bytes that differ per seed. */
void fill_tokens(uint32_t* tokens, size_t n, uint32_t seed);
void fill_kv(uint8_t* kv, size_t bytes, uint32_t seed);
/* Packed bytes of positions [from, to) out of a packed buffer of `n` tokens starting at 0. */
void pack_range(const uint8_t* packed, size_t n, size_t from, size_t to, uint8_t* out);
/* Connects (flags: kvtier_connect's) and opens layout_for(model_id). */
int connect_and_open(const char* model_id, uint32_t flags, kvtier_client** client,
                     kvtier_space** space);
/* Every byte of positions [0, n) of `seq`, read back with get, equals `expected` (packed). */
int check_sequence(kvtier_space* space, const char* seq, const uint8_t* expected, size_t n);

/* The cases (kvtier_c_api_test CASE). */
/* c_api_data_test.c */
int test_put_lookup_get(void);
int test_begin_put_commit(void);
int test_sequence_ops(void);
int test_snapshot_restore(void);
/* c_api_errors_test.c */
int test_bad_input(void);
int test_use_after_release(void);
int test_closed_client(void);
int test_destroy_order(void);
int test_corrupt_block(void);
/* c_api_process_test.c */
int test_fork(void);
int test_inline_client(void);
int test_threads(void);

#endif /* KVTIER_TESTS_C_API_TEST_H */
