// Two llama.cpp processes sharing a prompt's KV through kvtier.
//
//   kvtier-llama-example --model M --document FILE [--max-bytes N] [--question TEXT] [--socket S]
//
// Each run evaluates the prompt "document, then question" with llama.cpp: first it restores from
// kvtier the longest cached prefix of whole blocks, evaluates only the rest, prints the time to
// first token, and stores its own whole blocks for the next process. Then, unless --no-verify,
// it evaluates the same prompt again in a fresh context without kvtier (the same batch split)
// and prints that time to first token and whether the logits are equal bit for bit.
//
// The first process (no cached prefix) pays for the document; a second one, started later with
// another question about the same document, restores the document and evaluates its question.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integrations/llama/llama_support.h"
#include "kvtier/llama.h"

namespace sup = kvtier::llama::support;
using Clock = std::chrono::steady_clock;

namespace {

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

int usage() {
  std::fprintf(stderr,
               "usage: kvtier-llama-example --model M.gguf --document FILE [--max-bytes N]\n"
               "         [--question TEXT]\n"
               "         [--socket kvtier-data/kvtierd.sock] [--threads 1] [--block 64]\n"
               "         [--no-verify]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string modelPath, documentPath, question, socket = "kvtier-data/kvtierd.sock";
  int threads = 1;
  uint32_t block = kvtier::llama::CacheOptions{}.blockTokens;
  size_t maxBytes = 0;  // 0: the whole document
  bool verify = true;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--no-verify") {
      verify = false;
      continue;
    }
    if (i + 1 >= argc) return usage();
    std::string v = argv[++i];
    if (k == "--model") modelPath = v;
    else if (k == "--document") documentPath = v;
    else if (k == "--question") question = v;
    else if (k == "--socket") socket = v;
    else if (k == "--threads") threads = std::stoi(v);
    else if (k == "--block") block = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--max-bytes") maxBytes = std::stoull(v);
    else return usage();
  }
  if (modelPath.empty() || documentPath.empty()) return usage();
  std::ifstream in(documentPath);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", documentPath.c_str());
    return 1;
  }
  std::stringstream text;
  text << in.rdbuf();
  const int pid = static_cast<int>(::getpid());

  sup::ModelPtr model = sup::loadModel(modelPath);
  if (!model) {
    std::fprintf(stderr, "llama.cpp cannot load %s\n", modelPath.c_str());
    return 1;
  }
  // The prompt: the document's tokens, then the question's (so a question never changes how the
  // document tokenizes).
  std::string document = text.str();
  if (maxBytes > 0 && document.size() > maxBytes) document.resize(maxBytes);
  std::vector<llama_token> prompt = sup::tokenize(model.get(), document);
  if (!question.empty()) {
    auto q = sup::tokenize(model.get(), "\n" + question, false);
    prompt.insert(prompt.end(), q.begin(), q.end());
  }
  sup::ContextSettings settings;
  settings.threads = threads;
  settings.nCtx = static_cast<uint32_t>(prompt.size() + 64);
  const llama_context_params cp = sup::contextParams(settings);
  sup::ContextPtr ctx = sup::makeContext(model.get(), cp);
  if (!ctx) {
    std::fprintf(stderr, "llama.cpp cannot make a context of %u tokens\n", settings.nCtx);
    return 1;
  }

  kvtier::llama::CacheOptions options;
  options.socketPath = socket;
  options.modelPath = modelPath;
  options.contextParams = cp;
  options.blockTokens = block;
  auto opened = kvtier::llama::PrefixCache::open(ctx.get(), options);
  if (!opened.ok()) {
    std::fprintf(stderr, "kvtier: %s\n", opened.error().toString().c_str());
    return 1;
  }
  auto& cache = *opened.value();
  char desc[128];
  llama_model_desc(model.get(), desc, sizeof(desc));
  std::printf("[pid %d] model %s (%s, %.1f M parameters); kvtier blocks of %u tokens, %.0f KiB\n",
              pid, modelPath.c_str(), desc, llama_model_n_params(model.get()) / 1e6, block,
              cache.layout().blockBytes() / 1024.0);

  // Time to first token with kvtier: restore, then evaluate the rest. Batches end on block
  // boundaries (the whole blocks first, then the tail), so that what this process stores is
  // what a recompute with the same split computes.
  const auto t0 = Clock::now();
  auto restored = cache.restore(0, prompt.data(), prompt.size() - 1);
  if (!restored.ok()) {
    std::fprintf(stderr, "kvtier: %s\n", restored.error().toString().c_str());
    return 1;
  }
  const size_t have = restored->tokens;
  const double restoreMs = msSince(t0);
  const size_t wholeEnd = prompt.size() / block * block;
  const std::vector<size_t> splits = {have, wholeEnd};
  if (!sup::decode(ctx.get(), 0, prompt, have, prompt.size(), splits)) {
    std::fprintf(stderr, "llama_decode failed\n");
    return 1;
  }
  const std::vector<float> logits = sup::lastLogits(ctx.get());
  const double ttft = msSince(t0);
  std::printf("[pid %d] prompt of %zu tokens: %zu restored from kvtier (%.1f MiB in %.1f ms)%s, "
              "%zu evaluated\n",
              pid, prompt.size(), have, restored->bytes / 1048576.0, restoreMs,
              restored->unavailable ? " [kvtierd not reachable]" : "", prompt.size() - have);
  std::printf("[pid %d] time to first token with kvtier: %.1f ms\n", pid, ttft);

  auto stored = cache.store(0, prompt.data(), prompt.size());
  if (stored.ok()) {
    std::printf("[pid %d] stored %u new tokens in kvtier (%u were there already)\n", pid,
                stored->storedTokens, stored->cachedTokens);
  } else {
    std::printf("[pid %d] not stored: %s\n", pid, stored.error().toString().c_str());
  }

  if (verify) {
    sup::ContextPtr fresh = sup::makeContext(model.get(), cp);
    const auto t1 = Clock::now();
    if (!fresh || !sup::decode(fresh.get(), 0, prompt, 0, prompt.size(), splits)) {
      std::fprintf(stderr, "recompute failed\n");
      return 1;
    }
    const std::vector<float> reference = sup::lastLogits(fresh.get());
    const double ttftRecompute = msSince(t1);
    const bool equal = reference.size() == logits.size() &&
                       std::memcmp(reference.data(), logits.data(),
                                   logits.size() * sizeof(float)) == 0;
    std::printf("[pid %d] time to first token without kvtier (recompute): %.1f ms (%.1fx)\n", pid,
                ttftRecompute, ttftRecompute / ttft);
    std::printf("[pid %d] next-token logits equal to the recompute's, bit for bit: %s\n", pid,
                equal ? "yes" : "NO");
    if (!equal) return 1;
  }
  return 0;
}
