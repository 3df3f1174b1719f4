// Arguments from Python, checked and converted before anything reaches the daemon: token ids and
// other integers, packed KV arrays, bytes-like objects and keys, dtypes, RoPE schemes and
// layouts, put and lookup options.
//
// Every check raises (TypeError for a wrong kind of object, kvtier.InvalidArgument for a wrong
// value, shape or dtype) with a message that names the argument; nothing is sent before it
// passes. All of these run with the GIL held.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <pybind11/pybind11.h>

#include "kvtier/client.h"

namespace kvtier::python {

namespace py = pybind11;

// The name of obj's type, for error messages.
std::string typeName(py::handle obj);

// "<f" -> 'f'; 0 for a byte order that is not this machine's (kvtier is little-endian only).
char formatChar(const char* format);

// A Py_buffer released (with the GIL held) when it goes out of scope.
class BufferExport {
 public:
  explicit BufferExport(py::handle obj);
  ~BufferExport() { PyBuffer_Release(&view_); }
  BufferExport(const BufferExport&) = delete;
  BufferExport& operator=(const BufferExport&) = delete;
  const Py_buffer& view() const { return view_; }

 private:
  Py_buffer view_;
};

// Integers 0 <= v <= max(T) from a sequence of ints or a 1-D integer array (NumPy, array.array,
// ...): token ids, block table entries. Errors name the argument (`name`), an entry (`item`) and
// the rule for values (`bounds`). Defined for uint32_t and int32_t.
template <typename T>
std::vector<T> integersFrom(py::handle obj, const std::string& name, const char* item,
                            const char* bounds);
extern template std::vector<uint32_t> integersFrom<uint32_t>(py::handle, const std::string&,
                                                             const char*, const char*);
extern template std::vector<int32_t> integersFrom<int32_t>(py::handle, const std::string&,
                                                           const char*, const char*);

// Token ids (`name`: the argument, in errors).
std::vector<uint32_t> tokensFrom(py::handle obj, const std::string& name = "tokens");

// "(2, 3,)"-style text of a shape, for error messages.
std::string shapeString(const Py_ssize_t* shape, int ndim);

// A Python buffer of packed KV for `tokens` tokens of `layout`: C-contiguous, the layout's
// dtype, shape (layers, 2, tokens, kv_heads, head_dim) — what Space.put, WriteHandle.write and
// ReadHandle.copy_to move. Exported while this lives; `name` names the argument in errors.
class PackedKv {
 public:
  PackedKv(py::handle obj, const Layout& layout, uint64_t tokens, bool writable, const char* name);
  void* data() const { return export_.view().buf; }
  size_t bytes() const { return static_cast<size_t>(export_.view().len); }

 private:
  static py::handle checked(py::handle obj, const char* name);
  BufferExport export_;
};

// The bytes of a bytes-like object (bytes, bytearray, memoryview, a NumPy array), exported while
// this lives. TypeError for text or an object without the buffer protocol, INVALID_ARGUMENT when
// the bytes are not C-contiguous or, for a `writable` one (an `out` argument), read-only; `name`
// names the argument in all of them.
class BytesLike {
 public:
  BytesLike(py::handle obj, const char* name, bool writable = false);
  const void* data() const { return export_.view().buf; }
  // The bytes of a writable one.
  void* writableData() const { return export_.view().buf; }
  size_t size() const { return static_cast<size_t>(export_.view().len); }

 private:
  static py::handle checked(py::handle obj, const char* name);
  BufferExport export_;
};

// A layout's dtype from a name ('float16', 'bf16', ...), a NumPy dtype or a torch dtype.
DType dtypeFrom(py::handle obj);
// The canonical name of a dtype ('float16', 'bfloat16', ...).
const char* dtypeName(DType dtype);
const char* ropeStyleName(RopeStyle style);

// kvtier.Rope(style, rotary_dims, base).
RopeScheme makeRope(const std::string& style, uint32_t rotaryDims, double base);
// kvtier.Layout(...), validated (INVALID_ARGUMENT naming the first bound a field breaks).
Layout makeLayout(std::string modelId, uint32_t numLayers, uint32_t numKvHeads, uint32_t headDim,
                  py::handle dtype, uint32_t blockTokens, std::optional<RopeScheme> rope,
                  uint64_t stateBytes);
// Layout.packed_shape(tokens): (layers, 2, tokens, kv_heads, head_dim).
py::tuple packedShape(const Layout& l, uint64_t tokens);

PutOptions putOptions(bool detached, uint64_t window, uint64_t chunk);
// The `remote` argument of a lookup: 'fetch', 'local' or 'prefetch'.
RemoteMode remoteMode(const std::string& remote);

// A 16-byte key (bytes, bytearray or any 16-byte C-contiguous buffer).
Key128 keyFrom(py::handle obj);
// Keys: a sequence of 16-byte keys (one per block).
std::vector<Key128> keysFrom(py::handle obj);
// A key as a bytes object.
py::bytes keyBytes(const Key128& key);

}  // namespace kvtier::python
