// kvtier.ReadHandle, BlobHandle and WriteHandle: handle_bindings.h.
#include "handle_bindings.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>

#include "arguments.h"
#include "block_buffer.h"
#include "handle_states.h"
#include "python_errors.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

// The index of block `i` (negative: from the end) of a handle, or IndexError.
size_t blockIndex(const HandleState& h, py::ssize_t i) {
  const auto n = static_cast<py::ssize_t>(h.blockCount());
  if (i < 0) i += n;
  if (i < 0 || i >= n) throw py::index_error("block index out of range");
  return static_cast<size_t>(i);
}

py::object blockOf(const std::shared_ptr<HandleState>& h, py::ssize_t i) {
  const size_t index = blockIndex(*h, i);
  (void)h->bytes(index);  // Released, UsedAfterFork, NotSupported now rather than at numpy()
  return makeBlock(h, index);
}

py::list blocksOf(const std::shared_ptr<HandleState>& h) {
  h->checkOpen();
  py::list blocks;
  for (size_t i = 0; i < h->blockCount(); ++i)
    blocks.append(blockOf(h, static_cast<py::ssize_t>(i)));
  return blocks;
}

py::object copyTo(ReadHandleState& h, std::optional<uint64_t> start, std::optional<uint64_t> stop,
                  py::object out) {
  h.checkOpen();
  const uint64_t from = start.value_or(h.begin()), to = stop.value_or(h.end());
  if (to < from) throwError(ErrorCode::kInvalidArgument, "copy of [", from, ", ", to, ")");
  // The handle's range before any allocation: a wild stop is InvalidArgument, not MemoryError.
  if (from < h.begin() || to > h.end()) {
    throwError(ErrorCode::kInvalidArgument, "copy of [", from, ", ", to,
               ") is outside the handle's [", h.begin(), ", ", h.end(), ")");
  }
  if (out.is_none()) {
    out = py::module_::import("numpy").attr("empty")(packedShape(h.layout(), to - from),
                                                     numpyDtypeName(h.layout().dtype));
  }
  PackedKv buffer(out, h.layout(), to - from, true, "out");
  // A layout without KV (a state only) has no bytes to copy, and no blocks to copy them from.
  if (h.layout().hasKv()) h.copyTo(from, to, buffer.data(), buffer.bytes());
  return out;
}

// ReadHandle.read_state: the state into `out` (a new uint8 array when None), checked against its
// writer's checksums.
py::object readState(ReadHandleState& h, py::object out) {
  h.checkOpen();
  // Before any allocation: a handle without a state is NotFound, not a state-sized array.
  if (!h.hasState()) {
    throwError(ErrorCode::kNotFound,
               "the read handle holds no state (a miss, a get, a lookup with bind_seq, or a "
               "layout without state_bytes)");
  }
  const uint64_t stateBytes = h.layout().stateBytes;
  if (out.is_none()) out = py::module_::import("numpy").attr("empty")(stateBytes, "uint8");
  const BytesLike buffer(out, "out", true);
  if (buffer.size() != stateBytes) {
    throwError(ErrorCode::kInvalidArgument, "out is ", buffer.size(),
               " bytes; the layout's state is ", stateBytes);
  }
  h.copyState(buffer.writableData(), buffer.size());
  return out;
}

void writeKv(WriteHandleState& h, uint64_t start, uint64_t stop, py::handle kv) {
  h.checkOpen();
  if (stop < start) throwError(ErrorCode::kInvalidArgument, "write of [", start, ", ", stop, ")");
  PackedKv buffer(kv, h.layout(), stop - start, false, "kv");
  h.write(start, stop, buffer.data(), buffer.bytes());
}

// __exit__ of a read or blob handle: release; after an exception, never mask it
// (endAfterError).
template <typename Handle>
bool exitRelease(Handle& h, py::handle excType) {
  if (excType.is_none()) {
    h.release();
  } else {
    h.endAfterError();
  }
  return false;
}

// __exit__ of a write handle: commit what is not committed yet; after an exception, abort.
bool exitWrite(WriteHandleState& h, py::handle excType) {
  if (!h.open()) return false;
  if (excType.is_none()) {
    (void)h.commit(kEndPosition);
  } else {
    h.endAfterError();  // the lease is dropped: the daemon aborts it
  }
  return false;
}

}  // namespace

