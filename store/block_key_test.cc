#include "kvtier/block_key.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "kvtier/layout.h"

namespace kvtier {

// Readable failure messages for error codes (same definition as in engine_test.cc).
inline void PrintTo(ErrorCode code, std::ostream* os) { *os << errorName(code); }

namespace {

constexpr uint32_t kBt = 16;

std::vector<uint32_t> iota(size_t n, uint32_t first) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = first + static_cast<uint32_t>(i);
  return v;
}

// The key chain of `tokens` (whole blocks only), computed with a fresh hasher.
std::vector<Key128> chain(uint64_t fingerprint, const Salt& salt,
                          const std::vector<uint32_t>& tokens) {
  BlockKeyHasher hasher(fingerprint, salt);
  std::vector<Key128> keys;
  std::span<const uint32_t> all(tokens);
  for (size_t i = 0; (i + 1) * kBt <= tokens.size(); ++i) {
    keys.push_back(hasher.next(keys.empty() ? nullptr : &keys.back(), all.subspan(i * kBt, kBt)));
  }
  return keys;
}

// SHA-256 with OpenSSL's one-shot API, independent of the Sha256 class under test.
std::array<uint8_t, 32> sha256(const std::vector<uint8_t>& bytes) {
  std::array<uint8_t, 32> digest{};
  unsigned int size = 0;
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), digest.data(), &size, EVP_sha256(), nullptr), 1);
  EXPECT_EQ(size, 32u);
  return digest;
}

void appendLe32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

Layout smallLayout() {
  Layout l;
  l.modelId = "test-model";
  l.numLayers = 2;
  l.numKvHeads = 1;
  l.headDim = 4;
  l.dtype = DType::kFloat16;
  l.blockTokens = kBt;
  return l;
}

const Salt kSaltA = saltFor("tenant-a");
const Salt kSaltB = saltFor("tenant-b");
constexpr uint64_t kFp = 0x0123456789abcdefull;

TEST(BlockKeyTest, ChainIsDeterministic) {
  const auto tokens = iota(4 * kBt, 100);
  const auto a = chain(kFp, kSaltA, tokens);
  const auto b = chain(kFp, kSaltA, tokens);
  ASSERT_EQ(a.size(), 4u);
  EXPECT_EQ(a, b);
  // Reusing one hasher for several chains gives the same keys as fresh hashers.
  BlockKeyHasher hasher(kFp, kSaltA);
  std::span<const uint32_t> all(tokens);
  const Key128 k0 = hasher.next(nullptr, all.subspan(0, kBt));
  const Key128 k1 = hasher.next(&k0, all.subspan(kBt, kBt));
  EXPECT_EQ(k0, a[0]);
  EXPECT_EQ(k1, a[1]);
  // The blocks of one chain have distinct keys.
  for (size_t i = 0; i < a.size(); ++i) {
    for (size_t j = i + 1; j < a.size(); ++j) EXPECT_NE(a[i], a[j]) << i << " " << j;
  }
}

TEST(BlockKeyTest, KeyZeroIsSha256OfFingerprintSaltAndLittleEndianTokens) {
  // Tokens whose four bytes differ, so that a byte-order mistake changes the key.
  std::vector<uint32_t> tokens = iota(kBt, 0);
  tokens[0] = 0x01020304u;
  tokens[1] = 0xa0b0c0d0u;
  tokens[15] = 0xffffffffu;
  std::vector<uint8_t> preimage;
  for (int i = 0; i < 8; ++i) preimage.push_back(static_cast<uint8_t>(kFp >> (8 * i)));
  preimage.insert(preimage.end(), kSaltA.begin(), kSaltA.end());
  for (uint32_t t : tokens) appendLe32(preimage, t);
  const auto digest = sha256(preimage);

  BlockKeyHasher hasher(kFp, kSaltA);
  const Key128 k0 = hasher.next(nullptr, tokens);
  EXPECT_TRUE(std::equal(k0.bytes.begin(), k0.bytes.end(), digest.begin()));

  // key_1 = H(key_0 || tokens), 128 bits kept.
  std::vector<uint8_t> preimage1(k0.bytes.begin(), k0.bytes.end());
  for (uint32_t t : tokens) appendLe32(preimage1, t);
  const auto digest1 = sha256(preimage1);
  const Key128 k1 = hasher.next(&k0, tokens);
  EXPECT_TRUE(std::equal(k1.bytes.begin(), k1.bytes.end(), digest1.begin()));
}

