// A small etcd v3 client over etcd's JSON gateway (HTTP/1.1 POST to /v3/..., keys and values in
// base64, 64-bit integers as JSON strings). Enough for leases, put, prefix range and prefix watch;
// no TLS, no auth, one endpoint.
//
// Threading: an EtcdClient belongs to the thread whose KJ event loop created it; every call
// returns a promise on that loop. The client must outlive every promise it returned. Dropping a
// promise cancels the request (and closes its connection).
//
// Errors: every promise fails with a kj::Exception built by toKjException (transport/rpc_codec.h),
// so fromKjException recovers the code:
//   UNAVAILABLE       etcd unreachable, the connection broke, the deadline passed, etcd said
//                     "unavailable", or a watch stream ended;
//   NOT_FOUND         etcd said the thing does not exist (revoke of an unknown lease);
//   INVALID_ARGUMENT  a bad endpoint or argument, or etcd refused the request as invalid;
//   INTERNAL          an answer that does not parse or exceeds the bounds below.
#pragma once

#include <kj/async-io.h>
#include <kj/compat/http.h>
#include <kj/timer.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/error.h"

namespace capnp {
class JsonCodec;
class MallocMessageBuilder;
}  // namespace capnp

namespace kvtier::cluster {

// Largest HTTP body read from etcd for one unary call; a member list of a few thousand records
// fits many times over, and a confused or hostile endpoint cannot make us buffer without end.
constexpr size_t kEtcdMaxResponseBytes = 4 << 20;
// Largest single JSON message of a watch stream (one batch of events).
constexpr size_t kEtcdMaxWatchMessageBytes = 4 << 20;
// Most keys one range call returns; more under the prefix fails with INTERNAL instead of
// silently cutting the list short.
constexpr int64_t kEtcdMaxRangeKeys = 4096;
// Longest key and value we send (etcd's own default request limit is 1.5 MiB).
constexpr size_t kEtcdMaxKeyBytes = 1024;
constexpr size_t kEtcdMaxValueBytes = 64 << 10;

struct EtcdClientOptions {
  // "http://HOST:PORT" (a trailing '/' is allowed). https is not supported.
  std::string endpoint;
  // Deadline of each unary call, connect included; for a watch, of its setup (until etcd confirms
  // the watch is created).
  kj::Duration requestTimeout = 2 * kj::SECONDS;
};

struct EtcdKeyValue {
  std::string key;
  std::string value;
  int64_t modRevision = 0;
  int64_t lease = 0;
};

struct EtcdRange {
  int64_t revision = 0;  // the store's revision when the range was read
  std::vector<EtcdKeyValue> kvs;
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  std::string key;
  std::string value;  // empty for kDelete
  int64_t modRevision = 0;
};

// Called on the event loop with each batch of events, in revision order. An exception thrown
// from it fails the watch.
using EtcdWatchCallback = std::function<void(const std::vector<EtcdEvent>&)>;

class EtcdClient {
 public:
  // Borrows network and timer, which must outlive the client. A malformed endpoint is not an
  // error here: every call then fails with INVALID_ARGUMENT (see validateEndpoint).
  EtcdClient(kj::Network& network, kj::Timer& timer, EtcdClientOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // INVALID_ARGUMENT unless endpoint is "http://HOST:PORT[/]".
  static Status validateEndpoint(std::string_view endpoint);

  // A new lease of ttlSeconds (1 ..); resolves to its id.
  kj::Promise<int64_t> grantLease(int64_t ttlSeconds);
  // Refreshes the lease; resolves to its remaining TTL in seconds, 0 when the lease is gone
  // (expired or revoked).
  kj::Promise<int64_t> keepAlive(int64_t lease);
  // Revokes the lease and deletes every key attached to it. NOT_FOUND if it is already gone.
  kj::Promise<void> revoke(int64_t lease);
  // Writes key = value, attached to lease (0: none). Resolves to the store's new revision.
  kj::Promise<int64_t> put(std::string key, std::string value, int64_t lease = 0);
  // Deletes key; resolves to the number of keys deleted (0 or 1).
  kj::Promise<int64_t> remove(std::string key);
  // Every key starting with prefix (at most kEtcdMaxRangeKeys), sorted by key.
  kj::Promise<EtcdRange> range(std::string prefix);
  // Watches every key starting with prefix from startRevision on (0: from now) and calls
  // onEvents with each batch. Holds its own connection. Never resolves: it fails with UNAVAILABLE
  // when the stream ends or breaks (or etcd cancels the watch, e.g. because startRevision was
  // compacted), and with INTERNAL on an answer it cannot parse. Drop the promise to stop.
  kj::Promise<void> watch(std::string prefix, int64_t startRevision, EtcdWatchCallback onEvents);

 private:
  struct HttpAnswer;
  class WatchReader;

  // POSTs body to path within the request deadline; resolves to the parsed JSON object of a 200
  // answer (as a message), and fails with the mapped error otherwise.
  kj::Promise<kj::Own<capnp::MallocMessageBuilder>> call(std::string_view path, kj::String body);

  kj::Timer& timer_;
  EtcdClientOptions options_;
  std::optional<Error> endpointError_;
  std::string baseUrl_;  // endpoint without the trailing '/'
  kj::Own<kj::HttpHeaderTable> headerTable_;
  kj::Own<kj::HttpClient> http_;
  kj::Own<capnp::JsonCodec> json_;
};

// The range_end that makes a range or watch cover every key starting with prefix (etcd's
// GetPrefixRangeEnd): prefix with its last byte below 0xff incremented, or "\0" (to the end of
// the key space) when there is none.
std::string etcdPrefixEnd(std::string_view prefix);

}  // namespace kvtier::cluster
