// A Cap'n Proto connection to a kvtierd socket without the SDK in the way, for tests that send
// the daemon what the SDK never would (tests/protocol_test.cc, tests/lane_test.cc): its own event
// loop and the daemon's bootstrap capability.
#pragma once

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include <string>

#include "schemas/kvtier.capnp.h"

namespace kvtier::test {

class RawConnection {
 public:
  explicit RawConnection(const std::string& socket) : io_(kj::setupAsyncIo()) {
    auto address = io_.provider->getNetwork()
                       .parseAddress(kj::str("unix:", socket.c_str()))
                       .wait(io_.waitScope);
    stream_ = address->connect().wait(io_.waitScope);
    rpc_ = kj::heap<capnp::TwoPartyClient>(*stream_);
    daemon_ = rpc_->bootstrap().castAs<rpc::Daemon>();
  }

  kj::WaitScope& ws() { return io_.waitScope; }
  rpc::Daemon::Client& daemon() { return daemon_; }

 private:
  kj::AsyncIoContext io_;
  kj::Own<kj::AsyncIoStream> stream_;
  kj::Own<capnp::TwoPartyClient> rpc_;
  rpc::Daemon::Client daemon_ = nullptr;
};

}  // namespace kvtier::test