void defineHandles(py::module_& m) {
  py::class_<ReadHandleState, std::shared_ptr<ReadHandleState>>(m, "ReadHandle", R"doc(
Blocks pinned under a read lease (Space.get or Space.lookup), readable in place. A lookup in a
space whose layout has a state pins the prefix state at `end` with them (has_state, read_state).

A context manager: leaving the `with` block releases the lease. release() refuses
(kvtier.BufferInUse, nothing changed) while an array, tensor or memoryview of one of its blocks
is alive: delete them first (or copy what you keep). When an exception leaves the `with` block
the release happens as soon as the last such array is gone, so the exception is never masked.
After release every method, and numpy() of any of its blocks, raises kvtier.Released.
)doc")
      .def_property_readonly("matched_tokens", &ReadHandleState::matchedTokens,
                             "lookup: tokens matched; get: end - begin.")
      .def_property_readonly("begin", &ReadHandleState::begin)
      .def_property_readonly("end", &ReadHandleState::end)
      .def_property_readonly("first_position", &ReadHandleState::firstPosition,
                             "Sequence position of block(0)'s first token slot.")
      .def_property_readonly("block_count", &ReadHandleState::blockCount)
      .def_property_readonly(
          "refs", &ReadHandleState::refs,
          "The BlockRef of each block, then of the state's chunks past them (names: they "
          "outlive the handle).")
      .def_property_readonly("inline_data", &ReadHandleState::inlineData,
                             "True when the blocks are private copies (a map_pool=False client).")
      .def_property_readonly("has_state", &ReadHandleState::hasState, R"doc(
True when the handle holds a prefix state at `end` (a lookup in a space whose layout has
state_bytes): read it with read_state().
)doc")
      .def_property_readonly("partial_tokens", &ReadHandleState::partialTokens, R"doc(
With a state inside a block: the positions past the last whole block (end % block_tokens, else
0). Their KV is in the first slots of the last block, which copy_to reads as any other.
)doc")
      .def_property_readonly("closed", [](const ReadHandleState& h) { return !h.open(); })
      .def(
          "block",
          [](const std::shared_ptr<ReadHandleState>& h, py::ssize_t i) { return blockOf(h, i); },
          "index"_a, "Block `index` (read-only, zero-copy).")
      .def(
          "blocks", [](const std::shared_ptr<ReadHandleState>& h) { return blocksOf(h); },
          "Every Block of the handle, in order.")
      .def("copy_to", &copyTo, "start"_a = py::none(), "stop"_a = py::none(), "out"_a = py::none(),
           R"doc(
Copies positions [start, stop) (default: [begin, end)) packed into `out` (a new array when None;
else a writable C-contiguous array of shape layout.packed_shape(stop - start)) and returns it.
Each block is checked against its writer's checksum in the same pass as the copy:
kvtier.ChecksumMismatch when one changed in the pool (nothing of `out` may be used; the daemon
is told and drops the block, so the next lookup stops before it).
)doc")
      .def(
          "verify",
          [](const std::shared_ptr<ReadHandleState>& h, py::ssize_t i) {
            h->verify(blockIndex(*h, i));
          },
          "index"_a, R"doc(
Checks block `index` (negative: from the end) in the pool against its writer's checksum, for
readers of block(i) in place: kvtier.ChecksumMismatch when its bytes changed (use none of them;
the daemon is told, as with copy_to). Returns None when they match or the block has none (a
partial block). kvtier.NotSupported for a block in GPU memory.
)doc")
      .def("read_state", &readState, "out"_a = py::none(), R"doc(
Copies the prefix state the handle holds (layout.state_bytes bytes) into `out` and returns it:
a new 1-D uint8 NumPy array when None, else any writable C-contiguous buffer of exactly that
many bytes (a NumPy array of any dtype, a bytearray). Every chunk of the state is checked against
the checksum its writer took, in the same pass: kvtier.ChecksumMismatch if the bytes in the pool
changed since (nothing of them may reach a model). kvtier.NotFound when has_state is False,
kvtier.InvalidArgument for an `out` of another size or read-only.
)doc")
      .def("release", &ReadHandleState::release, "Unpins the blocks. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](ReadHandleState& h, py::handle excType, py::handle,
                          py::handle) { return exitRelease(h, excType); })
      .def("__repr__", [](const ReadHandleState& h) {
        return "<kvtier.ReadHandle [" + std::to_string(h.begin()) + ", " + std::to_string(h.end()) +
               "), " + std::to_string(h.blockCount()) + " blocks" + (h.open() ? "" : ", released") +
               ">";
      });

  py::class_<BlobHandleState, std::shared_ptr<BlobHandleState>>(m, "BlobHandle", R"doc(
A blob — a recurrent-state checkpoint (Space.get_checkpoint) or a position-independent entry
(Space.get_entry) — pinned under a read lease, readable in place.

numpy() (or np.asarray(handle)) is a NumPy array viewing its bytes in the daemon's shared pool,
no copy: read-only, 1-D uint8; it is a buffer (memoryview(a), np.frombuffer(a, dtype),
torch.frombuffer(a, dtype=...) share the memory) and a.view(dtype) reads another dtype.
tobytes() copies the bytes. The handle itself is not a buffer.

A context manager: leaving the `with` block releases the lease. release() refuses
(kvtier.BufferInUse, nothing changed) while an array of the bytes — or a memoryview, array or
tensor made from one — is alive. When an exception leaves the `with` block the release happens as soon
as the last of them is gone, so the exception is never masked. After release every method
raises kvtier.Released.
)doc")
      .def_property_readonly("nbytes", &BlobHandleState::size, "Bytes of the blob.")
      .def_property_readonly("closed", [](const BlobHandleState& h) { return !h.open(); })
      .def(
          "numpy", [](const std::shared_ptr<BlobHandleState>& h) { return bytesArray(h, 0); },
          "The blob's bytes as a read-only 1-D uint8 NumPy array over the shared pool (no copy).")
      .def(
          "__array__",
          [](const std::shared_ptr<BlobHandleState>& h, const py::args&, const py::kwargs&) {
            return bytesArray(h, 0);
          },
          "np.asarray(handle): handle.numpy().")
      .def(
          "tobytes",
          [](const BlobHandleState& h) {
            const std::span<const uint8_t> b = h.bytes(0);
            return py::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          "A copy of the blob's bytes.")
      .def("release", &BlobHandleState::release, "Unpins the blob. Idempotent.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](BlobHandleState& h, py::handle excType, py::handle,
                          py::handle) { return exitRelease(h, excType); })
      .def("__repr__", [](const BlobHandleState& h) {
        return "<kvtier.BlobHandle " + std::to_string(h.size()) + " bytes" +
               (h.open() ? "" : ", released") + ">";
      });

  py::class_<WriteHandleState, std::shared_ptr<WriteHandleState>>(m, "WriteHandle", R"doc(
Blocks granted under a write lease (Space.begin_put), written in place before a commit.

block(i) is writable and zero-copy; slots of block(0) before `begin` hold the sequence's
existing bytes: do not write them. write() copies packed KV in instead. Nothing is visible to
anyone before commit().

A context manager: leaving the `with` block normally commits what is not committed yet; an
exception aborts (as does dropping the handle uncommitted). commit() and abort() refuse
(kvtier.BufferInUse, nothing changed) while an array of one of its blocks is alive. Afterwards
every method, and numpy() of any of its blocks, raises kvtier.Released.
)doc")
      .def_property_readonly("begin", &WriteHandleState::begin)
      .def_property_readonly("end", &WriteHandleState::end)
      .def_property_readonly("first_position", &WriteHandleState::firstPosition,
                             "Sequence position of block(0)'s first token slot.")
      .def_property_readonly("block_count", &WriteHandleState::blockCount)
      .def_property_readonly("closed", [](const WriteHandleState& h) { return !h.open(); })
      .def(
          "block",
          [](const std::shared_ptr<WriteHandleState>& h, py::ssize_t i) { return blockOf(h, i); },
          "index"_a, "Block `index` (writable, zero-copy).")
      .def(
          "blocks", [](const std::shared_ptr<WriteHandleState>& h) { return blocksOf(h); },
          "Every Block of the handle, in order.")
      .def("write", &writeKv, "start"_a, "stop"_a, "kv"_a,
           "Writes positions [start, stop) from packed kv (layout.packed_shape(stop - start)).")
      .def(
          "commit",
          [](WriteHandleState& h, std::optional<uint64_t> upTo) {
            return h.commit(upTo.value_or(kEndPosition));
          },
          "up_to"_a = py::none(), R"doc(
Makes [begin, up_to) visible (None: every granted position) and returns CommitInfo. A bad up_to
raises kvtier.InvalidArgument and leaves the handle open.
)doc")
      .def("abort", &WriteHandleState::abort, "Frees the granted blocks; nothing becomes visible.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](WriteHandleState& h, py::handle excType, py::handle,
                          py::handle) { return exitWrite(h, excType); })
      .def("__repr__", [](const WriteHandleState& h) {
        return "<kvtier.WriteHandle [" + std::to_string(h.begin()) + ", " +
               std::to_string(h.end()) + "), " + std::to_string(h.blockCount()) + " blocks" +
               (h.open() ? "" : ", closed") + ">";
      });
}

}  // namespace kvtier::python
