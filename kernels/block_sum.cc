#include "kernels/block_sum.h"

// Header-only use of xxHash (the same 0.8.1 code as Debian's libxxhash): kvtier_kernels' objects
// go into libkvtier, which then needs no xxhash library at link time.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvtier::kernels {
namespace {

static_assert(sizeof(XXH3_state_t) <= FusedXxh3::kXxh3StateBytes);
static_assert(alignof(XXH3_state_t) <= 64);

// XXH3's long-input layout (xxhash.h's XXH3_hashLong_64b_internal with the default secret): stripe
// s of 64 bytes uses secret + 8 * (s % 16); after every 16th the accumulators are scrambled with
// the secret's last 64 bytes; the last 64 bytes of the input are one more stripe with secret + 121;
// the accumulators merge with secret + 11. (Those only the AVX2 code uses are defined with it.)
constexpr size_t kStripe = 64, kSecretMerge = 11;
// XXH3 hashes inputs up to this long without stripes (XXH3_MIDSIZE_MAX).
constexpr uint64_t kMidSizeMax = 240;
// The fallback copies this much, then hashes it while it is still in L1/L2.
constexpr size_t kFallbackPiece = 16 << 10;

std::atomic<FusedPath> gMaxPath{FusedPath::kAvx512};

XXH3_state_t* xxh3State(unsigned char* bytes) { return reinterpret_cast<XXH3_state_t*>(bytes); }
const XXH3_state_t* xxh3State(const unsigned char* bytes) {
  return reinterpret_cast<const XXH3_state_t*>(bytes);
}

#if defined(__x86_64__)
#define KVTIER_AVX2 __attribute__((target("avx2")))
#define KVTIER_AVX512 __attribute__((target("avx512f")))

constexpr size_t kStripesPerScramble = 16, kSecretScramble = 192 - 64,
                 kSecretLastStripe = 192 - 64 - 7;

FusedPath cpuPath() {
  // Every AVX-512 CPU has AVX2 too; digest() folds the last stripe with AVX2 on either path.
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2"))
    return FusedPath::kAvx512;
  return __builtin_cpu_supports("avx2") ? FusedPath::kAvx2 : FusedPath::kFallback;
}

// XXH3_accumulate_512_avx2 on four of the eight lanes: acc += swap32(data) + lo32(d) * hi32(d),
// d = data ^ key. The additions are grouped so that acc's chain is one add per stripe.
KVTIER_AVX2 inline __m256i accumulate(__m256i acc, __m256i data, const uint8_t* key) {
  const __m256i dataKey =
      _mm256_xor_si256(data, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
  const __m256i product =
      _mm256_mul_epu32(dataKey, _mm256_shuffle_epi32(dataKey, _MM_SHUFFLE(0, 3, 0, 1)));
  const __m256i swapped = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
  return _mm256_add_epi64(acc, _mm256_add_epi64(swapped, product));
}

// XXH3_scrambleAcc_avx2 on four lanes: acc = (acc ^ (acc >> 47) ^ key) * PRIME32_1.
KVTIER_AVX2 inline __m256i scramble(__m256i acc, const uint8_t* key) {
  const __m256i prime = _mm256_set1_epi32(static_cast<int>(XXH_PRIME32_1));
  const __m256i mixed = _mm256_xor_si256(_mm256_xor_si256(acc, _mm256_srli_epi64(acc, 47)),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key)));
  const __m256i lo = _mm256_mul_epu32(mixed, prime);
  const __m256i hi = _mm256_mul_epu32(_mm256_shuffle_epi32(mixed, _MM_SHUFFLE(0, 3, 0, 1)), prime);
  return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

// How foldStripes stores each stripe: streamed (dst 32-byte aligned), plain, or not at all (a
// carried stripe, already copied).
enum class Store { kStream, kPlain, kNone };

// Accumulates `count` stripes from src, stripe `first` onwards in XXH3's order, storing each to
// dst from the registers it was loaded into, the source prefetched a page ahead (block_copy.h). The
// accumulators stay in registers for the run.
template <Store kStore>
KVTIER_AVX2 void foldStripes(uint64_t* acc, uint64_t first, uint8_t* dst, const uint8_t* src,
                             uint64_t count) {
  __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc));
  __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(acc + 4));
  size_t k = first % kStripesPerScramble;
  for (uint64_t i = 0; i < count; ++i, src += kStripe, dst += kStripe) {
    if constexpr (kStore != Store::kNone) {
      _mm_prefetch(reinterpret_cast<const char*>(src + kSourcePrefetchAhead), _MM_HINT_T0);
    }
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 32));
    if constexpr (kStore == Store::kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    } else if constexpr (kStore == Store::kPlain) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), b);
    }
    const uint8_t* key = XXH3_kSecret + k * XXH_SECRET_CONSUME_RATE;
    lo = accumulate(lo, a, key);
    hi = accumulate(hi, b, key + 32);
    if (++k == kStripesPerScramble) {
      lo = scramble(lo, XXH3_kSecret + kSecretScramble);
      hi = scramble(hi, XXH3_kSecret + kSecretScramble + 32);
      k = 0;
    }
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(acc), lo);
  _mm256_store_si256(reinterpret_cast<__m256i*>(acc + 4), hi);
}

