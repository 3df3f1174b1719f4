// What the llama.cpp integration's tests, example and benchmark share: loading llama.cpp's CPU
// back ends and a model, generating a model with random weights (make_gguf.py), evaluating a
// prompt with a given batch split. Not part of the integration's API (kvtier/llama.h).
#pragma once

#include <llama.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvtier::llama::support {

// Loads llama.cpp's CPU back-end variants from `dir` ("" : $KVTIER_LLAMA_BACKEND_DIR, else the
// directory this build linked against) once per process, and keeps llama.cpp's log to errors
// ($KVTIER_LLAMA_LOG=1: everything). Without it no model runs.
void loadBackends(const std::string& dir = "");

struct ModelFree {
  void operator()(llama_model* m) const { llama_model_free(m); }
};
struct ContextFree {
  void operator()(llama_context* c) const { llama_free(c); }
};
using ModelPtr = std::unique_ptr<llama_model, ModelFree>;
using ContextPtr = std::unique_ptr<llama_context, ContextFree>;

// nullptr when llama.cpp cannot load the file.
ModelPtr loadModel(const std::string& path);

struct ContextSettings {
  uint32_t nCtx = 2048;
  uint32_t nSeq = 1;
  int threads = 1;
  bool flashAttn = true;
  ggml_type typeK = GGML_TYPE_F16, typeV = GGML_TYPE_F16;
};
// The context parameters for `s`: one batch may hold the whole context (the split is the
// caller's, through decode()).
llama_context_params contextParams(const ContextSettings& s);
ContextPtr makeContext(llama_model* model, const llama_context_params& params);

// Evaluates tokens[from, to) of `seq` at positions from..to-1, one llama_decode per run between
// consecutive `splits` (positions, ascending; those outside (from, to) are ignored), with the
// logits of the last token only. False when llama.cpp fails.
bool decode(llama_context* ctx, llama_seq_id seq, std::span<const llama_token> tokens, size_t from,
            size_t to, std::span<const size_t> splits = {});

// The logits of the last token decode() evaluated.
std::vector<float> lastLogits(llama_context* ctx);

// Text to tokens with the model's tokenizer (with BOS first when `bos`).
std::vector<llama_token> tokenize(const llama_model* model, const std::string& text,
                                  bool bos = true);

// `length` tokens drawn from `seed` among the model's ordinary tokens (deterministic).
std::vector<llama_token> randomTokens(const llama_model* model, uint64_t seed, size_t length);

// Writes a llama GGUF with random weights (make_gguf.py with Debian's python3, or $KVTIER_PYTHON):
// preset "tiny", "medium", "llama-1b" or a family's, extra arguments as the script takes them.
// Throws std::runtime_error on failure.
void makeModel(const std::string& path, const std::string& preset, uint64_t seed,
               const std::vector<std::string>& extraArgs = {});

}  // namespace kvtier::llama::support