TEST(BlockKeyTest, DiffersBySaltAndFingerprint) {
  const auto tokens = iota(2 * kBt, 5);
  const auto base = chain(kFp, kSaltA, tokens);
  const auto otherSalt = chain(kFp, kSaltB, tokens);
  const auto otherFp = chain(kFp ^ 1, kSaltA, tokens);
  for (size_t i = 0; i < base.size(); ++i) {
    EXPECT_NE(base[i], otherSalt[i]) << i;
    EXPECT_NE(base[i], otherFp[i]) << i;
  }
}

TEST(BlockKeyTest, DiffersByAnySingleToken) {
  const auto tokens = iota(kBt, 1000);
  BlockKeyHasher hasher(kFp, kSaltA);
  const Key128 base = hasher.next(nullptr, tokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto changed = tokens;
    changed[i] ^= 0x100;  // a byte that is not the lowest: all four bytes are hashed
    EXPECT_NE(hasher.next(nullptr, changed), base) << "token " << i;
  }
  // Swapping two tokens changes the key too: order matters.
  auto swapped = tokens;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(hasher.next(nullptr, swapped), base);
}

TEST(BlockKeyTest, DiffersByPreviousKey) {
  const auto tokens = iota(kBt, 1);
  BlockKeyHasher hasher(kFp, kSaltA);
  const Key128 p1 = hasher.next(nullptr, iota(kBt, 500));
  const Key128 p2 = hasher.next(nullptr, iota(kBt, 600));
  const Key128 a = hasher.next(&p1, tokens);
  const Key128 b = hasher.next(&p2, tokens);
  const Key128 first = hasher.next(nullptr, tokens);
  EXPECT_NE(a, b);
  EXPECT_NE(a, first);
  EXPECT_NE(b, first);
}

TEST(BlockKeyTest, KeyIDependsOnAllEarlierTokens) {
  const auto tokens = iota(4 * kBt, 42);
  const auto base = chain(kFp, kSaltA, tokens);
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    auto changed = tokens;
    changed[pos] += 1;
    const auto keys = chain(kFp, kSaltA, changed);
    const size_t block = pos / kBt;
    for (size_t i = 0; i < block; ++i) {
      EXPECT_EQ(keys[i], base[i]) << "pos " << pos << " block " << i;
    }
    for (size_t i = block; i < keys.size(); ++i) {
      EXPECT_NE(keys[i], base[i]) << "pos " << pos << " block " << i;
    }
  }
}

TEST(BlockKeyTest, HexIsLowercaseAndFull) {
  Key128 k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(i * 17);
  EXPECT_EQ(k.hex(), "00112233445566778899aabbccddeeff");
  EXPECT_EQ(Key128{}.hex(), std::string(32, '0'));
}

TEST(BlockKeyTest, SaltForIsDeterministicAndPerTenant) {
  EXPECT_EQ(saltFor("tenant-a"), saltFor("tenant-a"));
  EXPECT_NE(saltFor("tenant-a"), saltFor("tenant-b"));
  EXPECT_NE(saltFor(""), saltFor("tenant-a"));
  EXPECT_NE(saltFor(""), Salt{});
}

TEST(LayoutTest, SmallLayoutSizes) {
  const Layout l = smallLayout();
  EXPECT_TRUE(l.validate().ok());
  EXPECT_EQ(l.tokenBytes(), 8u);
  EXPECT_EQ(l.tokenKvBytes(), 32u);
  EXPECT_EQ(l.blockBytes(), 512u);
  // [layer][K|V][token][kvHead][headDim]
  EXPECT_EQ(l.slotOffset(0, 0, 0), 0u);
  EXPECT_EQ(l.slotOffset(0, 0, 1), 8u);
  EXPECT_EQ(l.slotOffset(0, 1, 0), 128u);
  EXPECT_EQ(l.slotOffset(1, 0, 0), 256u);
  EXPECT_EQ(l.slotOffset(1, 1, 15), 384u + 120u);
  EXPECT_EQ(l.slotOffset(1, 1, 15) + l.tokenBytes(), l.blockBytes());
}

