#include "daemon/cluster/etcd_client.h"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/encoding.h>

#include <charconv>
#include <cmath>
#include <utility>

#include "transport/rpc_codec.h"

namespace kvtier::cluster {
namespace {

using capnp::JsonValue;

// Bytes asked of the socket per read of a watch stream.
constexpr size_t kReadChunkBytes = 64 << 10;
// Longest lease TTL we ask for (etcd caps it at 9,000,000,000 s; a day is plenty for liveness).
constexpr int64_t kMaxLeaseTtlSeconds = 24 * 3600;

// What the tag in rpc_codec's exception descriptions starts with: an exception carrying it
// already has a kvtier code and passes through unchanged.
constexpr std::string_view kKvtierTag = "kvtier error ";

template <typename T>
kj::Promise<T> reject(const Error& error) {
  return kj::Promise<T>(toKjException(error));
}

// A failure below the HTTP layer (connect refused, reset, timeout) becomes UNAVAILABLE; a typed
// error thrown by our own parsing keeps its code.
[[noreturn]] void rethrowAsUnavailable(std::string_view what, kj::Exception&& e) {
  if (std::string_view(e.getDescription().cStr()).find(kKvtierTag) != std::string_view::npos) {
    kj::throwFatalException(kj::mv(e));
  }
  throwRpcError(makeError(ErrorCode::kUnavailable, "etcd ", what, ": ", e.getDescription().cStr()));
}

// etcd answers errors with gRPC status codes; map them to ours.
ErrorCode codeForGrpc(int64_t grpc) {
  switch (grpc) {
    case 3:   // INVALID_ARGUMENT
    case 11:  // OUT_OF_RANGE (e.g. a compacted revision)
      return ErrorCode::kInvalidArgument;
    case 5:  // NOT_FOUND
      return ErrorCode::kNotFound;
    case 6:   // ALREADY_EXISTS
    case 9:   // FAILED_PRECONDITION
    case 10:  // ABORTED
      return ErrorCode::kConflict;
    case 7:   // PERMISSION_DENIED
    case 16:  // UNAUTHENTICATED
      return ErrorCode::kPermissionDenied;
    case 8:  // RESOURCE_EXHAUSTED
      return ErrorCode::kFull;
    case 12:  // UNIMPLEMENTED
      return ErrorCode::kNotSupported;
    case 1:   // CANCELLED
    case 4:   // DEADLINE_EXCEEDED
    case 14:  // UNAVAILABLE (no leader, stopping)
      return ErrorCode::kUnavailable;
    default:
      return ErrorCode::kInternal;
  }
}

std::string base64(std::string_view bytes) {
  auto text = kj::encodeBase64(
      kj::arrayPtr(reinterpret_cast<const kj::byte*>(bytes.data()), bytes.size()), false);
  return std::string(text.cStr(), text.size());
}

// Read-only access to one JSON object of an etcd answer. Proto3 leaves out fields with default
// values, so a missing field reads as 0 / "" / false; a field of the wrong type is INTERNAL.
class JsonObject {
 public:
  JsonObject(JsonValue::Reader value, std::string_view what) : what_(what) {
    if (!value.isObject()) fail("is not a JSON object");
    fields_ = value.getObject();
  }

  std::optional<JsonValue::Reader> find(kj::StringPtr name) const {
    for (auto field : fields_) {
      if (field.getName() == name) return field.getValue();
    }
    return std::nullopt;
  }

  std::optional<JsonObject> object(kj::StringPtr name) const {
    auto v = find(name);
    if (!v || v->isNull()) return std::nullopt;
    return JsonObject(*v, what_);
  }

  // 64-bit integers come as strings ("123"); accept plain numbers too.
  int64_t int64(kj::StringPtr name) const {
    auto v = find(name);
    if (!v || v->isNull()) return 0;
    if (v->isString()) {
      auto text = v->getString();
      int64_t out = 0;
      auto [end, ec] = std::from_chars(text.begin(), text.end(), out);
      if (ec != std::errc() || end != text.end() || text.size() == 0) {
        fail(std::string("field ") + name.cStr() + " is not an integer");
      }
      return out;
    }
    if (v->isNumber()) {
      const double d = v->getNumber();
      // 2^53: beyond it a double no longer holds every integer.
      if (d != std::floor(d) || std::fabs(d) > 9007199254740992.0) {
        fail(std::string("field ") + name.cStr() + " is not an integer");
      }
      return static_cast<int64_t>(d);
    }
    fail(std::string("field ") + name.cStr() + " is not an integer");
  }