// GCC 12's AVX-512 intrinsics trip its own -Wmaybe-uninitialized (their masked forms take an
// _mm512_undefined operand; GCC bug 105593): off for these functions only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// The same on one 512-bit register for all eight lanes (XXH3_accumulate_512_avx512).
KVTIER_AVX512 inline __m512i accumulate512(__m512i acc, __m512i data, const uint8_t* key) {
  const __m512i dataKey = _mm512_xor_si512(data, _mm512_loadu_si512(key));
  const __m512i product = _mm512_mul_epu32(
      dataKey, _mm512_shuffle_epi32(dataKey, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(0, 3, 0, 1))));
  const __m512i swapped =
      _mm512_shuffle_epi32(data, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(1, 0, 3, 2)));
  return _mm512_add_epi64(acc, _mm512_add_epi64(swapped, product));
}

KVTIER_AVX512 inline __m512i scramble512(__m512i acc, const uint8_t* key) {
  const __m512i prime = _mm512_set1_epi32(static_cast<int>(XXH_PRIME32_1));
  const __m512i mixed =
      _mm512_xor_si512(_mm512_xor_si512(acc, _mm512_srli_epi64(acc, 47)), _mm512_loadu_si512(key));
  const __m512i lo = _mm512_mul_epu32(mixed, prime);
  const __m512i hi = _mm512_mul_epu32(
      _mm512_shuffle_epi32(mixed, static_cast<_MM_PERM_ENUM>(_MM_SHUFFLE(0, 3, 0, 1))), prime);
  return _mm512_add_epi64(lo, _mm512_slli_epi64(hi, 32));
}

// foldStripes with AVX-512: a stripe is one register. kStream needs dst 64-byte aligned.
template <Store kStore>
KVTIER_AVX512 void foldStripes512(uint64_t* acc, uint64_t first, uint8_t* dst, const uint8_t* src,
                                  uint64_t count) {
  __m512i lanes = _mm512_load_si512(acc);
  size_t k = first % kStripesPerScramble;
  for (uint64_t i = 0; i < count; ++i, src += kStripe, dst += kStripe) {
    if constexpr (kStore != Store::kNone) {
      _mm_prefetch(reinterpret_cast<const char*>(src + kSourcePrefetchAhead), _MM_HINT_T0);
    }
    const __m512i data = _mm512_loadu_si512(src);
    if constexpr (kStore == Store::kStream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst), data);
    } else if constexpr (kStore == Store::kPlain) {
      _mm512_storeu_si512(dst, data);
    }
    lanes = accumulate512(lanes, data, XXH3_kSecret + k * XXH_SECRET_CONSUME_RATE);
    if (++k == kStripesPerScramble) {
      lanes = scramble512(lanes, XXH3_kSecret + kSecretScramble);
      k = 0;
    }
  }
  _mm512_store_si512(acc, lanes);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// foldStripes or foldStripes512, as `path` says, storing as `store` says.
