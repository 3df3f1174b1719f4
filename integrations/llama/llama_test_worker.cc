// A llama.cpp process for the integration's tests (llama_integration_test.cc): it loads a model,
// evaluates prompts with kvtier's PrefixCache (or without, for the recompute the tests compare
// with) and reports on stdout, one line per event, so that every engine runs in a process of its
// own against a real kvtierd.
//
//   kvtier_llama_worker MODE --model M [--socket S] [--prompt SPEC]... [options]
//   MODE  store       evaluate each prompt (sequence i gets the i-th) and store it
//         restore     restore each prompt's cached prefix (all but its last token), evaluate the
//                     rest, write the last logits of sequence i to LOGITS.i
//         recompute   the same without kvtier
//         nonempty    evaluate 8 tokens into sequence 0, then try to restore into it
//         store-loop  store prompts of a growing seed, one after another, until killed
//         prefill     restore each prompt's cached prefix (all but its last token), then
//                     PrefixCache::prefill the rest (storing as it goes), write the logits
//         chat        a turn: restore and prefill the prompt, then evaluate the --answer tokens
//                     one llama_decode each (as a decode loop does) and store at the turn's end
//         corrupt     look the prompt up as the cache would and flip one byte of its state (or,
//                     with --corrupt-block B, of its block B) in the pool, as a stray write
//         prefill-loop  prefill prompts of a growing seed, one after another, until killed
//   SPEC  SEED:LEN[+SEED:LEN...]  the concatenation of randomTokens(SEED, LEN) runs
//   --split P[,P...]  batch boundaries (positions) of every evaluation
//   --fa on|off, --type-k/--type-v f16|f32|q8_0, --block N, --ctx N, --logits PATH
//   --scratch on  a unified KV cache whose last sequence is the cache's (CacheOptions::scratchSeq)
//   --pipeline off  restores in steps on one thread (CacheOptions::pipelineRestores)
//   --adapters S  CacheOptions::adapters (the adapters the context is said to apply)
//   --wait-fifo PATH  after opening the cache, wait for one byte on this FIFO
//   --checkpoint N  CacheOptions::checkpointTokens;  --answer SPEC  the chat mode's answer
//   --threads N  llama.cpp's threads
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "integrations/llama/llama_support.h"
#include "kvtier/llama.h"

namespace sup = kvtier::llama::support;

namespace {

struct Args {
  std::string mode, model, socket, logits, waitFifo, adapters, answer;
  uint32_t checkpoint = 0;
  int corruptBlock = -1;  // -1: the state
  std::vector<std::string> prompts;
  std::vector<size_t> splits;
  sup::ContextSettings ctx;
  uint32_t block = 32;
  bool scratch = false;  // a unified KV cache with one more sequence, the cache's scratch
  bool pipeline = true;  // CacheOptions::pipelineRestores
};

ggml_type typeOf(const std::string& s) {
  if (s == "f32") return GGML_TYPE_F32;
  if (s == "q8_0") return GGML_TYPE_Q8_0;
  return GGML_TYPE_F16;
}

std::vector<llama_token> promptOf(const llama_model* model, const std::string& spec) {
  std::vector<llama_token> out;
  std::stringstream parts(spec);
  std::string part;
  while (std::getline(parts, part, '+')) {
    const size_t colon = part.find(':');
    auto run = sup::randomTokens(model, std::stoull(part.substr(0, colon)),
                                 std::stoull(part.substr(colon + 1)));
    out.insert(out.end(), run.begin(), run.end());
  }
  return out;
}

int fail(const std::string& what) {
  std::printf("error %s\n", what.c_str());
  std::fflush(stdout);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  Args a;
  if (argc < 2) return fail("usage: kvtier_llama_worker MODE --model M ...");
  a.mode = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      a.model = v;
    else if (k == "--socket")
      a.socket = v;
    else if (k == "--prompt")
      a.prompts.push_back(v);
    else if (k == "--logits")
      a.logits = v;
    else if (k == "--wait-fifo")
      a.waitFifo = v;
    else if (k == "--fa")
      a.ctx.flashAttn = v == "on";
    else if (k == "--type-k")
      a.ctx.typeK = typeOf(v);
    else if (k == "--type-v")
      a.ctx.typeV = typeOf(v);
    else if (k == "--block")
      a.block = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--ctx")
      a.ctx.nCtx = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--scratch")
      a.scratch = v == "on";
    else if (k == "--pipeline")
      a.pipeline = v == "on";
    else if (k == "--adapters")
      a.adapters = v;
    else if (k == "--answer")
      a.answer = v;
    else if (k == "--checkpoint")
      a.checkpoint = static_cast<uint32_t>(std::stoul(v));
    else if (k == "--corrupt-block")
      a.corruptBlock = std::stoi(v);
    else if (k == "--threads")
      a.ctx.threads = std::stoi(v);
    else if (k == "--split") {
      std::stringstream ss(v);
      std::string p;
      while (std::getline(ss, p, ',')) a.splits.push_back(std::stoull(p));
    } else
      return fail("unknown option " + k);
  }
  a.ctx.nSeq = std::max<uint32_t>(1, static_cast<uint32_t>(a.prompts.size())) + (a.scratch ? 1 : 0);