  bool boolean(kj::StringPtr name) const {
    auto v = find(name);
    if (!v || v->isNull()) return false;
    if (!v->isBoolean()) fail(std::string("field ") + name.cStr() + " is not a boolean");
    return v->getBoolean();
  }

  std::string string(kj::StringPtr name) const {
    auto v = find(name);
    if (!v || v->isNull()) return {};
    if (!v->isString()) fail(std::string("field ") + name.cStr() + " is not a string");
    auto text = v->getString();
    return std::string(text.cStr(), text.size());
  }

  // A bytes field: base64 in the JSON.
  std::string bytes(kj::StringPtr name) const {
    const std::string text = string(name);
    auto decoded = kj::decodeBase64(kj::arrayPtr(text.data(), text.size()));
    if (decoded.hadErrors) fail(std::string("field ") + name.cStr() + " is not base64");
    return std::string(reinterpret_cast<const char*>(decoded.begin()), decoded.size());
  }

  capnp::List<JsonValue>::Reader array(kj::StringPtr name) const {
    auto v = find(name);
    if (!v || v->isNull()) return {};
    if (!v->isArray()) fail(std::string("field ") + name.cStr() + " is not an array");
    return v->getArray();
  }

  [[noreturn]] void fail(std::string_view why) const {
    throwRpcError(makeError(ErrorCode::kInternal, "etcd answer to ", what_, ": ", why));
  }

 private:
  std::string what_;
  capnp::List<JsonValue::Field>::Reader fields_;
};

// Throws the error an etcd error object ({"error":..,"message":..,"code":N} for unary calls,
// {"grpc_code":N,"message":..} inside a stream) stands for.
[[noreturn]] void throwEtcdError(const JsonObject& error, std::string_view what) {
  int64_t grpc = error.int64("code");
  if (grpc == 0) grpc = error.int64("grpc_code");
  std::string message = error.string("message");
  if (message.empty()) message = error.string("error");
  throwRpcError(makeError(codeForGrpc(grpc), "etcd ", what, ": ", message));
}

// The request bodies are flat objects of strings (base64 bytes and int64-as-string), optionally
// wrapped in one outer field.
struct JsonField {
  const char* name;
  std::string value;
};

kj::String encodeObject(const capnp::JsonCodec& codec, std::initializer_list<JsonField> fields,
                        const char* wrapIn = nullptr) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<JsonValue>();
  auto object = root;
  if (wrapIn != nullptr) {
    auto outer = root.initObject(1);
    outer[0].setName(wrapIn);
    object = outer[0].initValue();
  }
  auto out = object.initObject(fields.size());
  unsigned i = 0;
  for (const auto& field : fields) {
    out[i].setName(field.name);
    out[i].initValue().setString(field.value);
    ++i;
  }
  return codec.encodeRaw(root);
}

// Appends the whole body to *out, failing with INTERNAL past limit bytes. *out must outlive the
// promise.
kj::Promise<void> readBounded(kj::AsyncInputStream& in, size_t limit, std::string* out) {
  const size_t old = out->size();
  out->resize(old + kReadChunkBytes);
  return in.tryRead(out->data() + old, 1, kReadChunkBytes)
      .then([&in, limit, out, old](size_t n) -> kj::Promise<void> {
        out->resize(old + n);
        if (n == 0) return kj::READY_NOW;
        if (out->size() > limit) {
          throwRpcError(
              makeError(ErrorCode::kInternal, "etcd answer is larger than ", limit, " bytes"));
        }
        return readBounded(in, limit, out);
      });
}

kj::Maybe<kj::Own<capnp::MallocMessageBuilder>> tryParseJson(const capnp::JsonCodec& codec,
                                                             std::string_view text,
                                                             kj::String* why = nullptr) {
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto root = message->initRoot<JsonValue>();
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                      [&]() { codec.decodeRaw(kj::arrayPtr(text.data(), text.size()), root); })) {
    if (why != nullptr) *why = kj::str(e->getDescription());
    return nullptr;
  }
  return kj::mv(message);
}

