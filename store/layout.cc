#include "kvtier/layout.h"

#include <cstring>

#include "kvtier/block_key.h"

namespace kvtier {

uint32_t dtypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kInt8:
      return 1;
  }
  return 0;
}

Status Layout::validate(FieldNames names) const {
  const bool snake = names == FieldNames::kSnakeCase;
  const char* const modelIdName = snake ? "model_id" : "model id";
  const char* const numLayersName = snake ? "num_layers" : "numLayers";
  const char* const numKvHeadsName = snake ? "num_kv_heads" : "numKvHeads";
  const char* const headDimName = snake ? "head_dim" : "headDim";
  const char* const blockTokensName = snake ? "block_tokens" : "blockTokens";
  const char* const stateBytesName = snake ? "state_bytes" : "stateBytes";
  const char* const rotaryDimsName = snake ? "rotary_dims" : "rotaryDims";
  if (modelId.size() > kMaxModelIdBytes) {
    return makeError(ErrorCode::kInvalidArgument, modelIdName, " of ", modelId.size(),
                     " bytes exceeds ", kMaxModelIdBytes);
  }
  if (stateBytes > kMaxStateBytes) {
    return makeError(ErrorCode::kInvalidArgument, stateBytesName, " ", stateBytes, " exceeds ",
                     kMaxStateBytes);
  }
  // A layout of recurrent layers only: no KV, a state.
  const bool noKv = numLayers == 0 && numKvHeads == 0 && headDim == 0 && stateBytes > 0;
  if (!noKv) {
    if (numLayers == 0 || numLayers > kMaxLayers) {
      return makeError(ErrorCode::kInvalidArgument, numLayersName, " ", numLayers,
                       " is outside 1..", kMaxLayers, " (0 with ", numKvHeadsName, " and ",
                       headDimName, " 0 only for a layout with a state)");
    }
    if (numKvHeads == 0 || numKvHeads > kMaxKvHeads) {
      return makeError(ErrorCode::kInvalidArgument, numKvHeadsName, " ", numKvHeads,
                       " is outside 1..", kMaxKvHeads);
    }
    if (headDim == 0 || headDim > kMaxHeadDim) {
      return makeError(ErrorCode::kInvalidArgument, headDimName, " ", headDim, " is outside 1..",
                       kMaxHeadDim);
    }
  }
  if (dtypeBytes(dtype) == 0) {
    return makeError(ErrorCode::kInvalidArgument, "unknown dtype ", static_cast<int>(dtype));
  }
  if (blockTokens < kMinBlockTokens || blockTokens > kMaxBlockTokens) {
    return makeError(ErrorCode::kInvalidArgument, blockTokensName, " ", blockTokens, " is outside ",
                     kMinBlockTokens, "..", kMaxBlockTokens);
  }
  if (rope.style != RopeStyle::kNone) {
    if (rope.style != RopeStyle::kNeox && rope.style != RopeStyle::kGptj) {
      return makeError(ErrorCode::kInvalidArgument, "unknown rope style ",
                       static_cast<int>(rope.style));
    }
    if (!hasKv()) {
      return makeError(ErrorCode::kInvalidArgument, "a layout without KV has no rope scheme");
    }
    if (rope.rotaryDims == 0 || rope.rotaryDims % 2 != 0 || rope.rotaryDims > headDim) {
      return makeError(ErrorCode::kInvalidArgument, "rope ", rotaryDimsName, " ", rope.rotaryDims,
                       " must be even and in 2..", headDimName, " (", headDim, ")");
    }
    if (!(rope.base > 1.0) || rope.base > 1e12) {
      return makeError(ErrorCode::kInvalidArgument, "rope base must be in (1, 1e12]");
    }
  }
  if (blockBytes() > kMaxBlockBytes) {
    return makeError(ErrorCode::kInvalidArgument, "a block of ", blockBytes(), " bytes exceeds ",
                     kMaxBlockBytes);
  }
  if (hasState() && stateChunks(1) > kMaxStateChunks) {
    return makeError(ErrorCode::kInvalidArgument, "a state of ", stateBytes, " bytes takes ",
                     stateChunks(1), " blocks of ", chunkBytes(), " bytes; at most ",
                     kMaxStateChunks);
  }
  return {};
}

uint64_t Layout::fingerprint() const {
  // Version 1 of the byte arrangement: layer-major [layer][K|V][token][kvHead][headDim].
  constexpr uint32_t kArrangementVersion = 1;
  Sha256 sha;
  sha.begin();
  auto add32 = [&](uint32_t v) {
    unsigned char b[4] = {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
    sha.update(b, 4);
  };
  add32(kArrangementVersion);
  add32(static_cast<uint32_t>(modelId.size()));
  sha.update(modelId.data(), modelId.size());
  add32(numLayers);
  add32(numKvHeads);
  add32(headDim);
  add32(static_cast<uint32_t>(dtype));
  add32(blockTokens);
  if (rope.style != RopeStyle::kNone) {  // layouts without RoPE keep their fingerprints
    add32(static_cast<uint32_t>(rope.style));
    add32(rope.rotaryDims);
    sha.update(&rope.base, sizeof rope.base);
  }
  if (stateBytes > 0) {  // layouts without a state keep their fingerprints
    add32(0x53544154);   // "STAT"
    add32(static_cast<uint32_t>(stateBytes));
    add32(static_cast<uint32_t>(stateBytes >> 32));
  }
  auto digest = sha.finish();
  uint64_t fp;
  std::memcpy(&fp, digest.data(), sizeof fp);
  return fp;
}

}  // namespace kvtier
