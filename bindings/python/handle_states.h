// What the Python objects of the package hold: the SDK's Client, Space and handles, with the rules
// that keep Python away from freed memory and from a client that cannot answer.
//
// Ownership: a Block holds its HandleState, which holds its SpaceState, which holds its
// ClientState (std::shared_ptr): a C++ object lives as long as anything that needs it, whatever
// order Python drops them in. Client.close() ends them all early (handles, then spaces, then the
// connection), but only while no view of a block of its handles is alive.
//
// Views: a block's bytes reach NumPy and PyTorch through a view object that exports them with the
// buffer protocol (block_buffer.h), and every live view object is counted on its handle. An array,
// a memoryview or a tensor of a block holds its view object (directly or through the array), so
// as long as the count is zero nothing in the process can reach the block's memory. A handle is
// never released, committed or aborted while it has views (kvtier.BufferInUse, nothing changed),
// so an array never outlives the pin on the bytes it sees; and a handle that has ended makes no
// view (kvtier.Released).
//
// Fork: a child process inherits these objects but not the client's event-loop thread. There
// every use raises kvtier.UsedAfterFork, and destructors leak the C++ objects instead of
// destroying them (destroying would wait on the missing thread); nothing reaches the daemon.
//
// Threads: Python calls release the GIL around everything that waits (ClientState::call). The
// GIL guards the Python-side flags (open, closed, view counts); ClientState::mu_ keeps the C++
// objects alive while a call uses them (shared) and lets close() end them (exclusive); a handle's
// own mutex serialises calls into its C++ handle. Lock order: GIL released, then mu_, then a
// handle's mutex; nothing holding mu_ takes the GIL.
#pragma once

#include <unistd.h>

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "kvtier/client.h"
#include "python_errors.h"

namespace kvtier::python {

namespace py = pybind11;

class SpaceState;
class HandleState;

class ClientState {
 public:
  // Connects with the GIL released while it waits for the daemon.
  static std::shared_ptr<ClientState> connect(const ClientOptions& options);
  explicit ClientState(std::unique_ptr<Client> client);
  ~ClientState();
  ClientState(const ClientState&) = delete;
  ClientState& operator=(const ClientState&) = delete;

  // GIL held. UsedAfterFork in another process than the one that connected; Released once
  // closed.
  void checkUsable() const;
  bool inOwnerProcess() const { return getpid() == pid_; }
  bool closed() const { return closed_; }  // GIL held

  // Runs `f` with the GIL released while the connection is held open; `f` may use client() and
  // this client's spaces and handles, must not touch Python objects and must not call() again.
  // GIL held on entry; Released if the client is (or gets) closed first.
  template <typename F>
  decltype(auto) call(F&& f) {
    checkUsable();
    py::gil_scoped_release nogil;
    std::shared_lock lock(mu_);
    if (!client_) throwError(ErrorCode::kReleased, "kvtier.Client is closed");
    return f();
  }
  // Valid inside call() only.
  Client& client() { return *client_; }

  // Records a space or handle so that close() ends it first. Inside call().
  void track(const std::shared_ptr<SpaceState>& space);
  void track(const std::shared_ptr<HandleState>& handle);

  // Ends every handle (read leases released, unfinished writes aborted), every space and the
  // connection. BufferInUse, and nothing changed, while a view of a block of one of its handles
  // is alive. Idempotent. GIL held on entry.
  void close();

  // For destructors that end a C++ object of this client outside call(): holds the connection
  // open against close(). May wait for a close() in progress (which never takes the GIL).
  std::shared_lock<std::shared_mutex> holdOpen() { return std::shared_lock(mu_); }
  bool connected() const { return client_ != nullptr; }  // under holdOpen() or call()

 private:
  const pid_t pid_;
  // Shared: a call or destructor uses client_ or a C++ object of it; exclusive: close().
  std::shared_mutex mu_;
  std::unique_ptr<Client> client_;  // null once closed; reset under mu_ exclusive
  bool closed_ = false;             // guarded by the GIL
  std::mutex registryMu_;
  std::vector<std::weak_ptr<SpaceState>> spaces_;    // guarded by registryMu_
  std::vector<std::weak_ptr<HandleState>> handles_;  // guarded by registryMu_
};

class SpaceState : public std::enable_shared_from_this<SpaceState> {
 public:
  SpaceState(std::shared_ptr<ClientState> client, Layout layout);
  ~SpaceState();
  SpaceState(const SpaceState&) = delete;
  SpaceState& operator=(const SpaceState&) = delete;