void foldWith(FusedPath path, Store store, uint64_t* acc, uint64_t first, uint8_t* dst,
              const uint8_t* src, uint64_t count) {
  const bool wide = path == FusedPath::kAvx512;
  switch (store) {
    case Store::kStream:
      return wide ? foldStripes512<Store::kStream>(acc, first, dst, src, count)
                  : foldStripes<Store::kStream>(acc, first, dst, src, count);
    case Store::kPlain:
      return wide ? foldStripes512<Store::kPlain>(acc, first, dst, src, count)
                  : foldStripes<Store::kPlain>(acc, first, dst, src, count);
    case Store::kNone:
      return wide ? foldStripes512<Store::kNone>(acc, first, dst, src, count)
                  : foldStripes<Store::kNone>(acc, first, dst, src, count);
  }
}

// XXH3's last stripe: the input's last 64 bytes, with their own secret offset, no scramble.
KVTIER_AVX2 void foldLastStripe(uint64_t* acc, const uint8_t* stripe) {
  const uint8_t* key = XXH3_kSecret + kSecretLastStripe;
  for (int half = 0; half < 2; ++half) {
    __m256i* lanes = reinterpret_cast<__m256i*>(acc + 4 * half);
    const __m256i data = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(stripe + 32 * half));
    _mm256_store_si256(lanes, accumulate(_mm256_load_si256(lanes), data, key + 32 * half));
  }
}

#undef KVTIER_AVX2
#undef KVTIER_AVX512
#else
FusedPath cpuPath() { return FusedPath::kFallback; }
#endif

}  // namespace

uint64_t blockChecksum(const void* data, size_t n) { return XXH3_64bits(data, n); }

FusedPath widestFusedPath() {
  static const FusedPath widest = cpuPath();
  return widest;
}

void setFusedXxh3MaxPath(FusedPath path) { gMaxPath.store(path, std::memory_order_relaxed); }

FusedXxh3::FusedXxh3(uint64_t totalBytes, CopyMethod method)
    : total_(totalBytes),
      method_(method),
      path_(totalBytes > kMidSizeMax
                ? std::min(widestFusedPath(), gMaxPath.load(std::memory_order_relaxed))
                : FusedPath::kFallback) {
  if (path_ == FusedPath::kFallback) {
    XXH3_64bits_reset(xxh3State(state_));
    return;
  }
  stripes_ = Stripes{.acc = XXH3_INIT_ACC,
                     .regular = (totalBytes - 1) / kStripe,
                     .done = 0,
                     .carry = {},
                     .carried = 0,
                     .last = {}};
}

void FusedXxh3::feed(uint8_t* dst, const uint8_t* src, size_t n) {
  assert(n <= total_ - fed_);
  // The method applies to the run as a whole, as copyBytes applies it.
  const CopyMethod method = n >= kStreamingThreshold ? method_ : CopyMethod::kCached;
  if (path_ != FusedPath::kFallback) {
    feedStripes(dst, src, n, method);
  } else {
    feedState(dst, src, n, method);
  }
  fed_ += n;
}

void FusedXxh3::feedState(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method) {
  for (size_t off = 0; off < n; off += kFallbackPiece) {
    const size_t piece = std::min(n - off, kFallbackPiece);
    if (dst != nullptr) copyWithMethod(dst + off, src + off, piece, method);
    XXH3_64bits_update(xxh3State(state_), src + off, piece);
  }
}

// Saves the part of this run that lies in the input's last 64 bytes (XXH3's last stripe, which
// overlaps the regular stripes before it and is accumulated in digest()).
void FusedXxh3::keepLastStripe(const uint8_t* src, size_t n) {
  const uint64_t lastStart = total_ - kStripe;
  if (fed_ + n <= lastStart) return;
  const uint64_t from = std::max(fed_, lastStart);
  std::memcpy(stripes_.last + (from - lastStart), src + (from - fed_), fed_ + n - from);
}