  sup::ModelPtr model = sup::loadModel(a.model);
  if (!model) return fail("cannot load " + a.model);
  llama_context_params cp = sup::contextParams(a.ctx);
  cp.kv_unified = a.scratch;
  sup::ContextPtr ctx = sup::makeContext(model.get(), cp);
  if (!ctx) return fail("cannot make a context");

  std::unique_ptr<kvtier::llama::PrefixCache> cache;
  if (a.mode != "recompute") {
    kvtier::llama::CacheOptions opts;
    opts.socketPath = a.socket;
    opts.modelPath = a.model;
    opts.contextParams = cp;
    opts.blockTokens = a.block;
    if (a.scratch) opts.scratchSeq = static_cast<llama_seq_id>(a.ctx.nSeq - 1);
    opts.pipelineRestores = a.pipeline;
    opts.adapters = a.adapters;
    opts.checkpointTokens = a.checkpoint;
    auto c = kvtier::llama::PrefixCache::open(ctx.get(), opts);
    if (!c.ok()) return fail(c.error().toString());
    cache = std::move(c.value());
    std::printf("opened %s\n", cache->layout().modelId.c_str());
    std::printf("memory %s state %llu checkpoint %u\n", cache->memoryKind(),
                static_cast<unsigned long long>(cache->stateBytes()), cache->checkpointTokens());
  }
  if (!a.waitFifo.empty()) {
    std::printf("waiting\n");
    int fd = ::open(a.waitFifo.c_str(), O_RDONLY);
    char byte;
    if (fd < 0 || ::read(fd, &byte, 1) != 1) return fail("fifo");
    ::close(fd);
  }

  std::vector<std::vector<llama_token>> prompts;
  for (const auto& spec : a.prompts) prompts.push_back(promptOf(model.get(), spec));

  if (a.mode == "store") {
    for (size_t s = 0; s < prompts.size(); ++s) {
      const auto& p = prompts[s];
      if (!sup::decode(ctx.get(), static_cast<llama_seq_id>(s), p, 0, p.size(), a.splits)) {
        return fail("decode");
      }
      auto r = cache->store(static_cast<llama_seq_id>(s), p.data(), p.size());
      if (!r.ok()) return fail(r.error().toString());
      std::printf("stored %u cached %u\n", r->storedTokens, r->cachedTokens);
    }
    return 0;
  }

  if (a.mode == "restore" || a.mode == "recompute") {
    for (size_t s = 0; s < prompts.size(); ++s) {
      const auto& p = prompts[s];
      const auto seq = static_cast<llama_seq_id>(s);
      size_t have = 0;
      if (cache) {
        auto r = cache->restore(seq, p.data(), p.size() - 1);
        if (!r.ok()) return fail(r.error().toString());
        have = r->tokens;
        std::printf("restored %u unavailable %d\n", r->tokens, r->unavailable ? 1 : 0);
      }
      if (!sup::decode(ctx.get(), seq, p, have, p.size(), a.splits)) return fail("decode");
      std::vector<float> logits = sup::lastLogits(ctx.get());
      std::ofstream out(a.logits + "." + std::to_string(s), std::ios::binary);
      out.write(reinterpret_cast<const char*>(logits.data()),
                static_cast<std::streamsize>(logits.size() * sizeof(float)));
      if (!out) return fail("cannot write logits");
    }
    if (cache) {
      // The daemon may have gone under us: a store then fails, and says how.
      auto r = cache->store(0, prompts[0].data(), prompts[0].size());
      std::printf("store %s\n", r.ok() ? "ok" : kvtier::errorName(r.code()));
      std::printf("stats restoreCorrupt %llu\n",
                  static_cast<unsigned long long>(cache->stats().restoreCorrupt));
    }
    std::printf("done\n");
    return 0;
  }

  // Writes the last logits of sequence `s` to LOGITS.s.
  auto writeLogits = [&](size_t s) {
    std::vector<float> logits = sup::lastLogits(ctx.get());
    std::ofstream out(a.logits + "." + std::to_string(s), std::ios::binary);
    out.write(reinterpret_cast<const char*>(logits.data()),
              static_cast<std::streamsize>(logits.size() * sizeof(float)));
    return static_cast<bool>(out);
  };
  // Restores prompt p into seq and prefills the rest; prints what happened.
  auto restoreAndPrefill = [&](llama_seq_id seq, const std::vector<llama_token>& p) -> bool {
    auto r = cache->restore(seq, p.data(), p.size() - 1);
    if (!r.ok()) return fail(r.error().toString()) == 0;
    std::printf("restored %u unavailable %d\n", r->tokens, r->unavailable ? 1 : 0);
    auto f = cache->prefill(seq, p.data(), p.size(), r->tokens);
    if (!f.ok()) return fail(f.error().toString()) == 0;
    std::printf("prefill evaluated %u stored %u states %u chunks %u failed %d\n",
                f->evaluatedTokens, f->storedTokens, f->states, f->chunks, f->storeFailed ? 1 : 0);
    return true;
  };