  ClientState& client() { return *client_; }
  const Layout& layout() const { return layout_; }
  uint64_t fingerprint() const { return fingerprint_; }
  int device() const { return device_; }  // the CUDA device of its pool, -1: the host pool

  // As ClientState::call, with the C++ Space: f(Space&).
  template <typename F>
  decltype(auto) call(F&& f) {
    return client_->call([&]() -> decltype(auto) {
      if (!space_) throwError(ErrorCode::kReleased, "kvtier.Client is closed");
      return f(*space_);
    });
  }
  // Inside call() (ClientState::open): the C++ Space this state stands for.
  void adopt(std::unique_ptr<Space> space) {
    fingerprint_ = space->fingerprint();
    device_ = space->device();
    space_ = std::move(space);
  }
  // close(), under the client's mu_ exclusive: destroys the C++ Space.
  void endLocked() { space_.reset(); }

 private:
  std::shared_ptr<ClientState> client_;
  std::unique_ptr<Space> space_;  // null once the client closed; guarded by the client's mu_
  Layout layout_;                 // a copy: readable after close
  uint64_t fingerprint_ = 0;      // set before Python sees the space
  int device_ = -1;               // likewise
};

// What read, write and blob handles share: the blocks' bytes (a blob handle: its one blob) and
// the views of them.
class HandleState {
 public:
  // `endedMessage`: what Released says once the handle has ended.
  HandleState(std::shared_ptr<SpaceState> space, bool readonly, const char* endedMessage);
  virtual ~HandleState() = default;
  HandleState(const HandleState&) = delete;
  HandleState& operator=(const HandleState&) = delete;

  SpaceState& space() { return *space_; }
  ClientState& client() { return space_->client(); }
  const Layout& layout() const { return space_->layout(); }
  bool readonly() const { return readonly_; }

  // GIL held. True while the handle may be used: not ended, its client not closed.
  bool open() const { return open_ && !space_->client().closed(); }
  // GIL held. Raises UsedAfterFork, or Released, unless open().
  void checkOpen() const;
  size_t blockCount() const { return bytes_.size(); }
  // GIL held, open: the bytes of block i. NotSupported when they are not in this process's
  // memory (a GPU block; a write handle of a client that moves bytes inline).
  std::span<uint8_t> bytes(size_t index) const;

  // A view object of one of its blocks was made or destroyed (GIL held; block_buffer.h).
  void viewMade() { ++views_; }
  void viewDestroyed();
  size_t views() const { return views_; }

  // GIL held. Refuses, with BufferInUse and nothing changed, while views are alive; otherwise
  // marks the handle ended for Python (the C++ side ends afterwards).
  void beginEnd(const char* action);
  // GIL held, the handle open, an exception leaving its `with` block: end it now, or, while
  // views are alive, as soon as the last one goes (never mask the exception in flight).
  void endAfterError();
  // Ends the C++ handle: a read lease is released, a write lease dropped (= aborted). Caller
  // holds the client open (holdOpen() or close()), not mu_. Idempotent.
  virtual void endLocked() = 0;

 protected:
  // Inside call(): the blocks' bytes of the adopted C++ handle.
  void setBytes(std::vector<std::span<uint8_t>> bytes) { bytes_ = std::move(bytes); }
  // Ends the C++ handle from Python (GIL held, released while it waits for the lock).
  void endNow();
  std::mutex mu_;     // serialises calls into the C++ handle (taken inside call())
  bool open_ = true;  // guarded by the GIL

 private:
  std::shared_ptr<SpaceState> space_;
  const bool readonly_;
  const char* endedMessage_;
  std::vector<std::span<uint8_t>> bytes_;  // set once, before Python sees the handle
  size_t views_ = 0;                       // guarded by the GIL
  bool endWhenUnviewed_ = false;           // guarded by the GIL
};

class ReadHandleState : public HandleState {
 public:
  explicit ReadHandleState(std::shared_ptr<SpaceState> space)
      : HandleState(std::move(space), true, "the read handle was released") {}
  ~ReadHandleState() override;
  // Inside call(): takes the C++ handle.
  void adopt(ReadHandle handle);
  void endLocked() override;

