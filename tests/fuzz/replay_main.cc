// A main for the fuzz harnesses in builds without libFuzzer (the GCC build, ctest): runs
// LLVMFuzzerTestOneInput once over each file named, or each file in each directory named (sorted,
// so runs are repeatable), and prints how many. A finding aborts, as under libFuzzer; exit 1 when
// a path cannot be read or names no file.
//
// With --mutations N first, it then runs N inputs more, each a corpus input changed a little
// (bits flipped, bytes set, inserted, removed or repeated, the end cut), from a fixed seed: a
// short fuzzing run that needs no libFuzzer, for CI (Fuzz.<harness>.Mutations).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// 1-4 small changes to `input`, as a mutating fuzzer makes them.
std::vector<uint8_t> mutate(std::vector<uint8_t> input, std::mt19937_64& random) {
  const auto below = [&random](size_t n) { return n == 0 ? 0 : random() % n; };
  for (size_t changes = 1 + below(4); changes > 0; --changes) {
    switch (below(6)) {
      case 0:
        if (!input.empty()) input[below(input.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:
        if (!input.empty()) input[below(input.size())] = static_cast<uint8_t>(random());
        break;
      case 2:
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(below(input.size() + 1)),
                     static_cast<uint8_t>(random()));
        break;
      case 3:
        if (!input.empty())
          input.erase(input.begin() + static_cast<std::ptrdiff_t>(below(input.size())));
        break;
      case 4: {
        // A run of bytes repeated where it is (lengths and counts meet more data than they say).
        if (input.empty()) break;
        const size_t at = below(input.size());
        const size_t n = 1 + below(std::min<size_t>(64, input.size() - at));
        const std::vector<uint8_t> run(input.begin() + static_cast<std::ptrdiff_t>(at),
                                       input.begin() + static_cast<std::ptrdiff_t>(at + n));
        input.insert(input.begin() + static_cast<std::ptrdiff_t>(at), run.begin(), run.end());
        break;
      }
      default:
        input.resize(below(input.size() + 1));
        break;
    }
  }
  return input;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t mutations = 0;
  int first = 1;
  if (argc > 2 && std::string(argv[1]) == "--mutations") {
    char* end = nullptr;
    mutations = std::strtoull(argv[2], &end, 10);
    if (*end != '\0') {
      std::fprintf(stderr, "--mutations needs a number\n");
      return 1;
    }
    first = 3;
  }
  std::vector<std::filesystem::path> files;
  for (int i = first; i < argc; ++i) {
    const std::filesystem::path path(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      std::vector<std::filesystem::path> inDir;
      for (const auto& entry : std::filesystem::directory_iterator(path, ec)) {
        if (entry.is_regular_file()) inDir.push_back(entry.path());
      }
      std::sort(inDir.begin(), inDir.end());
      files.insert(files.end(), inDir.begin(), inDir.end());
    } else if (std::filesystem::is_regular_file(path, ec)) {
      files.push_back(path);
    } else {
      std::fprintf(stderr, "%s: not a file or directory\n", argv[i]);
      return 1;
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--mutations N] FILE|DIR...: no input to replay\n", argv[0]);
    return 1;
  }
  std::vector<std::vector<uint8_t>> inputs;
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    if (!in) {
      std::fprintf(stderr, "%s: cannot read\n", file.c_str());
      return 1;
    }
    inputs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "replaying %s (%zu bytes)\n", file.c_str(), inputs.back().size());
    LLVMFuzzerTestOneInput(inputs.back().data(), inputs.back().size());
  }
  std::printf("replayed %zu inputs\n", files.size());
  std::mt19937_64 random(20261129);
  for (uint64_t i = 0; i < mutations; ++i) {
    const size_t from = random() % inputs.size();
    const std::vector<uint8_t> input = mutate(inputs[from], random);
    // Named so that a finding can be found again: the run is the same every time.
    if (i % 1000 == 0)
      std::fprintf(stderr, "mutation %llu (of %s)\n", static_cast<unsigned long long>(i),
                   files[from].c_str());
    LLVMFuzzerTestOneInput(input.data(), input.size());
  }
  if (mutations > 0)
    std::printf("ran %llu mutated inputs\n", static_cast<unsigned long long>(mutations));
  return 0;
}
