// A user's program on an installed kvtier (C++ API): puts a prompt's KV, looks it up again and
// checks every byte, then reads the daemon's counters. Exit 0 on success.
//   consumer NAME     (the daemon's socket in $KVTIER_SOCKET)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvtier/client.h"

int main(int argc, char** argv) {
  const std::string name = argc > 1 ? argv[1] : "consumer";
  const char* socket = std::getenv("KVTIER_SOCKET");
  auto client = kvtier::Client::connect(
      {.socketPath = socket ? socket : "kvtier-data/kvtierd.sock", .clientName = name});
  if (!client) {
    std::fprintf(stderr, "%s: connect: %s\n", name.c_str(), client.error().toString().c_str());
    return 1;
  }
  // 2 layers, 2 KV heads, head dim 8, fp16, 16 tokens per block.
  const kvtier::Layout layout{"consumer/" + name, 2, 2, 8, kvtier::DType::kFloat16, 16, {}};
  auto space = (*client)->open(layout);
  if (!space) {
    std::fprintf(stderr, "%s: open: %s\n", name.c_str(), space.error().toString().c_str());
    return 1;
  }
  std::vector<uint32_t> tokens(48);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 31 + 7);
  std::vector<uint8_t> kv(tokens.size() * layout.tokenKvBytes());
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = static_cast<uint8_t>(i * 131 + name.size());
  auto put = (*space)->put("prompt", 0, tokens, kv.data(), kv.size());
  if (!put || put->sealedBlocks != 3) {
    std::fprintf(stderr, "%s: put failed\n", name.c_str());
    return 1;
  }
  auto hit = (*space)->lookup(tokens);
  if (!hit || hit->matchedTokens() != tokens.size()) {
    std::fprintf(stderr, "%s: lookup did not match all %zu tokens\n", name.c_str(), tokens.size());
    return 1;
  }
  std::vector<uint8_t> got(kv.size());
  if (!hit->copyTo(0, tokens.size(), got.data(), got.size()) || got != kv) {
    std::fprintf(stderr, "%s: the bytes read back differ from those put\n", name.c_str());
    return 1;
  }
  hit->release();
  auto stats = (*client)->stats();
  if (!stats || stats->hits == 0) {
    std::fprintf(stderr, "%s: stats show no hit\n", name.c_str());
    return 1;
  }
  std::printf("%s: put %zu tokens, looked them up, %zu bytes equal; daemon %s, %llu hits\n",
              name.c_str(), tokens.size(), kv.size(), (*client)->daemonVersion().c_str(),
              static_cast<unsigned long long>(stats->hits));
  return 0;
}
