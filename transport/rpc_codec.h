// What the daemon and the SDK share at the RPC boundary: errors carried in kj::Exceptions and
// conversions between schema structs and C++ types.
//
// An error crosses as a kj::Exception whose type tells the client whether to retry (OVERLOADED,
// DISCONNECTED, UNIMPLEMENTED, FAILED) and whose description starts with
// "kvtier error <n> (<NAME>): " so the client recovers the exact, stable code.
#pragma once

#include <kj/exception.h>

#include <utility>

#include "kvtier/error.h"
#include "kvtier/layout.h"
#include "schemas/kvtier.capnp.h"
#include "store/block_pool.h"

namespace kvtier {

kj::Exception toKjException(const Error& error);
[[noreturn]] void throwRpcError(const Error& error);
// A result's value, or its error thrown as throwRpcError does (in RPC handlers).
template <typename T>
T orThrow(Result<T>&& r) {
  if (!r) throwRpcError(r.error());
  return std::move(r).value();
}
inline void orThrow(Status&& s) {
  if (!s) throwRpcError(s.error());
}
// The kvtier error inside a kj::Exception; an exception without one (a broken connection, a bug)
// maps to UNAVAILABLE (DISCONNECTED) or INTERNAL.
Error fromKjException(const kj::Exception& exception);

// Throws INVALID_ARGUMENT for fields outside the enum; Layout::validate checks the rest.
Layout layoutFromRpc(rpc::Layout::Reader in);
void layoutToRpc(const Layout& in, rpc::Layout::Builder out);

BlockLocation blockFromRpc(rpc::BlockRef::Reader in);
void blockToRpc(const BlockLocation& in, rpc::BlockRef::Builder out);

}  // namespace kvtier
