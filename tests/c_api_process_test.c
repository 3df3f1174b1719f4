/* The C ABI across processes and threads: a forked child, a client that cannot map the
 * pool (inline), and threads sharing one client. (tests/c_api_test.c has the runner). */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "c_api_test.h"

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

int test_fork(void) {
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
int test_inline_client(void) {
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

int test_threads(void) {
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
