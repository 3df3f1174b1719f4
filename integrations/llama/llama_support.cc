#include "integrations/llama/llama_support.h"

#include <ggml-backend.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

namespace kvtier::llama::support {
namespace {

void quietLog(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

}  // namespace

void loadBackends(const std::string& dir) {
  static std::once_flag once;
  std::call_once(once, [&] {
    const char* verbose = std::getenv("KVTIER_LLAMA_LOG");
    if (!(verbose && std::string(verbose) == "1")) llama_log_set(quietLog, nullptr);
    std::string from = dir;
    if (from.empty()) {
      const char* env = std::getenv("KVTIER_LLAMA_BACKEND_DIR");
      from = env && *env ? env : KVTIER_LLAMA_BACKEND_DIR;
    }
    ggml_backend_load_all_from_path(from.c_str());
    llama_backend_init();
  });
}

ModelPtr loadModel(const std::string& path) {
  loadBackends();
  llama_model_params mp = llama_model_default_params();
  return ModelPtr(llama_model_load_from_file(path.c_str(), mp));
}

llama_context_params contextParams(const ContextSettings& s) {
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = s.nCtx;
  cp.n_batch = s.nCtx;
  cp.n_ubatch = s.nCtx;
  cp.n_seq_max = s.nSeq;
  cp.n_threads = s.threads;
  cp.n_threads_batch = s.threads;
  cp.flash_attn_type = s.flashAttn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  cp.type_k = s.typeK;
  cp.type_v = s.typeV;
  cp.no_perf = true;
  return cp;
}

ContextPtr makeContext(llama_model* model, const llama_context_params& params) {
  return ContextPtr(llama_init_from_model(model, params));
}

bool decode(llama_context* ctx, llama_seq_id seq, std::span<const llama_token> tokens, size_t from,
            size_t to, std::span<const size_t> splits) {
  if (from >= to) return true;
  llama_batch batch = llama_batch_init(static_cast<int32_t>(to - from), 0, 1);
  size_t begin = from;
  bool ok = true;
  size_t next = 0;
  while (ok && begin < to) {
    while (next < splits.size() && splits[next] <= begin) ++next;
    const size_t end = next < splits.size() && splits[next] < to ? splits[next] : to;
    batch.n_tokens = static_cast<int32_t>(end - begin);
    for (size_t i = begin; i < end; ++i) {
      const size_t j = i - begin;
      batch.token[j] = tokens[i];
      batch.pos[j] = static_cast<llama_pos>(i);
      batch.n_seq_id[j] = 1;
      batch.seq_id[j][0] = seq;
      batch.logits[j] = i + 1 == end;
    }
    ok = llama_decode(ctx, batch) == 0;
    begin = end;
  }
  llama_batch_free(batch);
  return ok;
}

std::vector<float> lastLogits(llama_context* ctx) {
  const llama_vocab* vocab = llama_model_get_vocab(llama_get_model(ctx));
  const float* logits = llama_get_logits_ith(ctx, -1);
  if (logits == nullptr) return {};
  return std::vector<float>(logits, logits + llama_vocab_n_tokens(vocab));
}

std::vector<llama_token> tokenize(const llama_model* model, const std::string& text, bool bos) {
  const llama_vocab* vocab = llama_model_get_vocab(model);
  std::vector<llama_token> out(text.size() + 8);
  int32_t n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                             static_cast<int32_t>(out.size()), bos, false);
  if (n < 0) {
    out.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab, text.data(), static_cast<int32_t>(text.size()), out.data(),
                       static_cast<int32_t>(out.size()), bos, false);
  }
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

std::vector<llama_token> randomTokens(const llama_model* model, uint64_t seed, size_t length) {
  const int32_t nVocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  // splitmix64: a fixed, portable sequence for a seed.
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  std::vector<llama_token> out(length);
  for (auto& t : out) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    // Skip the three control tokens (<unk>, <s>, </s>) of the generated vocabularies.
    t = static_cast<llama_token>(3 + z % static_cast<uint64_t>(nVocab - 3));
  }
  return out;
}

void makeModel(const std::string& path, const std::string& preset, uint64_t seed,
               const std::vector<std::string>& extraArgs) {
  // Debian's python3 (with python3-numpy), unless $KVTIER_PYTHON names another interpreter with
  // NumPy (a machine whose NumPy is elsewhere, as on a PyTorch image).
  const char* python = std::getenv("KVTIER_PYTHON");
  std::vector<std::string> args = {python && *python ? python : "/usr/bin/python3",
                                   KVTIER_MAKE_GGUF_PATH,
                                   "--preset",
                                   preset,
                                   "--seed",
                                   std::to_string(seed),
                                   "--out",
                                   path};
  args.insert(args.end(), extraArgs.begin(), extraArgs.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // The script prints a summary line; the caller's stdout is for its own protocol.
    if (std::FILE* null = std::fopen("/dev/null", "w")) ::dup2(fileno(null), STDOUT_FILENO);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("make_gguf.py failed for " + path);
  }
}

}  // namespace kvtier::llama::support
