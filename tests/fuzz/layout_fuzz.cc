// Fuzz harness: a layout as another process sends it (schemas/kvtier.capnp Layout, in Session.open
// and the peers' calls): the model identity (model id, shape, dtype, block size, the state and
// window fields) that decides which namespace a client reads and writes.
//
// Input: a Cap'n Proto message (flat array of words, read with the daemon's limits) whose root is
// a Layout. Properties checked besides "no crash": layoutFromRpc throws or gives a layout;
// validate() is OK or INVALID_ARGUMENT; a valid layout encodes back (layoutToRpc) to one equal
// to it with the same fingerprint.
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "schemas/kvtier.capnp.h"
#include "transport/rpc_codec.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvtier fuzz: %s\n", what);
    std::abort();
  }
}

// Bytes per input: a layout is a few hundred bytes; the model id is bounded by validate().
constexpr size_t kMaxInputBytes = 1 << 16;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  if (size < 8 || size > kMaxInputBytes) return 0;
  std::vector<capnp::word> words((size + 7) / 8);
  std::memcpy(words.data(), data, size);
  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = 1 << 16;
  limits.nestingLimit = 16;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                 capnp::FlatArrayMessageReader message(kj::arrayPtr(words.data(), words.size()),
                                                       limits);
                 const Layout layout = layoutFromRpc(message.getRoot<rpc::Layout>());
                 const Status valid = layout.validate();
                 if (!valid) {
                   check(valid.error().code() == ErrorCode::kInvalidArgument,
                         "a refused layout is not INVALID_ARGUMENT");
                   return;
                 }
                 capnp::MallocMessageBuilder builder;
                 layoutToRpc(layout, builder.initRoot<rpc::Layout>());
                 const Layout again = layoutFromRpc(builder.getRoot<rpc::Layout>().asReader());
                 check(again.validate().ok(), "a valid layout encodes to an invalid one");
                 check(again.fingerprint() == layout.fingerprint(),
                       "a valid layout encodes to another fingerprint");
                 check(again.modelId == layout.modelId, "a valid layout's model id changes");
               })) {
    (void)e;  // a message that does not decode, or a field outside its enum: refused
  }
  return 0;
}
