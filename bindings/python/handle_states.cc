#include "handle_states.h"

#include <algorithm>

namespace kvtier::python {

namespace {

[[noreturn]] void throwUsedAfterFork(const char* what) {
  throw PackageError(PackageError::Kind::kUsedAfterFork,
                     std::string(what) +
                         " was made in another process and cannot be used after fork(): "
                         "connect a new kvtier.Client in this process");
}

// Drops the expired entries of a registry when it has doubled since the last time.
template <typename T>
void pruneAndAdd(std::vector<std::weak_ptr<T>>& registry, const std::shared_ptr<T>& item) {
  if (registry.size() >= 16 && (registry.size() & (registry.size() - 1)) == 0) {
    std::erase_if(registry, [](const std::weak_ptr<T>& w) { return w.expired(); });
  }
  registry.push_back(item);
}

template <typename T>
std::vector<std::shared_ptr<T>> live(const std::vector<std::weak_ptr<T>>& registry) {
  std::vector<std::shared_ptr<T>> out;
  for (const auto& w : registry) {
    if (auto s = w.lock()) out.push_back(std::move(s));
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ClientState

std::shared_ptr<ClientState> ClientState::connect(const ClientOptions& options) {
  Result<std::unique_ptr<Client>> client = [&] {
    py::gil_scoped_release nogil;
    return Client::connect(options);
  }();
  return std::make_shared<ClientState>(unwrap(std::move(client)));
}

ClientState::ClientState(std::unique_ptr<Client> client)
    : pid_(getpid()), client_(std::move(client)) {}

ClientState::~ClientState() {
  // In a forked child the client's loop thread does not exist: destroying would wait for it.
  if (!inOwnerProcess()) {
    (void)client_.release();
    return;
  }
  client_.reset();
}

void ClientState::checkUsable() const {
  if (!inOwnerProcess()) throwUsedAfterFork("this kvtier.Client");
  if (closed_) throwError(ErrorCode::kReleased, "kvtier.Client is closed");
}

void ClientState::track(const std::shared_ptr<SpaceState>& space) {
  std::lock_guard lock(registryMu_);
  pruneAndAdd(spaces_, space);
}

void ClientState::track(const std::shared_ptr<HandleState>& handle) {
  std::lock_guard lock(registryMu_);
  pruneAndAdd(handles_, handle);
}

void ClientState::close() {
  if (closed_) return;
  if (!inOwnerProcess()) throwUsedAfterFork("this kvtier.Client");
  std::vector<std::shared_ptr<HandleState>> handles;
  std::vector<std::shared_ptr<SpaceState>> spaces;
  {
    std::lock_guard lock(registryMu_);
    handles = live(handles_);
  }
  size_t views = 0;
  for (const auto& h : handles) views += h->views();
  if (views > 0) {
    throw PackageError(PackageError::Kind::kBufferInUse,
                       "cannot close the kvtier.Client: " + std::to_string(views) +
                           " view(s) of its handles' blocks (NumPy arrays, or tensors and "
                           "memoryviews made from them) are still alive; delete them first");
  }
  // From here on no view is made (open() is false) and no call starts.
  closed_ = true;
  {
    py::gil_scoped_release nogil;
    std::unique_lock lock(mu_);  // waits for the calls in flight
    {
      std::lock_guard registry(registryMu_);
      handles = live(handles_);  // again: calls in flight may have added some
      spaces = live(spaces_);
      handles_.clear();
      spaces_.clear();
    }
    for (const auto& h : handles) h->endLocked();
    for (const auto& s : spaces) s->endLocked();
    client_.reset();  // closes the connection and joins the loop thread
  }
  // `handles` and `spaces` are dropped here, with the GIL held and mu_ free: their destructors
  // find their C++ objects already ended.
}

// ---------------------------------------------------------------------------------------------
// SpaceState

SpaceState::SpaceState(std::shared_ptr<ClientState> client, Layout layout)
    : client_(std::move(client)), layout_(std::move(layout)) {}

SpaceState::~SpaceState() {
  if (!client_->inOwnerProcess()) {
    (void)space_.release();
    return;
  }
  auto lock = client_->holdOpen();
  space_.reset();
}

// ---------------------------------------------------------------------------------------------
// HandleState

HandleState::HandleState(std::shared_ptr<SpaceState> space, bool readonly, const char* endedMessage)
    : space_(std::move(space)), readonly_(readonly), endedMessage_(endedMessage) {}

void HandleState::checkOpen() const {
  space_->client().checkUsable();
  if (!open_) throwError(ErrorCode::kReleased, endedMessage_);
}

std::span<uint8_t> HandleState::bytes(size_t index) const {
  checkOpen();
  if (index >= bytes_.size()) {
    throwError(ErrorCode::kInvalidArgument, "block ", index, " of a handle of ", bytes_.size(),
               " blocks");
  }
  if (bytes_[index].empty()) {
    throwError(ErrorCode::kNotSupported, "block ", index,
               " has no view in this process (a GPU block, or a write handle of a client that "
               "moves bytes inline): use copy_to() or write()");
  }
  return bytes_[index];
}

void HandleState::viewDestroyed() {
  --views_;
  if (views_ == 0 && endWhenUnviewed_ && client().inOwnerProcess()) {
    endWhenUnviewed_ = false;
    endNow();
  }
}

void HandleState::beginEnd(const char* action) {
  if (views_ > 0) {
    throw PackageError(PackageError::Kind::kBufferInUse,
                       std::string("cannot ") + action + ": " + std::to_string(views_) +
                           " view(s) of this handle's blocks (NumPy arrays, or tensors and "
                           "memoryviews made from them) are still alive; delete them, or copy "
                           "what you need, first");
  }
  open_ = false;
}

void HandleState::endAfterError() {
  if (!open() || !client().inOwnerProcess()) return;
  open_ = false;
  if (views_ > 0) {
    endWhenUnviewed_ = true;  // the blocks stay pinned until the last view goes
  } else {
    endNow();
  }
}

void HandleState::endNow() {
  py::gil_scoped_release nogil;
  auto lock = client().holdOpen();
  endLocked();
}

// ---------------------------------------------------------------------------------------------
// ReadHandleState

ReadHandleState::~ReadHandleState() {
  if (!client().inOwnerProcess()) {
    (void)handle_.release();
    return;
  }
  auto lock = client().holdOpen();
  endLocked();
}

void ReadHandleState::adopt(ReadHandle handle) {
  handle_ = std::make_unique<ReadHandle>(std::move(handle));
  matched_ = handle_->matchedTokens();
  begin_ = handle_->begin();
  end_ = handle_->end();
  firstPosition_ = handle_->firstPosition();
  inline_ = handle_->inlineData();
  hasState_ = handle_->hasState();
  partialTokens_ = handle_->partialTokens();
  refs_ = handle_->refs();
  std::vector<std::span<uint8_t>> bytes;
  for (size_t i = 0; i < handle_->blockCount(); ++i) {
    const auto b = handle_->block(i);
    // Writes are refused by the buffer protocol (readonly): the cast only shares one span type.
    bytes.emplace_back(const_cast<uint8_t*>(b.data()), b.size());
  }
  setBytes(std::move(bytes));
}

void ReadHandleState::endLocked() {
  std::lock_guard lock(mu_);
  handle_.reset();  // sends the release without waiting for it
}

void ReadHandleState::copyTo(uint64_t from, uint64_t to, void* out, size_t bytes) {
  checkOpen();
  client().call([&] {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the read handle was released");
    unwrap(handle_->copyTo(from, to, out, bytes));
  });
}

void ReadHandleState::copyState(void* out, size_t bytes) {
  checkOpen();
  client().call([&] {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the read handle was released");
    unwrap(handle_->copyState(out, bytes));
  });
}

void ReadHandleState::verify(size_t i) {
  checkOpen();
  client().call([&] {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the read handle was released");
    unwrap(handle_->verify(i));
  });
}

void ReadHandleState::gatherTo(uint64_t from, uint64_t to, const PagedKvCache& cache,
                               std::span<const int32_t> blockTable, void* stream) {
  checkOpen();
  space().call([&](Space& space) {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the read handle was released");
    unwrap(space.gatherTo(*handle_, from, to, cache, blockTable, stream));
  });
}

void ReadHandleState::release() {
  if (!client().inOwnerProcess()) throwUsedAfterFork("this kvtier.ReadHandle");
  if (!open()) return;
  beginEnd("release the read handle");
  endNow();
}

// ---------------------------------------------------------------------------------------------
// WriteHandleState

WriteHandleState::~WriteHandleState() {
  if (!client().inOwnerProcess()) {
    (void)handle_.release();
    return;
  }
  auto lock = client().holdOpen();
  endLocked();
}

void WriteHandleState::adopt(WriteHandle handle) {
  handle_ = std::make_unique<WriteHandle>(std::move(handle));
  begin_ = handle_->begin();
  end_ = handle_->end();
  firstPosition_ = handle_->firstPosition();
  std::vector<std::span<uint8_t>> bytes;
  for (size_t i = 0; i < handle_->blockCount(); ++i) bytes.push_back(handle_->block(i));
  setBytes(std::move(bytes));
}

void WriteHandleState::endLocked() {
  std::lock_guard lock(mu_);
  handle_.reset();  // an uncommitted write lease is dropped: the daemon aborts it
}

void WriteHandleState::write(uint64_t from, uint64_t to, const void* kv, size_t bytes) {
  checkOpen();
  client().call([&] {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the write handle was committed or aborted");
    unwrap(handle_->write(from, to, kv, bytes));
  });
}

void WriteHandleState::scatterFrom(uint64_t from, uint64_t to, const PagedKvCache& cache,
                                   std::span<const int32_t> blockTable, void* stream) {
  checkOpen();
  space().call([&](Space& space) {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the write handle was committed or aborted");
    unwrap(space.scatterTo(*handle_, from, to, cache, blockTable, stream));
  });
}

CommitInfo WriteHandleState::commit(uint64_t upTo) {
  checkOpen();
  beginEnd("commit the write handle");
  Result<CommitInfo> result = client().call([&] {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the write handle was committed or aborted");
    Result<CommitInfo> r = handle_->commit(upTo);
    // A bad upTo leaves the lease open for another try (WriteHandle::commit); anything else
    // ended it.
    if (r || r.code() != ErrorCode::kInvalidArgument) handle_.reset();
    return r;
  });
  if (!result && result.code() == ErrorCode::kInvalidArgument) open_ = true;
  return unwrap(std::move(result));
}

void WriteHandleState::abort() {
  checkOpen();
  beginEnd("abort the write handle");
  unwrap(client().call([&] {
    std::lock_guard lock(mu_);
    if (!handle_) throwError(ErrorCode::kReleased, "the write handle was committed or aborted");
    Status status = handle_->abort();
    handle_.reset();
    return status;
  }));
}

// ---------------------------------------------------------------------------------------------
// BlobHandleState

BlobHandleState::~BlobHandleState() {
  if (!client().inOwnerProcess()) {
    (void)handle_.release();
    return;
  }
  auto lock = client().holdOpen();
  endLocked();
}

void BlobHandleState::adopt(BlobHandle handle) {
  handle_ = std::make_unique<BlobHandle>(std::move(handle));
  const auto data = handle_->data();
  size_ = data.size();
  // Writes are refused by the buffer protocol (readonly): the cast only shares one span type.
  setBytes({std::span<uint8_t>(const_cast<uint8_t*>(data.data()), data.size())});
}

void BlobHandleState::endLocked() {
  std::lock_guard lock(mu_);
  handle_.reset();  // releases the read lease
}

void BlobHandleState::release() {
  if (!client().inOwnerProcess()) throwUsedAfterFork("this kvtier.BlobHandle");
  if (!open()) return;
  beginEnd("release the blob handle");
  endNow();
}

}  // namespace kvtier::python