TEST(LayoutTest, ValidateAcceptsBounds) {
  Layout l = smallLayout();
  l.blockTokens = kMinBlockTokens;
  EXPECT_TRUE(l.validate().ok());
  l.blockTokens = kMaxBlockTokens;
  EXPECT_TRUE(l.validate().ok());
  l = smallLayout();
  l.modelId = std::string(kMaxModelIdBytes, 'm');
  EXPECT_TRUE(l.validate().ok());
  l = smallLayout();
  l.modelId.clear();
  EXPECT_TRUE(l.validate().ok());
  l = smallLayout();
  l.numLayers = kMaxLayers;
  l.numKvHeads = 1;
  l.headDim = 1;
  EXPECT_TRUE(l.validate().ok());
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat8E4M3,
                  DType::kFloat8E5M2, DType::kInt8}) {
    l = smallLayout();
    l.dtype = d;
    EXPECT_TRUE(l.validate().ok()) << static_cast<int>(d);
  }
}

TEST(LayoutTest, ValidateRejectsEachBound) {
  struct Case {
    const char* what;
    void (*edit)(Layout&);
  };
  const Case cases[] = {
      {"model id too long", [](Layout& l) { l.modelId = std::string(kMaxModelIdBytes + 1, 'm'); }},
      {"no layers", [](Layout& l) { l.numLayers = 0; }},
      {"too many layers", [](Layout& l) { l.numLayers = kMaxLayers + 1; }},
      {"no kv heads", [](Layout& l) { l.numKvHeads = 0; }},
      {"too many kv heads", [](Layout& l) { l.numKvHeads = kMaxKvHeads + 1; }},
      {"no head dim", [](Layout& l) { l.headDim = 0; }},
      {"head dim too large", [](Layout& l) { l.headDim = kMaxHeadDim + 1; }},
      {"unknown dtype", [](Layout& l) { l.dtype = static_cast<DType>(99); }},
      {"block tokens too small", [](Layout& l) { l.blockTokens = kMinBlockTokens - 1; }},
      {"block tokens too large", [](Layout& l) { l.blockTokens = kMaxBlockTokens + 1; }},
      {"block over 1 GiB",
       [](Layout& l) {
         // 2 * 64 layers * 64 heads * 128 dim * 4 bytes * 512 tokens = 2 GiB.
         l.numLayers = 64;
         l.numKvHeads = 64;
         l.headDim = 128;
         l.dtype = DType::kFloat32;
         l.blockTokens = 512;
       }},
  };
  for (const auto& c : cases) {
    Layout l = smallLayout();
    c.edit(l);
    const Status s = l.validate();
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << c.what;
  }
  // Exactly 1 GiB is still allowed: 2 * 64 * 64 * 128 * 4 * 256.
  Layout l = smallLayout();
  l.numLayers = 64;
  l.numKvHeads = 64;
  l.headDim = 128;
  l.dtype = DType::kFloat32;
  l.blockTokens = 256;
  EXPECT_EQ(l.blockBytes(), kMaxBlockBytes);
  EXPECT_TRUE(l.validate().ok());
}

TEST(LayoutTest, FingerprintIsStableAndDiffersPerField) {
  const Layout base = smallLayout();
  EXPECT_EQ(base.fingerprint(), smallLayout().fingerprint());
  std::vector<Layout> variants;
  auto vary = [&](void (*edit)(Layout&)) {
    Layout l = base;
    edit(l);
    variants.push_back(l);
  };
  vary([](Layout& l) { l.modelId = "test-model-2"; });
  vary([](Layout& l) { l.modelId.clear(); });
  vary([](Layout& l) { l.numLayers = 3; });
  vary([](Layout& l) { l.numKvHeads = 2; });
  vary([](Layout& l) { l.headDim = 8; });
  vary([](Layout& l) { l.dtype = DType::kBFloat16; });  // same size as fp16, different type
  vary([](Layout& l) { l.blockTokens = 32; });
  // Fields that trade places keep the block size but not the fingerprint.
  vary([](Layout& l) {
    l.numKvHeads = 4;
    l.headDim = 1;
  });
  for (size_t i = 0; i < variants.size(); ++i) {
    EXPECT_NE(variants[i].fingerprint(), base.fingerprint()) << "variant " << i;
    for (size_t j = i + 1; j < variants.size(); ++j) {
      EXPECT_NE(variants[i].fingerprint(), variants[j].fingerprint()) << i << " vs " << j;
    }
  }
}

}  // namespace
}  // namespace kvtier