  if (a.mode == "prefill") {
    for (size_t s = 0; s < prompts.size(); ++s) {
      if (!restoreAndPrefill(static_cast<llama_seq_id>(s), prompts[s])) return 1;
      if (!a.logits.empty() && !writeLogits(s)) return fail("cannot write logits");
    }
    const auto& st = cache->stats();
    std::printf("stats restoreCorrupt %llu statesStored %llu statesRestored %llu\n",
                static_cast<unsigned long long>(st.restoreCorrupt),
                static_cast<unsigned long long>(st.statesStored),
                static_cast<unsigned long long>(st.statesRestored));
    std::printf("done\n");
    return 0;
  }

  if (a.mode == "chat") {
    const auto& p = prompts.at(0);
    if (!restoreAndPrefill(0, p)) return 1;
    std::vector<llama_token> all = p;
    const auto answer = promptOf(model.get(), a.answer);
    for (llama_token t : answer) {  // a decode loop: one token a call
      all.push_back(t);
      if (!sup::decode(ctx.get(), 0, all, all.size() - 1, all.size())) return fail("decode");
    }
    auto r = cache->store(0, all.data(), all.size());
    if (!r.ok()) return fail(r.error().toString());
    std::printf("turn stored %u cached %u state %d\n", r->storedTokens, r->cachedTokens,
                r->state ? 1 : 0);
    return 0;
  }

  if (a.mode == "prefill-loop") {
    const auto& base = prompts.at(0);
    for (uint64_t i = 0;; ++i) {
      std::vector<llama_token> p = base;
      auto tail = sup::randomTokens(model.get(), 1000 + i, 200);
      p.insert(p.end(), tail.begin(), tail.end());
      llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, -1, -1);
      auto f = cache->prefill(0, p.data(), p.size(), 0);
      std::printf("prefilled %llu %s\n", static_cast<unsigned long long>(i),
                  f.ok() ? "ok" : kvtier::errorName(f.code()));
    }
  }

  if (a.mode == "corrupt") {
    // A stray write into the pool: this process maps it as every local client does, and flips
    // the last byte of the state the prompt's lookup answers (deep in the recurrent state, where
    // nothing but the checksum can tell).
    const auto& p = prompts.at(0);
    auto client = kvtier::Client::connect({.socketPath = a.socket});
    if (!client.ok()) return fail(client.error().toString());
    auto space = client.value()->open(cache->layout());
    if (!space.ok()) return fail(space.error().toString());
    std::span<const uint32_t> keyTokens(reinterpret_cast<const uint32_t*>(p.data()), p.size() - 1);
    auto hit = space.value()->lookup(keyTokens);
    if (!hit.ok()) return fail(hit.error().toString());
    if (a.corruptBlock >= 0) {
      // A byte in the middle of the block: a K or V row llama.cpp would compute with.
      const auto b = static_cast<size_t>(a.corruptBlock);
      if (b >= hit->blockCount()) return fail("no such block");
      auto* byte = const_cast<uint8_t*>(hit->block(b).data() + hit->block(b).size() / 2);
      *byte ^= 0x40;
      std::printf("corrupted block %zu\n", b);
      return 0;
    }
    if (!hit->hasState()) return fail("no state cached");
    const kvtier::Layout& layout = cache->layout();
    const size_t chunks = hit->stateBlockCount();
    const uint64_t last =
        layout.statePayloadBytes(hit->partialTokens()) - 1 - (chunks - 1) * layout.chunkBytes();
    auto* byte = const_cast<uint8_t*>(hit->stateBlock(chunks - 1).data() + last);
    *byte ^= 0x40;
    std::printf("corrupted state at %llu\n", static_cast<unsigned long long>(hit->matchedTokens()));
    return 0;
  }

  if (a.mode == "nonempty") {
    const auto& p = prompts.at(0);
    if (!sup::decode(ctx.get(), 0, p, 0, 8)) return fail("decode");
    auto r = cache->restore(0, p.data(), p.size());
    const llama_pos max = llama_memory_seq_pos_max(llama_get_memory(ctx.get()), 0);
    std::printf("restore %s pos_max %d\n", r.ok() ? "ok" : kvtier::errorName(r.code()), max);
    return 0;
  }

  if (a.mode == "store-loop") {
    const auto& base = prompts.at(0);
    for (uint64_t i = 0;; ++i) {
      std::vector<llama_token> p = base;
      auto tail = sup::randomTokens(model.get(), 1000 + i, 64);
      p.insert(p.end(), tail.begin(), tail.end());
      llama_memory_seq_rm(llama_get_memory(ctx.get()), 0, -1, -1);
      if (!sup::decode(ctx.get(), 0, p, 0, p.size())) return fail("decode");
      auto r = cache->store(0, p.data(), p.size());
      std::printf("stored %llu %s\n", static_cast<unsigned long long>(i),
                  r.ok() ? "ok" : kvtier::errorName(r.code()));
    }
  }
  return fail("unknown mode " + a.mode);
}
