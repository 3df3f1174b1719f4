// A llama model with random weights generated for a test (make_gguf.py) and loaded: the file lives
// in a temporary directory removed with the object, after the model is freed.
#pragma once

#include <stdexcept>
#include <string>

#include "integrations/llama/llama_support.h"
#include "tests/temp_dir.h"

namespace kvtier::llama::support {

class GeneratedModel {
 public:
  GeneratedModel(const std::string& preset, uint64_t seed) {
    makeModel(path(), preset, seed);
    model_ = loadModel(path());
    if (!model_) throw std::runtime_error("llama.cpp cannot load " + path());
  }
  std::string path() const { return dir_.file("model.gguf"); }
  llama_model* get() const { return model_.get(); }
  const test::TempDir& dir() const { return dir_; }

 private:
  test::TempDir dir_;  // declared first: removed after the model is freed
  ModelPtr model_;
};

}  // namespace kvtier::llama::support