kj::Own<capnp::MallocMessageBuilder> parseJson(const capnp::JsonCodec& codec, std::string_view text,
                                               std::string_view what) {
  kj::String why;
  KJ_IF_MAYBE (message, tryParseJson(codec, text, &why)) {
    return kj::mv(*message);
  }
  throwRpcError(
      makeError(ErrorCode::kInternal, "etcd answer to ", what, " is not JSON: ", why.cStr()));
}

// Throws the error a non-200 answer stands for: etcd's {"error":..,"message":..,"code":<gRPC
// code>} when the body is one, else just its HTTP status.
[[noreturn]] void throwErrorAnswer(const capnp::JsonCodec& codec, std::string_view what,
                                   unsigned status, std::string_view body) {
  KJ_IF_MAYBE (message, tryParseJson(codec, body)) {
    auto root = (*message)->getRoot<JsonValue>();
    if (root.isObject()) {
      JsonObject object(root, what);
      auto nested = object.find("error");
      if (nested && nested->isObject()) throwEtcdError(JsonObject(*nested, what), what);
      if (object.find("code")) throwEtcdError(object, what);
    }
  }
  const ErrorCode code =
      status == 503 || status == 504 ? ErrorCode::kUnavailable : ErrorCode::kInternal;
  throwRpcError(makeError(code, "etcd ", what, ": HTTP ", status));
}

// One event of a watch answer ({"type":"DELETE","kv":{...}}; PUT is the default, left out).
EtcdEvent parseEvent(const JsonObject& event) {
  EtcdEvent out;
  auto v = event.find("type");
  if (v && v->isString()) {
    if (v->getString() == "DELETE") {
      out.type = EtcdEvent::Type::kDelete;
    } else if (v->getString() != "PUT") {
      event.fail("unknown event type");
    }
  } else if (v && v->isNumber()) {
    const int64_t type = event.int64("type");
    if (type != 0 && type != 1) event.fail("unknown event type");
    out.type = type == 1 ? EtcdEvent::Type::kDelete : EtcdEvent::Type::kPut;
  }
  auto kv = event.object("kv");
  if (!kv) event.fail("event without kv");
  out.key = kv->bytes("key");
  if (out.type == EtcdEvent::Type::kPut) out.value = kv->bytes("value");
  out.modRevision = kv->int64("mod_revision");
  return out;
}

}  // namespace

struct EtcdClient::HttpAnswer {
  unsigned status = 0;
  std::string body;
};

std::string etcdPrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    auto& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

Status EtcdClient::validateEndpoint(std::string_view endpoint) {
  constexpr std::string_view kScheme = "http://";
  if (endpoint.substr(0, kScheme.size()) != kScheme) {
    return makeError(ErrorCode::kInvalidArgument, "etcd endpoint '", endpoint,
                     "' must start with http:// (TLS is not supported)");
  }
  std::string_view hostPort = endpoint.substr(kScheme.size());
  if (!hostPort.empty() && hostPort.back() == '/') hostPort.remove_suffix(1);
  const size_t colon = hostPort.rfind(':');
  if (colon == std::string_view::npos || colon == 0 ||
      hostPort.find('/') != std::string_view::npos) {
    return makeError(ErrorCode::kInvalidArgument, "etcd endpoint '", endpoint,
                     "' is not http://HOST:PORT");
  }
  std::string_view port = hostPort.substr(colon + 1);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value == 0 || value > 65535) {
    return makeError(ErrorCode::kInvalidArgument, "etcd endpoint '", endpoint,
                     "' has no valid port");
  }
  return {};
}

EtcdClient::EtcdClient(kj::Network& network, kj::Timer& timer, EtcdClientOptions options)
    : timer_(timer),
      options_(std::move(options)),
      headerTable_(kj::heap<kj::HttpHeaderTable>()),
      json_(kj::heap<capnp::JsonCodec>()) {
  if (auto valid = validateEndpoint(options_.endpoint); !valid) {
    endpointError_ = valid.error();
  }
  baseUrl_ = options_.endpoint;
  if (!baseUrl_.empty() && baseUrl_.back() == '/') baseUrl_.pop_back();
  // A connection per request (idleTimeout 0): calls are a few per second at most, and a fresh
  // connection never inherits a half-read answer (etcd's error answers end in HTTP trailers).
  kj::HttpClientSettings settings;
  settings.idleTimeout = 0 * kj::SECONDS;
  http_ = kj::newHttpClient(timer, *headerTable_, network, nullptr, settings);
}

