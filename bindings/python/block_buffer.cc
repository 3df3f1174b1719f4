#include "block_buffer.h"

namespace kvtier::python {

namespace {

int getBuffer(PyObject* self, Py_buffer* view, int flags) {
  view->obj = nullptr;
  try {
    auto& blockView = py::cast<BlockView&>(py::handle(self));
    HandleState& handle = blockView.handle();
    const std::span<uint8_t> bytes = handle.bytes(blockView.index());  // Released once ended
    if ((flags & PyBUF_WRITABLE) == PyBUF_WRITABLE && handle.readonly()) {
      PyErr_SetString(PyExc_BufferError,
                      "the blocks of a kvtier.ReadHandle and the bytes of a kvtier.BlobHandle "
                      "are read-only");
      return -1;
    }
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS) {
      PyErr_SetString(PyExc_BufferError, "a kvtier block is C-contiguous, not Fortran-contiguous");
      return -1;
    }
    view->buf = bytes.data();
    view->len = static_cast<Py_ssize_t>(bytes.size());
    view->readonly = handle.readonly() ? 1 : 0;
    view->suboffsets = nullptr;
    view->internal = nullptr;
    if (blockView.kind() == BlockView::Kind::kBlock && (flags & PyBUF_FORMAT) == PyBUF_FORMAT &&
        (flags & PyBUF_ND) == PyBUF_ND) {
      // The typed 5-D view (NumPy, memoryview).
      view->itemsize = dtypeBytes(handle.layout().dtype);
      view->format = const_cast<char*>(bufferFormat(handle.layout().dtype));
      view->ndim = 5;
      view->shape = blockView.shape();
      view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? blockView.strides() : nullptr;
    } else {
      // A blob, or a consumer that asks for no format or no shape: the bytes (as
      // PyBuffer_FillInfo).
      view->itemsize = 1;
      view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? const_cast<char*>("B") : nullptr;
      view->ndim = 1;
      view->shape = (flags & PyBUF_ND) == PyBUF_ND ? &view->len : nullptr;
      view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &view->itemsize : nullptr;
    }
    Py_INCREF(self);
    view->obj = self;
    return 0;
  } catch (...) {
    setPythonError();
    return -1;
  }
}

// The block as a NumPy array over a new BlockView.
py::object numpyOf(const Block& block) {
  (void)block.handle->bytes(block.index);  // Released, UsedAfterFork, NotSupported
  py::object view =
      py::cast(std::make_unique<BlockView>(block.handle, block.index, BlockView::Kind::kBlock));
  py::memoryview memory(view);  // raises what getBuffer raises
  return py::module_::import("numpy").attr("asarray")(memory);
}

uint64_t firstPosition(const HandleState& h) {
  return h.readonly() ? static_cast<const ReadHandleState&>(h).firstPosition()
                      : static_cast<const WriteHandleState&>(h).firstPosition();
}

}  // namespace

BlockView::BlockView(std::shared_ptr<HandleState> handle, size_t index, Kind kind)
    : handle_(std::move(handle)), index_(index), kind_(kind) {
  const Layout& l = handle_->layout();
  shape_ = {static_cast<Py_ssize_t>(l.numLayers), 2, static_cast<Py_ssize_t>(l.blockTokens),
            static_cast<Py_ssize_t>(l.numKvHeads), static_cast<Py_ssize_t>(l.headDim)};
  Py_ssize_t stride = static_cast<Py_ssize_t>(dtypeBytes(l.dtype));
  for (int d = 4; d >= 0; --d) {
    strides_[d] = stride;
    stride *= shape_[d];
  }
  handle_->viewMade();
}

BlockView::~BlockView() { handle_->viewDestroyed(); }

const char* bufferFormat(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "e";
    case DType::kBFloat16:
      return "H";
    case DType::kFloat32:
      return "f";
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return "B";
    case DType::kInt8:
      return "b";
  }
  return "B";
}

const char* numpyDtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "uint16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
      return "uint8";
    case DType::kInt8:
      return "int8";
  }
  return "uint8";
}

void defineBlock(py::module_& m) {
  auto view = py::class_<BlockView>(m, "BlockView", py::buffer_protocol(), R"doc(
The exporter behind the NumPy array of a kvtier.Block (internal: use Block.numpy()).
)doc");
  // pybind11's def_buffer has no hook for a finished export; this type needs none either (it
  // counts its own lifetime), but its getbuffer must refuse with kvtier's errors: ours.
  auto* type = reinterpret_cast<PyHeapTypeObject*>(view.ptr());
  type->as_buffer.bf_getbuffer = getBuffer;
  type->as_buffer.bf_releasebuffer = nullptr;

  py::class_<Block>(m, "Block", R"doc(
One KV block of a ReadHandle or WriteHandle.

``block.numpy()`` (or ``np.asarray(block)``) is a NumPy array viewing the block's bytes in the
daemon's shared pool, no copy: C-contiguous, shape ``(layers, 2, block_tokens, kv_heads,
head_dim)`` (axis 1: K, then V), dtype as the layout (bfloat16 as uint16 and fp8 as uint8 bit
patterns); read-only for a ReadHandle, writable for a WriteHandle. ``torch.from_numpy(a)`` and
``torch.frombuffer(a, ...)`` of that array share the same memory. Token slot s of the block holds
sequence position ``block.first_position + s``.

Valid only while its handle is open: numpy() of a block of a released, committed or aborted
handle raises kvtier.Released, and the handle refuses to end (kvtier.BufferInUse) while an array
of one of its blocks — or a tensor or memoryview made from one — is alive. A Block object itself
holds no memory and may outlive its handle.
)doc")
      .def_readonly("index", &Block::index, "Index of the block in its handle.")
      .def_property_readonly(
          "first_position",
          [](const Block& b) {
            return firstPosition(*b.handle) + b.index * b.handle->layout().blockTokens;
          },
          "Sequence position of the block's first token slot.")
      .def_property_readonly(
          "shape",
          [](const Block& b) {
            const Layout& l = b.handle->layout();
            return py::make_tuple(l.numLayers, 2, l.blockTokens, l.numKvHeads, l.headDim);
          },
          "(layers, 2, block_tokens, kv_heads, head_dim).")
      .def_property_readonly(
          "readonly", [](const Block& b) { return b.handle->readonly(); },
          "True for the blocks of a ReadHandle.")
      .def_property_readonly(
          "nbytes", [](const Block& b) { return b.handle->layout().blockBytes(); },
          "Bytes of the block.")
      .def("numpy", &numpyOf,
           "The block as a NumPy array viewing the shared pool (no copy). Raises "
           "kvtier.Released once the handle has ended.")
      .def(
          "__array__",
          [](const Block& b, const py::args&, const py::kwargs&) { return numpyOf(b); },
          "np.asarray(block): block.numpy().")
      .def("__repr__", [](const Block& b) {
        return "<kvtier.Block " + std::to_string(b.index) + " of a " +
               (b.handle->readonly() ? "read" : "write") + " handle" +
               (b.handle->open() ? "" : " (ended)") + ">";
      });
}

py::object makeBlock(std::shared_ptr<HandleState> handle, size_t index) {
  return py::cast(Block{std::move(handle), index});
}

py::object bytesArray(std::shared_ptr<HandleState> handle, size_t index) {
  (void)handle->bytes(index);  // Released, UsedAfterFork
  py::object view =
      py::cast(std::make_unique<BlockView>(std::move(handle), index, BlockView::Kind::kBytes));
  py::memoryview memory(view);
  return py::module_::import("numpy").attr("asarray")(memory);
}

}  // namespace kvtier::python
