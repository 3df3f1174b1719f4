#include "transport/rpc_codec.h"

#include <cstdlib>
#include <string>

namespace kvtier {
namespace {

constexpr std::string_view kTag = "kvtier error ";

kj::Exception::Type typeFor(ErrorCode code) {
  switch (code) {
    case ErrorCode::kFull:
    case ErrorCode::kConflict:
      return kj::Exception::Type::OVERLOADED;
    case ErrorCode::kUnavailable:
      return kj::Exception::Type::DISCONNECTED;
    case ErrorCode::kNotSupported:
      return kj::Exception::Type::UNIMPLEMENTED;
    default:
      return kj::Exception::Type::FAILED;
  }
}

}  // namespace

kj::Exception toKjException(const Error& error) {
  std::string text = std::string(kTag) + std::to_string(static_cast<int>(error.code())) + " (" +
                     errorName(error.code()) + "): " + error.message();
  return kj::Exception(typeFor(error.code()), __FILE__, __LINE__, kj::heapString(text.c_str()));
}

void throwRpcError(const Error& error) { kj::throwFatalException(toKjException(error)); }

Error fromKjException(const kj::Exception& exception) {
  std::string_view d(exception.getDescription().cStr());
  const size_t at = d.find(kTag);
  if (at != std::string_view::npos) {
    const char* start = d.data() + at + kTag.size();
    char* end = nullptr;
    const unsigned long code = std::strtoul(start, &end, 10);
    std::string_view rest(end, d.data() + d.size() - end);
    const size_t colon = rest.find("): ");
    std::string message(colon == std::string_view::npos ? rest : rest.substr(colon + 3));
    if (end != start && code <= static_cast<unsigned long>(ErrorCode::kReleased)) {
      return Error(static_cast<ErrorCode>(code), std::move(message));
    }
  }
  if (exception.getType() == kj::Exception::Type::DISCONNECTED) {
    return Error(ErrorCode::kUnavailable, "connection to kvtierd lost: " + std::string(d));
  }
  if (exception.getType() == kj::Exception::Type::UNIMPLEMENTED) {
    return Error(ErrorCode::kNotSupported, std::string(d));
  }
  return Error(ErrorCode::kInternal, std::string(d));
}

Layout layoutFromRpc(rpc::Layout::Reader in) {
  Layout out;
  out.modelId = std::string(in.getModelId().cStr(), in.getModelId().size());
  out.numLayers = in.getNumLayers();
  out.numKvHeads = in.getNumKvHeads();
  out.headDim = in.getHeadDim();
  const auto dtype = static_cast<uint16_t>(in.getDtype());
  if (dtype > static_cast<uint16_t>(DType::kInt8)) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, "unknown dtype ", dtype));
  }
  out.dtype = static_cast<DType>(dtype);
  out.blockTokens = in.getBlockTokens();
  auto rope = in.getRope();
  const auto style = static_cast<uint16_t>(rope.getStyle());
  if (style > static_cast<uint16_t>(RopeStyle::kGptj)) {
    throwRpcError(makeError(ErrorCode::kInvalidArgument, "unknown rope style ", style));
  }
  out.rope = RopeScheme{static_cast<RopeStyle>(style), rope.getRotaryDims(), rope.getBase()};
  out.stateBytes = in.getStateBytes();
  return out;
}

void layoutToRpc(const Layout& in, rpc::Layout::Builder out) {
  // All of it: Text made from a std::string would end at a NUL (it takes c_str()).
  out.setModelId(capnp::Text::Reader(in.modelId.data(), in.modelId.size()));
  out.setNumLayers(in.numLayers);
  out.setNumKvHeads(in.numKvHeads);
  out.setHeadDim(in.headDim);
  out.setDtype(static_cast<rpc::DType>(in.dtype));
  out.setBlockTokens(in.blockTokens);
  auto rope = out.initRope();
  rope.setStyle(static_cast<rpc::RopeStyle>(in.rope.style));
  rope.setRotaryDims(in.rope.rotaryDims);
  rope.setBase(in.rope.base);
  out.setStateBytes(in.stateBytes);
}

BlockLocation blockFromRpc(rpc::BlockRef::Reader in) {
  return BlockLocation{in.getExtent(), in.getOffset(), in.getBytes(), in.getGeneration()};
}

void blockToRpc(const BlockLocation& in, rpc::BlockRef::Builder out) {
  out.setExtent(in.extent);
  out.setOffset(in.offset);
  out.setBytes(in.bytes);
  out.setGeneration(in.generation);
}

}  // namespace kvtier