EtcdClient::~EtcdClient() = default;

kj::Promise<kj::Own<capnp::MallocMessageBuilder>> EtcdClient::call(std::string_view path,
                                                                   kj::String body) {
  if (endpointError_) return reject<kj::Own<capnp::MallocMessageBuilder>>(*endpointError_);
  std::string what(path);
  auto exchange = kj::evalNow([&]() {
    kj::HttpHeaders headers(*headerTable_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
    const std::string url = baseUrl_ + what;
    auto request =
        http_->request(kj::HttpMethod::POST, url.c_str(), headers, uint64_t{body.size()});
    auto write = request.body->write(body.begin(), body.size());
    return write.attach(kj::mv(request.body), kj::mv(body))
        .then([response = kj::mv(request.response)]() mutable { return kj::mv(response); })
        .then([](kj::HttpClient::Response&& response) {
          auto& in = *response.body;
          const unsigned status = response.statusCode;
          auto answer = kj::heap<HttpAnswer>(HttpAnswer{status, {}});
          auto read = readBounded(in, kEtcdMaxResponseBytes, &answer->body);
          return read.attach(kj::mv(response.body)).then([answer = kj::mv(answer)]() mutable {
            return kj::mv(answer);
          });
        });
  });
  return timer_.timeoutAfter(options_.requestTimeout, kj::mv(exchange))
      .catch_([what](kj::Exception&& e) -> kj::Own<HttpAnswer> {
        rethrowAsUnavailable(what, kj::mv(e));
      })
      .then([this, what](kj::Own<HttpAnswer>&& owned) {
        const HttpAnswer& answer = *owned;
        if (answer.status != 200) throwErrorAnswer(*json_, what, answer.status, answer.body);
        auto message = parseJson(*json_, answer.body, what);
        JsonObject root(message->getRoot<JsonValue>(), what);
        // Streaming calls (keepalive) answer {"result":..} or {"error":..} even with HTTP 200.
        if (auto error = root.object("error")) throwEtcdError(*error, what);
        return message;
      });
}

kj::Promise<int64_t> EtcdClient::grantLease(int64_t ttlSeconds) {
  if (ttlSeconds < 1 || ttlSeconds > kMaxLeaseTtlSeconds) {
    return reject<int64_t>(makeError(ErrorCode::kInvalidArgument, "lease TTL ", ttlSeconds,
                                     " s is outside 1 .. ", kMaxLeaseTtlSeconds));
  }
  auto body = encodeObject(*json_, {{"TTL", std::to_string(ttlSeconds)}});
  return call("/v3/lease/grant", kj::mv(body)).then([](kj::Own<capnp::MallocMessageBuilder> m) {
    JsonObject root(m->getRoot<JsonValue>(), "/v3/lease/grant");
    const std::string error = root.string("error");
    if (!error.empty()) {
      throwRpcError(makeError(ErrorCode::kUnavailable, "etcd /v3/lease/grant: ", error));
    }
    const int64_t id = root.int64("ID");
    if (id == 0) root.fail("no lease ID");
    return id;
  });
}

kj::Promise<int64_t> EtcdClient::keepAlive(int64_t lease) {
  auto body = encodeObject(*json_, {{"ID", std::to_string(lease)}});
  return call("/v3/lease/keepalive", kj::mv(body)).then([](kj::Own<capnp::MallocMessageBuilder> m) {
    JsonObject root(m->getRoot<JsonValue>(), "/v3/lease/keepalive");
    auto result = root.object("result");
    if (!result) root.fail("no result");
    // A lease that is gone answers without a TTL (0).
    return std::max<int64_t>(result->int64("TTL"), 0);
  });
}

kj::Promise<void> EtcdClient::revoke(int64_t lease) {
  auto body = encodeObject(*json_, {{"ID", std::to_string(lease)}});
  return call("/v3/lease/revoke", kj::mv(body)).ignoreResult();
}

kj::Promise<int64_t> EtcdClient::put(std::string key, std::string value, int64_t lease) {
  if (key.empty() || key.size() > kEtcdMaxKeyBytes || value.size() > kEtcdMaxValueBytes ||
      lease < 0) {
    return reject<int64_t>(makeError(ErrorCode::kInvalidArgument, "etcd put: key of ", key.size(),
                                     " bytes (1 .. ", kEtcdMaxKeyBytes, "), value of ",
                                     value.size(), " bytes (.. ", kEtcdMaxValueBytes, "), lease ",
                                     lease));
  }
  auto body = lease != 0 ? encodeObject(*json_, {{"key", base64(key)},
                                                 {"value", base64(value)},
                                                 {"lease", std::to_string(lease)}})
                         : encodeObject(*json_, {{"key", base64(key)}, {"value", base64(value)}});
  return call("/v3/kv/put", kj::mv(body)).then([](kj::Own<capnp::MallocMessageBuilder> m) {
    JsonObject root(m->getRoot<JsonValue>(), "/v3/kv/put");
    auto header = root.object("header");
    if (!header) root.fail("no header");
    return header->int64("revision");
  });
}

kj::Promise<int64_t> EtcdClient::remove(std::string key) {
  if (key.empty() || key.size() > kEtcdMaxKeyBytes) {
    return reject<int64_t>(
        makeError(ErrorCode::kInvalidArgument, "etcd delete: key of ", key.size(), " bytes"));
  }
  auto body = encodeObject(*json_, {{"key", base64(key)}});
  return call("/v3/kv/deleterange", kj::mv(body)).then([](kj::Own<capnp::MallocMessageBuilder> m) {
    return JsonObject(m->getRoot<JsonValue>(), "/v3/kv/deleterange").int64("deleted");
  });
}

kj::Promise<EtcdRange> EtcdClient::range(std::string prefix) {
  if (prefix.empty() || prefix.size() > kEtcdMaxKeyBytes) {
    return reject<EtcdRange>(
        makeError(ErrorCode::kInvalidArgument, "etcd range: prefix of ", prefix.size(), " bytes"));
  }
  auto body = encodeObject(*json_, {{"key", base64(prefix)},
                                    {"range_end", base64(etcdPrefixEnd(prefix))},
                                    {"limit", std::to_string(kEtcdMaxRangeKeys)}});
  return call("/v3/kv/range", kj::mv(body)).then([](kj::Own<capnp::MallocMessageBuilder> m) {
    JsonObject root(m->getRoot<JsonValue>(), "/v3/kv/range");
    if (root.boolean("more")) {
      root.fail("more than " + std::to_string(kEtcdMaxRangeKeys) + " keys under the prefix");
    }
    auto header = root.object("header");
    if (!header) root.fail("no header");
    EtcdRange out;
    out.revision = header->int64("revision");
    auto kvs = root.array("kvs");
    if (kvs.size() > kEtcdMaxRangeKeys) root.fail("too many keys");
    out.kvs.reserve(kvs.size());
    for (auto entry : kvs) {
      JsonObject kv(entry, "/v3/kv/range");
      out.kvs.push_back(EtcdKeyValue{kv.bytes("key"), kv.bytes("value"), kv.int64("mod_revision"),
                                     kv.int64("lease")});
    }
    return out;
  });
}

// Reads a watch stream: the gateway sends one JSON object per line ({"result":{...}}), each in
// its own HTTP chunk, for as long as the watch lives.
class EtcdClient::WatchReader {
 public:
  WatchReader(const capnp::JsonCodec& json, kj::Own<kj::AsyncInputStream> body,
              EtcdWatchCallback onEvents)
      : json_(json), body_(kj::mv(body)), onEvents_(std::move(onEvents)) {}

  // Handles messages until etcd confirms the watch exists.
  kj::Promise<void> untilCreated() {
    return next().then([this]() -> kj::Promise<void> {
      if (created_) return kj::READY_NOW;
      return untilCreated();
    });
  }

  kj::Promise<void> forever() {
    return next().then([this]() { return forever(); });
  }

 private:
  static constexpr std::string_view kWhat = "/v3/watch";

  // Handles the next message, reading more of the stream as needed.
  kj::Promise<void> next() {
    const size_t newline = pending_.find('\n', scanned_);
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      scanned_ = 0;
      if (line.find_first_not_of(" \t\r") != std::string::npos) handle(line);
      return kj::READY_NOW;
    }
    scanned_ = pending_.size();  // no newline up to here: do not scan it again
    if (pending_.size() > kEtcdMaxWatchMessageBytes) {
      throwRpcError(makeError(ErrorCode::kInternal, "etcd watch message is larger than ",
                              kEtcdMaxWatchMessageBytes, " bytes"));
    }
    const size_t old = pending_.size();
    pending_.resize(old + kReadChunkBytes);
    return body_->tryRead(pending_.data() + old, 1, kReadChunkBytes)
        .then([this, old](size_t n) -> kj::Promise<void> {
          pending_.resize(old + n);
          if (n == 0) {
            throwRpcError(makeError(ErrorCode::kUnavailable, "etcd watch stream ended"));
          }
          return next();
        });
  }

  void handle(std::string_view line) {
    auto message = parseJson(json_, line, kWhat);
    JsonObject root(message->getRoot<JsonValue>(), kWhat);
    if (auto error = root.object("error")) throwEtcdError(*error, kWhat);
    auto result = root.object("result");
    if (!result) root.fail("no result");
    if (result->boolean("created")) created_ = true;
    if (result->boolean("canceled")) {
      throwRpcError(makeError(ErrorCode::kUnavailable, "etcd canceled the watch (compacted at ",
                              result->int64("compact_revision"),
                              "): ", result->string("cancel_reason")));
    }
    auto list = result->array("events");
    if (list.size() == 0) return;
    std::vector<EtcdEvent> events;
    events.reserve(list.size());
    for (auto entry : list) events.push_back(parseEvent(JsonObject(entry, kWhat)));
    onEvents_(events);
  }

  const capnp::JsonCodec& json_;
  kj::Own<kj::AsyncInputStream> body_;
  EtcdWatchCallback onEvents_;
  std::string pending_;  // bytes read and not yet handled
  size_t scanned_ = 0;   // pending_[0, scanned_) holds no newline
  bool created_ = false;
};