void FusedXxh3::feedStripes(uint8_t* dst, const uint8_t* src, size_t n, CopyMethod method) {
#if defined(__x86_64__)
  keepLastStripe(src, n);
  Stripes& s = stripes_;
  // Finish the stripe an earlier run began: copy its rest, accumulate it from the carry buffer.
  if (s.carried > 0) {
    const size_t take = std::min(kStripe - s.carried, n);
    if (dst != nullptr) std::memcpy(dst, src, take);
    std::memcpy(s.carry + s.carried, src, take);
    s.carried += take;
    if (dst != nullptr) dst += take;
    src += take;
    n -= take;
    if (s.carried < kStripe) return;
    foldWith(path_, Store::kNone, s.acc, s.done++, nullptr, s.carry, 1);
    s.carried = 0;
  }
  // Whole stripes straight from the source. Streaming stores need dst 32-byte aligned; pool
  // blocks are (64 bytes at least), other destinations get plain stores.
  const uint64_t whole = std::min<uint64_t>(n / kStripe, s.regular - s.done);
  if (whole > 0) {
    const uintptr_t align = path_ == FusedPath::kAvx512 ? 63 : 31;
    const bool stream =
        method == CopyMethod::kStreaming && (reinterpret_cast<uintptr_t>(dst) & align) == 0;
    const Store store = dst == nullptr ? Store::kNone : stream ? Store::kStream : Store::kPlain;
    foldWith(path_, store, s.acc, s.done, dst, src, whole);
    s.done += whole;
    if (dst != nullptr) dst += whole * kStripe;
    src += whole * kStripe;
    n -= whole * kStripe;
  }
  // The rest: the start of a stripe the next run finishes, or the input's tail past the regular
  // stripes (keepLastStripe has it).
  if (dst != nullptr) std::memcpy(dst, src, n);
  if (s.done < s.regular) {
    std::memcpy(s.carry, src, n);
    s.carried = n;
  }
#else
  (void)dst, (void)src, (void)n, (void)method;  // never called off x86-64: the path is kFallback
#endif
}

uint64_t FusedXxh3::digest() const {
  if (path_ == FusedPath::kFallback) return XXH3_64bits_digest(xxh3State(state_));
  // On a copy of the accumulators: the object stays as fed, and digest() gives the same again.
  alignas(32) uint64_t acc[8];
  std::memcpy(acc, stripes_.acc, sizeof acc);
#if defined(__x86_64__)
  foldLastStripe(acc, stripes_.last);
#endif
  return XXH3_mergeAccs(acc, XXH3_kSecret + kSecretMerge, total_ * XXH_PRIME64_1);
}

uint64_t copyRunsSummed(const uint8_t* block, size_t blockBytes, std::span<const CopyRun> runs,
                        CopyDirection direction) {
  return copyRunsSummed(block, blockBytes, runs, copyMethod(direction));
}

uint64_t copyRunsSummed(const uint8_t* block, size_t blockBytes, std::span<const CopyRun> runs,
                        CopyMethod method) {
  FusedXxh3 sum(blockBytes, method);
  uint64_t at = 0;
  for (const CopyRun& run : runs) {
    if (run.offset > at) sum.feed(nullptr, block + at, run.offset - at);  // bytes not copied out
    sum.feed(run.dst, block + run.offset, run.bytes);
    at = run.offset + run.bytes;
  }
  if (at < blockBytes) sum.feed(nullptr, block + at, blockBytes - at);
  return sum.digest();
}

uint64_t copyBytesSummed(uint8_t* dst, const uint8_t* src, size_t n, CopyDirection direction) {
  FusedXxh3 sum(n, copyMethod(direction));
  sum.feed(dst, src, n);
  return sum.digest();
}

uint64_t unpackBlockSummed(const BlockGeometry& g, uint8_t* block, const uint8_t* packed,
                           uint64_t packedTokens, uint64_t packedFirst) {
  // unpackSlots' runs for the whole block: consecutive in it, so they are one input to hash.
  const uint64_t run = uint64_t{g.blockTokens} * g.tokenBytes;
  FusedXxh3 sum(2ull * g.numLayers * run, copyMethod(CopyDirection::kIntoPool));
  for (uint64_t lkv = 0; lkv < 2ull * g.numLayers; ++lkv) {
    sum.feed(block + lkv * run, packed + (lkv * packedTokens + packedFirst) * g.tokenBytes, run);
  }
  copyFence();
  return sum.digest();
}

}  // namespace kvtier::kernels
