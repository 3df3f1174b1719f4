// kvtier.Block and the views that give its bytes to NumPy and PyTorch without a copy.
//
// block.numpy() (and np.asarray(block)) makes a BlockView — a small object that exports the
// block's bytes, in place in the daemon's shared pool, through the buffer protocol: C-contiguous,
// shape [layers, 2 (K, V), block_tokens, kv_heads, head_dim], the layout's dtype (bfloat16 and
// fp8 as their raw unsigned integers) — and returns the NumPy array over it. The array holds the
// view through its memoryview; a tensor from torch.from_numpy or torch.frombuffer of the array
// holds the array. Each BlockView counts on its handle from its creation to its destruction, so
// the handle refuses to end while anything in the process can still reach the bytes
// (handle_states.h).
//
// A Block itself is not a buffer: were it one, a consumer that lets go of its buffer at once but
// keeps a reference to the Block (torch.frombuffer does) would keep a pointer the count cannot
// see. A Block only names a block; making a view of it once its handle has ended raises
// kvtier.Released.
//
// A blob handle (kvtier.BlobHandle) is not a buffer either, for the same reason: its numpy() is
// an array over a BlockView of its bytes, 1-D unsigned char, counted the same way. Neither hands
// out a memoryview: memoryview.release() (or a `with` block on one) lets go of the export while
// np.frombuffer or torch.frombuffer of that memoryview still point at the bytes holding only the
// memoryview object; an array cannot be released while it is alive.
#pragma once

#include <array>
#include <memory>

#include <pybind11/pybind11.h>

#include "handle_states.h"

namespace kvtier::python {

// A block of a handle, by index (kvtier.Block).
struct Block {
  std::shared_ptr<HandleState> handle;
  size_t index = 0;
};

// The exporter of one block's bytes (kvtier._kvtier.BlockView), counted on its handle while it
// exists. Not copyable: one object, one count.
class BlockView {
 public:
  enum class Kind {
    kBlock,  // a KV block: typed, shape [layers, 2, block_tokens, kv_heads, head_dim]
    kBytes,  // a blob: 1-D unsigned char
  };
  BlockView(std::shared_ptr<HandleState> handle, size_t index, Kind kind);  // GIL held
  ~BlockView();                                                             // GIL held
  BlockView(const BlockView&) = delete;
  BlockView& operator=(const BlockView&) = delete;

  HandleState& handle() const { return *handle_; }
  size_t index() const { return index_; }
  Kind kind() const { return kind_; }
  // The Py_buffer's shape and strides point here; an export holds a reference to the view.
  Py_ssize_t* shape() { return shape_.data(); }
  Py_ssize_t* strides() { return strides_.data(); }

 private:
  std::shared_ptr<HandleState> handle_;
  size_t index_;
  Kind kind_;
  std::array<Py_ssize_t, 5> shape_{}, strides_{};
};

// Defines kvtier.Block and BlockView in `m`.
void defineBlock(py::module_& m);
// Block `index` of `handle` (GIL held; the handle open, the index checked).
py::object makeBlock(std::shared_ptr<HandleState> handle, size_t index);
// The bytes of block `index` of `handle` as a read-only 1-D uint8 NumPy array over a new kBytes
// BlockView (GIL held; Released once the handle has ended).
py::object bytesArray(std::shared_ptr<HandleState> handle, size_t index);

// The buffer-protocol format character of a layout's dtype (bfloat16 and fp8 as unsigned
// integers), and the NumPy dtype name with the same meaning.
const char* bufferFormat(DType dtype);
const char* numpyDtypeName(DType dtype);

}  // namespace kvtier::python