kj::Promise<void> EtcdClient::watch(std::string prefix, int64_t startRevision,
                                    EtcdWatchCallback onEvents) {
  if (endpointError_) return reject<void>(*endpointError_);
  if (prefix.empty() || prefix.size() > kEtcdMaxKeyBytes || startRevision < 0 || !onEvents) {
    return reject<void>(makeError(ErrorCode::kInvalidArgument, "etcd watch: prefix of ",
                                  prefix.size(), " bytes, start revision ", startRevision));
  }
  auto body = encodeObject(*json_,
                           {{"key", base64(prefix)},
                            {"range_end", base64(etcdPrefixEnd(prefix))},
                            {"start_revision", std::to_string(startRevision)}},
                           "create_request");
  static constexpr std::string_view kWhat = "/v3/watch";
  // The setup (connect, answer headers, "created") has the request deadline; the stream after it
  // has none: an idle watch is normal, and a dead etcd shows as a closed connection here or as
  // failing keepalives in the caller.
  auto setup = kj::evalNow([&]() {
    kj::HttpHeaders headers(*headerTable_);
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
    const std::string url = baseUrl_ + std::string(kWhat);
    auto request =
        http_->request(kj::HttpMethod::POST, url.c_str(), headers, uint64_t{body.size()});
    auto write = request.body->write(body.begin(), body.size());
    return write.attach(kj::mv(request.body), kj::mv(body))
        .then([response = kj::mv(request.response)]() mutable { return kj::mv(response); })
        .then([this, onEvents = std::move(onEvents)](kj::HttpClient::Response&& response) mutable
              -> kj::Promise<kj::Own<WatchReader>> {
          if (response.statusCode != 200) {
            const unsigned status = response.statusCode;
            auto& in = *response.body;
            auto text = kj::heap<std::string>();
            auto read = readBounded(in, kEtcdMaxResponseBytes, text.get());
            return read.attach(kj::mv(response.body))
                .then([this, status, text = kj::mv(text)]() -> kj::Own<WatchReader> {
                  throwErrorAnswer(*json_, kWhat, status, *text);
                });
          }
          auto reader = kj::heap<WatchReader>(*json_, kj::mv(response.body), std::move(onEvents));
          auto created = reader->untilCreated();
          return created.then([reader = kj::mv(reader)]() mutable { return kj::mv(reader); });
        });
  });
  return timer_.timeoutAfter(options_.requestTimeout, kj::mv(setup))
      .then([](kj::Own<WatchReader>&& reader) {
        auto& r = *reader;
        return r.forever().attach(kj::mv(reader));
      })
      .catch_([](kj::Exception&& e) { rethrowAsUnavailable(kWhat, kj::mv(e)); });
}

}  // namespace kvtier::cluster
