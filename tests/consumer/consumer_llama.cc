// A user's llama.cpp program on an installed kvtier (kvtier/llama.h, kvtier::llama): evaluates a
// prompt and stores its KV in kvtier, then empties the sequence and restores the prompt's whole
// blocks from kvtier. Exit 0 when the restore brought back every whole block that was stored.
//   consumer_llama MODEL.gguf     (the daemon's socket in $KVTIER_SOCKET)
#include <llama.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "kvtier/llama.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer_llama MODEL.gguf\n");
    return 2;
  }
  const char* socket = std::getenv("KVTIER_SOCKET");
  // llama.cpp's log: errors only.
  llama_log_set(
      [](ggml_log_level level, const char* text, void*) {
        if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
      },
      nullptr);
  ggml_backend_load_all_from_path(LLAMA_BACKEND_DIR);
  llama_backend_init();
  std::unique_ptr<llama_model, decltype(&llama_model_free)> model(
      llama_model_load_from_file(argv[1], llama_model_default_params()), &llama_model_free);
  if (!model) {
    std::fprintf(stderr, "consumer_llama: llama.cpp cannot load %s\n", argv[1]);
    return 1;
  }
  llama_context_params params = llama_context_default_params();
  params.n_ctx = params.n_batch = params.n_ubatch = 512;
  params.n_threads = params.n_threads_batch = 1;
  std::unique_ptr<llama_context, decltype(&llama_free)> ctx(
      llama_init_from_model(model.get(), params), &llama_free);
  if (!ctx) {
    std::fprintf(stderr, "consumer_llama: no context\n");
    return 1;
  }

  kvtier::llama::CacheOptions options;
  options.socketPath = socket ? socket : "kvtier-data/kvtierd.sock";
  options.clientName = "consumer-llama";
  options.modelPath = argv[1];
  options.contextParams = params;
  auto cache = kvtier::llama::PrefixCache::open(ctx.get(), options);
  if (!cache) {
    std::fprintf(stderr, "consumer_llama: open: %s\n", cache.error().toString().c_str());
    return 1;
  }
  // 200 ordinary tokens of the model's vocabulary (past its control tokens).
  const int32_t vocab = llama_vocab_n_tokens(llama_model_get_vocab(model.get()));
  std::vector<llama_token> prompt(200);
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = 3 + static_cast<llama_token>(i * 7919 % (vocab - 3));

  auto before = (*cache)->restore(0, prompt.data(), prompt.size() - 1);
  if (!before || before->tokens != 0) {
    std::fprintf(stderr, "consumer_llama: a fresh daemon restored something\n");
    return 1;
  }
  auto prefill = (*cache)->prefill(0, prompt.data(), prompt.size(), 0);
  if (!prefill) {
    std::fprintf(stderr, "consumer_llama: prefill: %s\n", prefill.error().toString().c_str());
    return 1;
  }
  auto stored = (*cache)->store(0, prompt.data(), prompt.size());
  if (!stored) {
    std::fprintf(stderr, "consumer_llama: store: %s\n", stored.error().toString().c_str());
    return 1;
  }
  llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, -1, -1);
  auto after = (*cache)->restore(0, prompt.data(), prompt.size() - 1);
  const uint32_t blocks = (*cache)->layout().blockTokens;
  const uint32_t expected = static_cast<uint32_t>((prompt.size() - 1) / blocks * blocks);
  if (!after || after->tokens != expected || expected == 0) {
    std::fprintf(stderr, "consumer_llama: restored %u tokens, expected %u\n",
                 after ? after->tokens : 0, expected);
    return 1;
  }
  std::printf(
      "consumer_llama: stored %u tokens' blocks, restored %u tokens into an empty sequence\n",
      stored->storedTokens + stored->cachedTokens, after->tokens);
  return 0;
}
