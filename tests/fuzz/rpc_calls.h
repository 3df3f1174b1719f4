// Fuzz input as a conversation of Cap'n Proto calls, for the RPC harnesses (daemon_rpc_fuzz.cc,
// peer_rpc_fuzz.cc), and the encoder make_seeds.cc writes their seeds with.
//
// An input is a run of records, each:
//
//   target:u8  interface:u8  method:u8  length:u16le  params[length]
//
// `target` picks a capability from the conversation's table (0: the bootstrap capability; every
// capability a call's results hold at the top level of their struct is appended, up to
// kMaxCapabilities), modulo the table's size; `interface` one of the harness's interfaces, modulo
// their count; `method` an ordinal of that interface, modulo its method count plus one (one
// ordinal past the last: an unknown method) — or kDropMethod, which drops the target capability
// instead of calling it (a lease let go mid-conversation). `params` is the call's parameter struct
// as one Cap'n Proto segment (words, little-endian, no segment table), at most kMaxParamBytes: it
// is read with bounded ReaderOptions and copied into a real request, so what reaches the server
// is a well-formed message whose values, lists and sizes are the fuzzer's.
//
// CallDriver plays such an input against a connection's bootstrap capability. Not thread-safe:
// it runs on the thread of the event loop it is given.
#pragma once

#include <capnp/any.h>
#include <capnp/capability.h>
#include <capnp/message.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <kj/async.h>
#include <kj/timer.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace kvtier::fuzz {

// Parameters of one call: 64 KiB is above every well-formed call the harnesses' seeds make and
// keeps a run's memory and time per input small.
inline constexpr size_t kMaxParamBytes = 64 << 10;
// Calls per input: bounds the time one input takes.
inline constexpr size_t kMaxCalls = 64;
// Capabilities a conversation keeps (sessions, spaces, leases); later ones are dropped at once.
inline constexpr size_t kMaxCapabilities = 32;
// The `method` byte that drops the target capability rather than calling it.
inline constexpr uint8_t kDropMethod = 0xff;

struct Interface {
  uint64_t id;
  uint16_t methods;
  template <typename T>
  static Interface of() {
    const auto schema = capnp::Schema::from<T>();
    return {schema.getProto().getId(), static_cast<uint16_t>(schema.getMethods().size())};
  }
};