  uint64_t matchedTokens() const { return matched_; }
  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  uint64_t firstPosition() const { return firstPosition_; }
  bool inlineData() const { return inline_; }
  // The blocks' references (set once at adopt; names, valid after release: a read of one whose
  // block was reused since is STALE_REFERENCE).
  const std::vector<BlockRef>& refs() const { return refs_; }

  // Copies [from, to) packed into `out` (`bytes` long; GIL released while it copies).
  void copyTo(uint64_t from, uint64_t to, void* out, size_t bytes);
  // A lookup in a space whose layout has a state: whether the answer holds one, and the positions
  // past its last whole block (their KV in the first slots of the last block). Set once at adopt.
  bool hasState() const { return hasState_; }
  uint32_t partialTokens() const { return partialTokens_; }
  // Copies the state (layout().stateBytes bytes) into `out`, each chunk checked against its
  // writer's checksum: CHECKSUM_MISMATCH, NOT_FOUND without a state, INVALID_ARGUMENT for another
  // size (ReadHandle::copyState). GIL released while it copies.
  void copyState(void* out, size_t bytes);
  // ReadHandle::verify of block i (GIL released while it reads the block).
  void verify(size_t i);
  // Space::gatherTo of [from, to) into an engine's paged cache, with this handle's space (GIL
  // released while the kernel runs).
  void gatherTo(uint64_t from, uint64_t to, const PagedKvCache& cache,
                std::span<const int32_t> blockTable, void* stream);
  // Releases the lease (BufferInUse while views are alive). Idempotent.
  void release();

 private:
  std::unique_ptr<ReadHandle> handle_;  // guarded by mu_ and the client's mu_
  uint64_t matched_ = 0, begin_ = 0, end_ = 0, firstPosition_ = 0;
  bool inline_ = false;
  bool hasState_ = false;
  uint32_t partialTokens_ = 0;
  std::vector<BlockRef> refs_;
};

class WriteHandleState : public HandleState {
 public:
  explicit WriteHandleState(std::shared_ptr<SpaceState> space)
      : HandleState(std::move(space), false, "the write handle was committed or aborted") {}
  ~WriteHandleState() override;
  void adopt(WriteHandle handle);
  void endLocked() override;

  uint64_t begin() const { return begin_; }
  uint64_t end() const { return end_; }
  uint64_t firstPosition() const { return firstPosition_; }

  void write(uint64_t from, uint64_t to, const void* kv, size_t bytes);
  // Space::scatterTo of [from, to) from an engine's paged cache, with this handle's space (GIL
  // released while the kernel runs).
  void scatterFrom(uint64_t from, uint64_t to, const PagedKvCache& cache,
                   std::span<const int32_t> blockTable, void* stream);
  // Commits [begin, upTo) (BufferInUse while views are alive). A bad upTo leaves it open.
  CommitInfo commit(uint64_t upTo);
  void abort();

 private:
  std::unique_ptr<WriteHandle> handle_;  // guarded by mu_ and the client's mu_
  uint64_t begin_ = 0, end_ = 0, firstPosition_ = 0;
};

// A blob (a recurrent-state checkpoint, a position-independent entry) under a read lease: one
// read-only "block" of the blob's size, viewed as raw bytes.
class BlobHandleState : public HandleState {
 public:
  explicit BlobHandleState(std::shared_ptr<SpaceState> space)
      : HandleState(std::move(space), true, "the blob handle was released") {}
  ~BlobHandleState() override;
  // Inside call(): takes the C++ handle.
  void adopt(BlobHandle handle);
  void endLocked() override;

  size_t size() const { return size_; }  // readable after release
  // Releases the lease (BufferInUse while views are alive). Idempotent.
  void release();

 private:
  std::unique_ptr<BlobHandle> handle_;  // guarded by mu_ and the client's mu_
  size_t size_ = 0;
};

}  // namespace kvtier::python