// Appends one call record; `params` is a builder whose root is the call's parameter struct and
// which must fit one segment (MallocMessageBuilder's first segment: size it generously).
inline void appendCall(std::string& out, uint8_t target, uint8_t interface, uint8_t method,
                       capnp::MessageBuilder& params) {
  auto segments = params.getSegmentsForOutput();
  if (segments.size() != 1) throw std::runtime_error("params span several segments");
  const auto bytes = segments[0].asBytes();
  if (bytes.size() > kMaxParamBytes) throw std::runtime_error("params too large");
  out.push_back(static_cast<char>(target));
  out.push_back(static_cast<char>(interface));
  out.push_back(static_cast<char>(method));
  out.push_back(static_cast<char>(bytes.size() & 0xff));
  out.push_back(static_cast<char>(bytes.size() >> 8));
  out.append(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

inline void appendDrop(std::string& out, uint8_t target) {
  out.append({static_cast<char>(target), 0, static_cast<char>(kDropMethod), 0, 0});
}

class CallDriver {
 public:
  // How long one call may take before the harness calls it a hang: far above any bound a server
  // applies to itself (a peer call's deadline is 2 s), far below libFuzzer's -timeout.
  static constexpr kj::Duration kCallDeadline = 10 * kj::SECONDS;

  CallDriver(kj::WaitScope& ws, kj::Timer& timer, capnp::Capability::Client bootstrap,
             std::vector<Interface> interfaces)
      : ws_(ws), timer_(timer), interfaces_(std::move(interfaces)) {
    caps_.push_back(kj::mv(bootstrap));
  }

  // Plays the records of `data`; a call that fails is part of the conversation, not an error. A
  // call unanswered within kCallDeadline aborts the process (libFuzzer reports it as a crash).
  void play(const uint8_t* data, size_t size) {
    size_t calls = 0;
    while (size >= 5 && calls++ < kMaxCalls) {
      const uint8_t target = data[0], interface = data[1], method = data[2];
      size_t length = size_t{data[3]} | size_t{data[4]} << 8;
      data += 5;
      size -= 5;
      length = std::min({length, size, kMaxParamBytes});
      const uint8_t* params = data;
      data += length;
      size -= length;
      const size_t at = target % caps_.size();
      if (method == kDropMethod) {
        caps_[at] = capnp::Capability::Client(nullptr);
        continue;
      }
      capnp::Capability::Client cap = caps_[at];  // a copy: calls may grow the table
      const Interface& i = interfaces_[interface % interfaces_.size()];
      call(cap, i.id, static_cast<uint16_t>(method % (i.methods + 1)), params, length);
    }
  }

  size_t capabilities() const { return caps_.size(); }

 private:
  void call(capnp::Capability::Client& cap, uint64_t interfaceId, uint16_t methodId,
            const uint8_t* params, size_t length) {
    // Aligned words for the reader; a partial last word is zero-padded.
    std::vector<capnp::word> words((length + 7) / 8);
    if (length > 0) std::memcpy(words.data(), params, length);
    capnp::ReaderOptions limits;
    limits.traversalLimitInWords = kMaxParamBytes / 8;
    limits.nestingLimit = 16;
    auto request = cap.typelessRequest(interfaceId, methodId, nullptr);
    // No bytes: the call's default (empty) parameters.
    if (!words.empty()) {
      bool built = true;
      KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                     const kj::ArrayPtr<const capnp::word> segment(words.data(), words.size());
                     capnp::SegmentArrayMessageReader reader(kj::arrayPtr(&segment, 1), limits);
                     request.set(reader.getRoot<capnp::AnyPointer>());
                   })) {
        (void)e;
        built = false;  // not a message: nothing to send
      }
      if (!built) return;
    }
    bool answered = false;
    auto promise = request.send().then(
        [this, &answered, interfaceId, methodId](capnp::Response<capnp::AnyPointer>&& response) {
          answered = true;
          keepCapabilities(response);
          if (verbose_)
            std::fprintf(stderr, "call %llx.%u: ok, %zu capabilities\n",
                         static_cast<unsigned long long>(interfaceId), methodId, caps_.size());
        },
        [this, &answered, interfaceId, methodId](kj::Exception&& e) {
          answered = true;
          if (verbose_)
            std::fprintf(stderr, "call %llx.%u: %s\n", static_cast<unsigned long long>(interfaceId),
                         methodId, e.getDescription().cStr());
        });
    auto deadline = timer_.afterDelay(kCallDeadline);
    promise.exclusiveJoin(kj::mv(deadline)).wait(ws_);
    if (!answered) {
      std::fprintf(stderr, "kvtier fuzz: call %llx.%u unanswered after %lld s\n",
                   static_cast<unsigned long long>(interfaceId), methodId,
                   static_cast<long long>(kCallDeadline / kj::SECONDS));
      std::abort();
    }
  }

  void keepCapabilities(capnp::Response<capnp::AnyPointer>& response) {
    KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                   if (response.getPointerType() != capnp::PointerType::STRUCT) return;
                   for (auto p : response.getAs<capnp::AnyStruct>().getPointerSection()) {
                     if (p.getPointerType() == capnp::PointerType::CAPABILITY &&
                         caps_.size() < kMaxCapabilities) {
                       caps_.push_back(p.getAs<capnp::Capability>());
                     }
                   }
                 })) {
      (void)e;
    }
  }

  // KVTIER_FUZZ_VERBOSE=1: each call's outcome on stderr (to check what a seed reaches).
  const bool verbose_ = std::getenv("KVTIER_FUZZ_VERBOSE") != nullptr;
  kj::WaitScope& ws_;
  kj::Timer& timer_;
  std::vector<Interface> interfaces_;
  std::vector<capnp::Capability::Client> caps_;
};

}  // namespace kvtier::fuzz
