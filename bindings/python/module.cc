// kvtier._kvtier: the Python binding of the client SDK (kvtier/client.h). The package `kvtier`
// (kvtier/__init__.py) re-exports it with the exception classes of kvtier/errors.py.
//
// Every argument from Python is checked here before anything reaches the daemon (types, shapes,
// dtypes, token values), so bad input raises and changes nothing. Who owns what, and the rules
// for lifetimes, views, fork and threads: handle_states.h and block_buffer.h.
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "block_buffer.h"
#include "handle_states.h"
#include "python_errors.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

// --- Arguments from Python ----------------------------------------------------------------

std::string typeName(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

// "<f" -> 'f'; 0 for a byte order that is not this machine's (kvtier is little-endian only).
char formatChar(const char* format) {
  if (!format) return 'B';
  std::string_view f(format);
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.remove_prefix(1);
  if (f.size() != 1) return 0;
  return f[0];
}

// A Py_buffer released (with the GIL held) when it goes out of scope.
class BufferExport {
 public:
  explicit BufferExport(py::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
  }
  ~BufferExport() { PyBuffer_Release(&view_); }
  BufferExport(const BufferExport&) = delete;
  BufferExport& operator=(const BufferExport&) = delete;
  const Py_buffer& view() const { return view_; }

 private:
  Py_buffer view_;
};

// Integers 0 <= v <= max(T) from a sequence of ints or a 1-D integer array (NumPy, array.array,
// ...): token ids, block table entries. Errors name the argument (`name`), an entry (`item`) and
// the rule for values (`bounds`).
template <typename T>
std::vector<T> integersFrom(py::handle obj, const std::string& name, const char* item,
                            const char* bounds) {
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr())) {
    throw py::type_error(name + " must be a sequence of ints or a 1-D integer array, not " +
                         typeName(obj));
  }
  constexpr auto kMax = static_cast<long long>(std::numeric_limits<T>::max());
  std::vector<T> values;
  const auto add = [&](long long value, bool overflow) {
    if (overflow || value < 0 || value > kMax) {
      throwError(ErrorCode::kInvalidArgument, item, " ", values.size(),
                 overflow ? " is out of range" : (" is " + std::to_string(value)), ": ", bounds);
    }
    values.push_back(static_cast<T>(value));
  };
  if (PyObject_CheckBuffer(obj.ptr())) {
    BufferExport buffer(obj);
    const Py_buffer& v = buffer.view();
    if (v.ndim != 1) {
      throwError(ErrorCode::kInvalidArgument, name, " must be 1-D, got ", v.ndim, " dimensions");
    }
    const char f = formatChar(v.format);
    const bool isSigned = f == 'b' || f == 'h' || f == 'i' || f == 'l' || f == 'q' || f == 'n';
    const bool isUnsigned = f == 'B' || f == 'H' || f == 'I' || f == 'L' || f == 'Q' || f == 'N';
    if (!(isSigned || isUnsigned) || v.itemsize > 8) {
      throw py::type_error(name + " must be integers, got an array of format '" +
                           (v.format ? v.format : "B") + "'");
    }
    const auto* base = static_cast<const uint8_t*>(v.buf);
    const Py_ssize_t stride = v.strides ? v.strides[0] : v.itemsize;
    values.reserve(static_cast<size_t>(v.shape[0]));
    for (Py_ssize_t i = 0; i < v.shape[0]; ++i) {
      uint64_t raw = 0;
      std::memcpy(&raw, base + i * stride, static_cast<size_t>(v.itemsize));
      if (isSigned) {
        const int shift = 64 - 8 * static_cast<int>(v.itemsize);  // sign-extend
        add(static_cast<long long>(raw << shift) >> shift, false);
      } else {
        add(static_cast<long long>(raw), raw > static_cast<uint64_t>(kMax));
      }
    }
    return values;
  }
  if (!PySequence_Check(obj.ptr()) && !PyIter_Check(obj.ptr())) {
    throw py::type_error(name + " must be a sequence of ints or a 1-D integer array, not " +
                         typeName(obj));
  }
  for (py::handle entry : py::iter(obj)) {
    if (!PyIndex_Check(entry.ptr())) {
      throw py::type_error(std::string(item) + " " + std::to_string(values.size()) + " is a " +
                           typeName(entry) + ", expected an int");
    }
    py::object index = py::reinterpret_steal<py::object>(PyNumber_Index(entry.ptr()));
    if (!index) throw py::error_already_set();
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
    if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
    add(value, overflow != 0);
  }
  return values;
}

// Token ids (`name`: the argument, in errors).
std::vector<uint32_t> tokensFrom(py::handle obj, const std::string& name = "tokens") {
  return integersFrom<uint32_t>(obj, name, "token", "token ids are 0 <= t < 2**32");
}

std::string shapeString(const Py_ssize_t* shape, int ndim) {
  std::string s = "(";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + (ndim == 1 ? ",)" : ")");
}

// A Python buffer of packed KV for `tokens` tokens of `layout`: C-contiguous, the layout's
// dtype, shape (layers, 2, tokens, kv_heads, head_dim) — what Space.put, WriteHandle.write and
// ReadHandle.copy_to move.
class PackedKv {
 public:
  PackedKv(py::handle obj, const Layout& layout, uint64_t tokens, bool writable, const char* name)
      : export_(checked(obj, name)) {
    const Py_buffer& v = export_.view();
    const std::string what = name;
    if (writable && v.readonly) throwError(ErrorCode::kInvalidArgument, what, " is read-only");
    const char* expectedFormat = bufferFormat(layout.dtype);
    if (formatChar(v.format) != expectedFormat[0] ||
        v.itemsize != static_cast<Py_ssize_t>(dtypeBytes(layout.dtype))) {
      std::string got = std::string("format '") + (v.format ? v.format : "B") + "'";
      if (py::hasattr(obj, "dtype")) got = py::str(obj.attr("dtype"));
      throwError(ErrorCode::kInvalidArgument, what, " has dtype ", got, ", expected ",
                 numpyDtypeName(layout.dtype), " (the layout's dtype)");
    }
    const Py_ssize_t expected[5] = {
        static_cast<Py_ssize_t>(layout.numLayers), 2, static_cast<Py_ssize_t>(tokens),
        static_cast<Py_ssize_t>(layout.numKvHeads), static_cast<Py_ssize_t>(layout.headDim)};
    if (v.ndim != 5 || !std::equal(expected, expected + 5, v.shape)) {
      throwError(ErrorCode::kInvalidArgument, what, " has shape ",
                 v.shape ? shapeString(v.shape, v.ndim) : "(unknown)", ", expected ",
                 shapeString(expected, 5), " = (layers, 2, tokens, kv_heads, head_dim)");
    }
    if (!PyBuffer_IsContiguous(&v, 'C')) {
      throwError(ErrorCode::kInvalidArgument, what,
                 " must be C-contiguous (np.ascontiguousarray makes a contiguous copy)");
    }
  }
  void* data() const { return export_.view().buf; }
  size_t bytes() const { return static_cast<size_t>(export_.view().len); }

 private:
  static py::handle checked(py::handle obj, const char* name) {
    if (!PyObject_CheckBuffer(obj.ptr())) {
      throw py::type_error(std::string(name) +
                           " must be a NumPy array (or another object with the buffer protocol), "
                           "not " +
                           typeName(obj) + "; for a torch.Tensor pass tensor.numpy()");
    }
    return obj;
  }
  BufferExport export_;
};

DType dtypeFrom(py::handle obj) {
  std::string name;
  if (py::isinstance<py::str>(obj)) {
    name = obj.cast<std::string>();
  } else {
    name = py::str(obj);
    if (name.rfind("torch.", 0) == 0) {
      name = name.substr(6);  // torch.float32 -> float32
    } else {
      try {
        name = py::str(py::module_::import("numpy").attr("dtype")(obj).attr("name"));
      } catch (py::error_already_set&) {
        throw py::type_error(
            "dtype must be a name such as 'float16', a NumPy dtype or a torch "
            "dtype, not " +
            typeName(obj));
      }
    }
  }
  if (name == "float16" || name == "fp16" || name == "f16" || name == "half")
    return DType::kFloat16;
  if (name == "bfloat16" || name == "bf16") return DType::kBFloat16;
  if (name == "float32" || name == "fp32" || name == "f32" || name == "float")
    return DType::kFloat32;
  if (name == "float8_e4m3" || name == "float8_e4m3fn" || name == "fp8_e4m3")
    return DType::kFloat8E4M3;
  if (name == "float8_e5m2" || name == "fp8_e5m2") return DType::kFloat8E5M2;
  if (name == "int8") return DType::kInt8;
  throwError(ErrorCode::kInvalidArgument, "dtype '", name,
             "' is not one of float16, bfloat16, float32, float8_e4m3, float8_e5m2, int8");
}

const char* dtypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat8E4M3:
      return "float8_e4m3";
    case DType::kFloat8E5M2:
      return "float8_e5m2";
    case DType::kInt8:
      return "int8";
  }
  return "unknown";
}

const char* ropeStyleName(RopeStyle style) {
  switch (style) {
    case RopeStyle::kNone:
      return "none";
    case RopeStyle::kNeox:
      return "neox";
    case RopeStyle::kGptj:
      return "gptj";
  }
  return "unknown";
}

RopeScheme makeRope(const std::string& style, uint32_t rotaryDims, double base) {
  RopeScheme rope{RopeStyle::kNone, rotaryDims, base};
  if (style == "neox") {
    rope.style = RopeStyle::kNeox;
  } else if (style == "gptj") {
    rope.style = RopeStyle::kGptj;
  } else if (style != "none") {
    throwError(ErrorCode::kInvalidArgument, "RoPE style '", style,
               "' is not one of 'neox', 'gptj', 'none'");
  }
  return rope;
}

Layout makeLayout(std::string modelId, uint32_t numLayers, uint32_t numKvHeads, uint32_t headDim,
                  py::handle dtype, uint32_t blockTokens, std::optional<RopeScheme> rope) {
  Layout layout{
      std::move(modelId),         numLayers, numKvHeads, headDim, dtypeFrom(dtype), blockTokens,
      rope.value_or(RopeScheme{})};
  unwrap(layout.validate());
  return layout;
}

py::tuple packedShape(const Layout& l, uint64_t tokens) {
  return py::make_tuple(l.numLayers, 2, tokens, l.numKvHeads, l.headDim);
}

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

PutOptions putOptions(bool detached, uint64_t window, uint64_t chunk) {
  PutOptions options;
  options.detached = detached;
  options.window = window;
  options.chunk = chunk;
  return options;
}

RemoteMode remoteMode(const std::string& remote) {
  if (remote == "fetch") return RemoteMode::kFetch;
  if (remote == "local") return RemoteMode::kLocal;
  if (remote == "prefetch") return RemoteMode::kPrefetch;
  throwError(ErrorCode::kInvalidArgument, "remote '", remote,
             "' is not one of 'fetch', 'local', 'prefetch'");
}

// --- Calls ------------------------------------------------------------------------------------

std::shared_ptr<SpaceState> openSpace(const std::shared_ptr<ClientState>& client,
                                      const Layout& layout, std::optional<int> device) {
  client->checkUsable();
  if (device && *device < 0) {
    throwError(ErrorCode::kInvalidArgument, "device ", *device,
               " is not a CUDA device (None: the host pool)");
  }
  OpenOptions options;
  options.device = device.value_or(-1);
  auto space = std::make_shared<SpaceState>(client, layout);
  client->call([&] {
    space->adopt(unwrap(client->client().open(layout, options)));
    client->track(space);
  });
  return space;
}

// The bytes of a bytes-like object (bytes, bytearray, memoryview, a NumPy array), exported while
// this lives. TypeError for text or an object without the buffer protocol, INVALID_ARGUMENT when
// the bytes are not C-contiguous; `name` names the argument in both.
class BytesLike {
 public:
  BytesLike(py::handle obj, const char* name) : export_(checked(obj, name)) {
    if (!PyBuffer_IsContiguous(&export_.view(), 'C')) {
      throwError(ErrorCode::kInvalidArgument, name, " must be C-contiguous");
    }
  }
  const void* data() const { return export_.view().buf; }
  size_t size() const { return static_cast<size_t>(export_.view().len); }

 private:
  static py::handle checked(py::handle obj, const char* name) {
    if (!PyObject_CheckBuffer(obj.ptr()) || PyUnicode_Check(obj.ptr())) {
      throw py::type_error(std::string(name) + " must be a bytes-like object, not " +
                           typeName(obj));
    }
    return obj;
  }
  BufferExport export_;
};

// A 16-byte key (bytes, bytearray or any 16-byte C-contiguous buffer).
Key128 keyFrom(py::handle obj) {
  BytesLike bytes(obj, "a key");
  if (bytes.size() != 16) {
    throwError(ErrorCode::kInvalidArgument, "a key is 16 bytes, got ", bytes.size());
  }
  Key128 key;
  std::memcpy(key.bytes.data(), bytes.data(), 16);
  return key;
}

// Keys: a sequence of 16-byte keys (one per block).
std::vector<Key128> keysFrom(py::handle obj) {
  if (PyUnicode_Check(obj.ptr()) || PyBytes_Check(obj.ptr()) || PyByteArray_Check(obj.ptr())) {
    throw py::type_error("keys must be a sequence of 16-byte keys, not " + typeName(obj));
  }
  std::vector<Key128> keys;
  for (py::handle item : py::iter(obj)) keys.push_back(keyFrom(item));
  return keys;
}

py::bytes keyBytes(const Key128& key) {
  return py::bytes(reinterpret_cast<const char*>(key.bytes.data()), key.bytes.size());
}

// A handle of `s` (ReadHandleState, WriteHandleState or BlobHandleState) over the C++ handle that
// f(space) returns, waited for with the GIL released.
template <typename State, typename F>
std::shared_ptr<State> adoptHandle(SpaceState& s, F&& f) {
  auto handle = std::make_shared<State>(s.shared_from_this());
  s.call([&](Space& space) {
    handle->adopt(unwrap(f(space)));
    s.client().track(handle);
  });
  return handle;
}

std::shared_ptr<WriteHandleState> beginPut(SpaceState& s, const std::string& seq, uint64_t begin,
                                           py::handle tokens, const PutOptions& options) {
  s.client().checkUsable();
  const std::vector<uint32_t> ids = tokensFrom(tokens);
  return adoptHandle<WriteHandleState>(
      s, [&](Space& space) { return space.beginPut(seq, begin, ids, options); });
}

CommitInfo put(SpaceState& s, const std::string& seq, uint64_t begin, py::handle tokens,
               py::handle kv, const PutOptions& options) {
  s.client().checkUsable();
  const std::vector<uint32_t> ids = tokensFrom(tokens);
  PackedKv buffer(kv, s.layout(), ids.size(), false, "kv");
  return unwrap(s.call([&](Space& space) {
    return space.put(seq, begin, ids, buffer.data(), buffer.bytes(), options);
  }));
}

// kvtier.PutItem: the arguments of one put of Space.put_many, kept as given; put_many checks them
// all before anything is sent.
struct PutItemArgs {
  std::string seq;
  uint64_t begin = 0;
  py::object tokens, kv;
  bool detached = false;
  uint64_t window = 0, chunk = 0;
  py::object keys;  // None: kvtier's keys of the tokens
};

// Space.put_many: every item is checked first (TypeError or InvalidArgument, and nothing sent),
// then one Space::putMany; each result is the item's CommitInfo or its kvtier.Error, not raised.
py::list putMany(SpaceState& s, py::handle items) {
  s.client().checkUsable();
  std::vector<PutItemArgs> args;
  for (py::handle item : py::iter(items)) {
    if (py::isinstance<PutItemArgs>(item)) {
      args.push_back(item.cast<PutItemArgs>());
    } else if (py::isinstance<py::tuple>(item) && py::len(item) == 4) {
      args.push_back(py::type::of<PutItemArgs>()(*item).cast<PutItemArgs>());
    } else {
      throw py::type_error("items[" + std::to_string(args.size()) +
                           "] must be a kvtier.PutItem or a tuple (seq, begin, tokens, kv), not " +
                           typeName(item));
    }
  }
  std::vector<std::vector<uint32_t>> tokens;
  std::deque<PackedKv> kvs;  // the exports stay where they are while the batch points at them
  std::vector<PutItem> batch;
  tokens.reserve(args.size());
  batch.reserve(args.size());
  for (const PutItemArgs& a : args) {
    const std::string name = "items[" + std::to_string(batch.size()) + "]";
    const std::vector<uint32_t>& ids = tokens.emplace_back(tokensFrom(a.tokens, name + ".tokens"));
    const PackedKv& kv =
        kvs.emplace_back(a.kv, s.layout(), ids.size(), false, (name + ".kv").c_str());
    PutOptions options = putOptions(a.detached, a.window, a.chunk);
    if (!a.keys.is_none()) options.keys = keysFrom(a.keys);
    batch.push_back(PutItem{a.seq, a.begin, ids, kv.data(), kv.bytes(), std::move(options)});
  }
  const std::vector<Result<CommitInfo>> results =
      s.call([&](Space& space) { return space.putMany(batch); });
  py::list out;
  for (const Result<CommitInfo>& r : results) {
    out.append(r ? py::cast(r.value()) : exceptionOf(r.error()));
  }
  return out;
}

// kvtier.PagedKvCache: an engine's paged KV cache in vLLM's layout, as torch tensors: for each
// layer a K and a V tensor of shape [num_blocks, block_tokens, kv_heads, head_dim], contiguous.
// Held in tuples, which nothing can change while a call copies with the GIL released; each call
// checks the tensors again and reads their data_ptr() then.
struct PagedCacheArgs {
  py::tuple keys, values;
  uint32_t blockTokens = 0;
};

// The shape [num_blocks, block_tokens, kv_heads, head_dim] the tensors of a paged cache share:
// TypeError for what is not a list of torch tensors, InvalidArgument for tensors that do not make
// one cache.
std::vector<int64_t> pagedShape(const py::tuple& keys, const py::tuple& values) {
  if (keys.empty() || keys.size() != values.size()) {
    throwError(ErrorCode::kInvalidArgument,
               "a paged cache has one K and one V tensor per layer, got ", keys.size(), " K and ",
               values.size(), " V tensors");
  }
  const py::object tensorType = py::module_::import("torch").attr("Tensor");
  const py::handle first = keys[0];
  std::vector<int64_t> shape;
  for (const auto& [name, list] : {std::pair{"keys", &keys}, std::pair{"values", &values}}) {
    for (size_t i = 0; i < list->size(); ++i) {
      const py::handle t = (*list)[i];
      const std::string what = std::string(name) + "[" + std::to_string(i) + "]";
      if (!py::isinstance(t, tensorType)) {
        throw py::type_error(what + " must be a torch.Tensor, not " + typeName(t));
      }
      const auto dims = py::cast<std::vector<int64_t>>(t.attr("shape"));
      if (shape.empty()) shape = dims;
      if (dims.size() != 4 || dims != shape) {
        throwError(ErrorCode::kInvalidArgument, what, " has shape ",
                   std::string(py::str(t.attr("shape"))), ", expected 4 dimensions [num_blocks, ",
                   "block_tokens, kv_heads, head_dim], the same for every tensor");
      }
      if (!t.attr("dtype").equal(first.attr("dtype")) ||
          !t.attr("device").equal(first.attr("device"))) {
        throwError(ErrorCode::kInvalidArgument, what,
                   " differs from keys[0] in dtype or device: every tensor of a paged cache has "
                   "the same");
      }
      if (!t.attr("is_contiguous")().cast<bool>()) {
        throwError(ErrorCode::kInvalidArgument, what, " must be contiguous");
      }
    }
  }
  if (shape[1] <= 0 || shape[1] > std::numeric_limits<int32_t>::max()) {
    throwError(ErrorCode::kInvalidArgument, "a paged cache's block size is ", shape[1]);
  }
  return shape;
}

PagedCacheArgs makePagedCache(py::handle keys, py::handle values) {
  for (const py::handle list : {keys, values}) {
    if (!PySequence_Check(list.ptr()) || PyUnicode_Check(list.ptr())) {
      throw py::type_error("keys and values must be sequences of torch tensors, not " +
                           typeName(list));
    }
  }
  PagedCacheArgs cache{py::tuple(py::reinterpret_borrow<py::object>(keys)),
                       py::tuple(py::reinterpret_borrow<py::object>(values))};
  cache.blockTokens = static_cast<uint32_t>(pagedShape(cache.keys, cache.values)[1]);
  return cache;
}

// The C++ PagedKvCache of `cache` for space `s`: InvalidArgument unless its tensors fit the
// layout (one K and one V per layer, [*, *, kv_heads, head_dim], the layout's dtype) and, for a
// space on a GPU, are on its device. The pointers are the tensors' data_ptr() now.
PagedKvCache pagedCacheFor(const PagedCacheArgs& cache, const SpaceState& s) {
  const Layout& l = s.layout();
  const std::vector<int64_t> shape = pagedShape(cache.keys, cache.values);
  if (cache.keys.size() != l.numLayers) {
    throwError(ErrorCode::kInvalidArgument, "the paged cache has ", cache.keys.size(),
               " layers; the layout has ", l.numLayers);
  }
  if (shape[2] != l.numKvHeads || shape[3] != l.headDim) {
    throwError(ErrorCode::kInvalidArgument, "the paged cache's tensors have ", shape[2],
               " KV heads of ", shape[3], "; the layout has ", l.numKvHeads, " of ", l.headDim);
  }
  const py::handle first = cache.keys[0];
  bool sameDtype = false;
  try {
    sameDtype = dtypeFrom(first.attr("dtype")) == l.dtype;
  } catch (const SdkError&) {
    // a dtype no layout has
  }
  if (!sameDtype) {
    throwError(ErrorCode::kInvalidArgument, "the paged cache has dtype ",
               std::string(py::str(first.attr("dtype"))), ", the layout ", dtypeName(l.dtype));
  }
  const py::object device = first.attr("device");
  if (s.device() >= 0) {
    if (device.attr("type").cast<std::string>() != "cuda" || device.attr("index").is_none() ||
        device.attr("index").cast<int>() != s.device()) {
      throwError(ErrorCode::kInvalidArgument, "the paged cache is on ",
                 std::string(py::str(device)), "; the space's pool is on cuda:", s.device());
    }
  } else if (device.attr("type").cast<std::string>() != "cpu") {
    throwError(ErrorCode::kInvalidArgument, "the paged cache is on ", std::string(py::str(device)),
               "; the space is on the host pool (CPU tensors)");
  }
  PagedKvCache out;
  out.blockTokens = static_cast<uint32_t>(shape[1]);
  for (const auto& [list, pointers] :
       {std::pair{&cache.keys, &out.keys}, std::pair{&cache.values, &out.values}}) {
    for (const py::handle t : *list) {
      pointers->push_back(reinterpret_cast<void*>(t.attr("data_ptr")().cast<uintptr_t>()));
    }
  }
  return out;
}

// Engine block numbers, one per block_tokens positions of the paged cache.
// The block table of a copy of `cache`: engine block numbers, each one the cache has (a kernel
// would read or write past the tensors otherwise).
std::vector<int32_t> blockTableFrom(py::handle obj, const PagedCacheArgs& cache) {
  std::vector<int32_t> table = integersFrom<int32_t>(obj, "block_table", "block table entry",
                                                     "engine block numbers are 0 <= b < 2**31");
  const int64_t blocks = pagedShape(cache.keys, cache.values)[0];
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i] >= blocks) {
      throwError(ErrorCode::kInvalidArgument, "block_table[", i, "] is ", table[i],
                 "; the paged cache has ", blocks, " blocks");
    }
  }
  return table;
}

// A CUDA stream: None (the default stream), a torch.cuda.Stream (anything with a `cuda_stream`
// handle), or the cudaStream_t handle as an int.
void* streamFrom(py::handle stream) {
  if (stream.is_none()) return nullptr;
  const py::object handle = py::hasattr(stream, "cuda_stream")
                                ? stream.attr("cuda_stream")
                                : py::reinterpret_borrow<py::object>(stream);
  if (!PyLong_Check(handle.ptr())) {
    throw py::type_error(
        "stream must be None, a torch.cuda.Stream or a cudaStream_t handle as an int, not " +
        typeName(stream));
  }
  const unsigned long long value = PyLong_AsUnsignedLongLong(handle.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  return reinterpret_cast<void*>(static_cast<uintptr_t>(value));
}

// The checks of Space.scatter_to and gather_to: a handle of this space.
void checkHandleOf(const SpaceState& s, HandleState& h) {
  h.checkOpen();
  if (&h.space() != &s) {
    throwError(ErrorCode::kInvalidArgument, "the handle belongs to another kvtier.Space");
  }
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
  h.copyTo(from, to, buffer.data(), buffer.bytes());
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

std::string commitRepr(const CommitInfo& c) {
  return "CommitInfo(length=" + std::to_string(c.length) +
         ", sealed_blocks=" + std::to_string(c.sealedBlocks) + ")";
}

}  // namespace
}  // namespace kvtier::python

using namespace kvtier;
using namespace kvtier::python;

PYBIND11_MODULE(_kvtier, m) {
  m.doc() = "The C++ half of the kvtier package: use `import kvtier`.";
  m.attr("__version__") = KVTIER_VERSION;
  registerErrorTranslator();

  py::class_<RopeScheme>(m, "Rope", R"doc(
How the model applies rotary position embeddings to K (optional part of a Layout).

style: 'neox' (pairs (d, d + rotary_dims/2): Llama (HF), Qwen, Mistral), 'gptj' (pairs (2d, 2d+1))
or 'none'; rotary_dims: the first rotary_dims dims of each head rotate; base: theta base.
)doc")
      .def(py::init(&makeRope), "style"_a, "rotary_dims"_a, "base"_a = 10000.0)
      .def_property_readonly("style", [](const RopeScheme& r) { return ropeStyleName(r.style); })
      .def_readonly("rotary_dims", &RopeScheme::rotaryDims)
      .def_readonly("base", &RopeScheme::base)
      .def(py::self == py::self)
      .def("__repr__", [](const RopeScheme& r) {
        return std::string("kvtier.Rope('") + ropeStyleName(r.style) + "', " +
               std::to_string(r.rotaryDims) + ", " + std::to_string(r.base) + ")";
      });

  py::class_<Layout>(m, "Layout", R"doc(
What one KV block holds: model, layers, KV heads, head dim, dtype, tokens per block, RoPE.

Layout(model_id, num_layers, num_kv_heads, head_dim, dtype='float16', block_tokens=16, rope=None)

dtype: 'float16', 'bfloat16', 'float32', 'float8_e4m3', 'float8_e5m2', 'int8', or the NumPy or
torch dtype. Raises kvtier.InvalidArgument when a field is out of bounds (block_tokens 16..512).
Blocks are shared only between clients that open the same layout.

KV travels "packed": an array of shape packed_shape(n) = (layers, 2, n, kv_heads, head_dim) for n
tokens (axis 1: K, then V), dtype numpy_dtype (bfloat16 as uint16, fp8 as uint8 bit patterns).
)doc")
      .def(py::init(&makeLayout), "model_id"_a, "num_layers"_a, "num_kv_heads"_a, "head_dim"_a,
           "dtype"_a = "float16", "block_tokens"_a = 16, "rope"_a = py::none())
      .def_readonly("model_id", &Layout::modelId)
      .def_readonly("num_layers", &Layout::numLayers)
      .def_readonly("num_kv_heads", &Layout::numKvHeads)
      .def_readonly("head_dim", &Layout::headDim)
      .def_readonly("block_tokens", &Layout::blockTokens)
      .def_property_readonly("dtype", [](const Layout& l) { return dtypeName(l.dtype); })
      .def_property_readonly("rope",
                             [](const Layout& l) -> py::object {
                               if (l.rope.style == RopeStyle::kNone) return py::none();
                               return py::cast(l.rope);
                             })
      .def_property_readonly(
          "numpy_dtype",
          [](const Layout& l) {
            return py::module_::import("numpy").attr("dtype")(numpyDtypeName(l.dtype));
          },
          "The NumPy dtype of its arrays.")
      .def_property_readonly("token_bytes", &Layout::tokenBytes,
                             "Bytes of one token's K (or V) for one layer.")
      .def_property_readonly("token_kv_bytes", &Layout::tokenKvBytes,
                             "Bytes of one token's K and V over all layers.")
      .def_property_readonly("block_bytes", &Layout::blockBytes)
      .def_property_readonly("fingerprint", &Layout::fingerprint,
                             "64-bit fingerprint of every field; part of every block key.")
      .def_property_readonly(
          "block_shape", [](const Layout& l) { return packedShape(l, l.blockTokens); },
          "Shape of a Block's array: (layers, 2, block_tokens, kv_heads, head_dim).")
      .def("packed_shape", &packedShape, "tokens"_a,
           "Shape of packed KV for `tokens` tokens: (layers, 2, tokens, kv_heads, head_dim).")
      .def(py::self == py::self)
      .def("__repr__", [](const Layout& l) {
        return "kvtier.Layout('" + l.modelId + "', num_layers=" + std::to_string(l.numLayers) +
               ", num_kv_heads=" + std::to_string(l.numKvHeads) +
               ", head_dim=" + std::to_string(l.headDim) + ", dtype='" + dtypeName(l.dtype) +
               "', block_tokens=" + std::to_string(l.blockTokens) + ")";
      });

  py::class_<CommitInfo>(m, "CommitInfo", "What a put or commit did.")
      .def_readonly("length", &CommitInfo::length, "The sequence's length afterwards.")
      .def_readonly("sealed_blocks", &CommitInfo::sealedBlocks,
                    "Blocks that became full: sealed, keyed and in the prefix index.")
      .def("__repr__", &commitRepr);

  py::class_<SnapshotInfo>(m, "Snapshot", "An immutable snapshot of positions [start, end).")
      .def_readonly("id", &SnapshotInfo::id)
      .def_readonly("start", &SnapshotInfo::from)
      .def_readonly("end", &SnapshotInfo::to)
      .def_readonly("checkpoints", &SnapshotInfo::checkpoints)
      .def_readonly("node", &SnapshotInfo::node)
      .def("__repr__", [](const SnapshotInfo& s) {
        return "kvtier.Snapshot(id=" + std::to_string(s.id) + ", start=" + std::to_string(s.from) +
               ", end=" + std::to_string(s.to) + ")";
      });

  py::class_<BlockRef>(m, "BlockRef", R"doc(
Names one pool block as a read handle saw it: extent, offset, bytes and the block's generation,
which changes whenever the block is reused. Space.read_refs reads it back while it is unchanged.
)doc")
      .def(py::init([](uint32_t extent, uint64_t offset, uint32_t bytes, uint64_t generation) {
             return BlockRef{extent, offset, bytes, generation};
           }),
           "extent"_a, "offset"_a, "bytes"_a, "generation"_a)
      .def_readonly("extent", &BlockRef::extent)
      .def_readonly("offset", &BlockRef::offset)
      .def_readonly("bytes", &BlockRef::bytes)
      .def_readonly("generation", &BlockRef::generation)
      .def("__repr__", [](const BlockRef& r) {
        return "kvtier.BlockRef(extent=" + std::to_string(r.extent) +
               ", offset=" + std::to_string(r.offset) + ", bytes=" + std::to_string(r.bytes) +
               ", generation=" + std::to_string(r.generation) + ")";
      });

  py::class_<ClusterMember>(m, "ClusterMember", "A member of the daemon's cluster.")
      .def_readonly("node_id", &ClusterMember::nodeId)
      .def_readonly("address", &ClusterMember::address, "HOST:PORT of its peer listener.")
      .def_readonly("up", &ClusterMember::up)
      .def_readonly("self", &ClusterMember::self, "True for the daemon this client talks to.")
      .def("__repr__", [](const ClusterMember& c) {
        return "kvtier.ClusterMember(node_id='" + c.nodeId + "', address='" + c.address +
               "', up=" + (c.up ? "True" : "False") + ")";
      });

  py::class_<BlockTransfer>(m, "BlockTransfer",
                            "What Space.copy_range, copy_keys and copy_prompt did.")
      .def_readonly("blocks", &BlockTransfer::blocks, "Blocks asked for.")
      .def_readonly("held", &BlockTransfer::held, "Of them, how many the destination now holds.")
      .def_readonly("dropped", &BlockTransfer::dropped, "With move: freed from this node's memory.")
      .def("__repr__", [](const BlockTransfer& t) {
        return "kvtier.BlockTransfer(blocks=" + std::to_string(t.blocks) +
               ", held=" + std::to_string(t.held) + ", dropped=" + std::to_string(t.dropped) + ")";
      });

  py::class_<DrainStep>(m, "DrainStep", "One step of Client.drain.")
      .def_readonly("snapshots_moved", &DrainStep::snapshotsMoved)
      .def_readonly("blocks_copied", &DrainStep::blocksCopied)
      .def_readonly("snapshots_left", &DrainStep::snapshotsLeft)
      .def_readonly("blocks_left", &DrainStep::blocksLeft)
      .def_readonly("failures", &DrainStep::failures, "Not handed over this time (retried next).")
      .def("__repr__", [](const DrainStep& d) {
        return "kvtier.DrainStep(snapshots_moved=" + std::to_string(d.snapshotsMoved) +
               ", blocks_copied=" + std::to_string(d.blocksCopied) +
               ", snapshots_left=" + std::to_string(d.snapshotsLeft) +
               ", blocks_left=" + std::to_string(d.blocksLeft) + ")";
      });

  defineBlock(m);

  py::class_<ClientState, std::shared_ptr<ClientState>>(m, "Client", R"doc(
A connection to a kvtierd daemon over its Unix socket.

Client(socket_path='kvtier-data/kvtierd.sock', *, client_name='kvtier-python', map_pool=True,
       lane=True)

Connecting maps nothing yet; open() maps the daemon's shared pool, and blocks are then read and
written in place (map_pool=False: bytes travel inline in the RPC messages instead). lane: lookups
and puts over the session's fast lane (one small message each way; False: every call over Cap'n
Proto). Raises kvtier.Unavailable when no daemon answers.

A context manager: leaving the `with` block closes the client. close() ends every handle (read
leases released, unfinished writes aborted) and space of the client; afterwards every call
raises kvtier.Released. Methods may be called from several threads; each releases the GIL while
it waits for the daemon. A Client cannot be used in a child process after fork()
(kvtier.UsedAfterFork): connect a new one there.
)doc")
      .def(py::init([](const std::string& socketPath, const std::string& clientName, bool mapPool,
                       bool lane) {
             ClientOptions options;
             options.socketPath = socketPath;
             options.clientName = clientName;
             options.mapPool = mapPool;
             options.lane = lane;
             return ClientState::connect(options);
           }),
           "socket_path"_a = "kvtier-data/kvtierd.sock", py::kw_only(),
           "client_name"_a = "kvtier-python", "map_pool"_a = true, "lane"_a = true)
      .def("open", &openSpace, "layout"_a, py::kw_only(), "device"_a = py::none(), R"doc(
Opens (or joins) the namespace of `layout` on the daemon and returns its Space. device: a CUDA
device (one of Client.devices) to open it on that GPU's pool, None for the host pool.
)doc")
      .def_property_readonly(
          "devices",
          [](ClientState& c) {
            return c.call([&] { return std::vector<int>(c.client().devices()); });
          },
          "The CUDA devices with a GPU pool on the daemon (empty without).")
      .def(
          "cluster",
          [](ClientState& c) { return unwrap(c.call([&] { return c.client().cluster(); })); },
          R"doc(
The cluster as the daemon sees it: (its node id, [ClusterMember, ...]); ('', []) outside one.
)doc")
      .def(
          "drain",
          [](ClientState& c, uint32_t maxSnapshots, uint32_t maxBlocks) {
            return unwrap(c.call([&] { return c.client().drain(maxSnapshots, maxBlocks); }));
          },
          "max_snapshots"_a, "max_blocks"_a, R"doc(
One step of draining the daemon's node before maintenance: moves up to max_snapshots of its
snapshots to the other live members (each dropped here only once another node holds it) and
copies up to max_blocks of its blocks in memory to them. Call until both lefts are 0; safe to
stop and call again. kvtier.InvalidArgument outside a cluster, kvtier.Unavailable with no other
live member.
)doc")
      .def(
          "stats",
          [](ClientState& c) {
            const Stats stats = unwrap(c.call([&] { return c.client().stats(); }));
            return py::module_::import("json").attr("loads")(stats.toJson());
          },
          "The daemon's counters, as a dict (the JSON of `kvtier stats`).")
      .def_property_readonly(
          "mapped", [](ClientState& c) { return c.call([&] { return c.client().mapped(); }); },
          "True when bytes move through the mapped shared pool, False when inline.")
      .def_property_readonly(
          "daemon_version",
          [](ClientState& c) {
            return c.call([&] { return std::string(c.client().daemonVersion()); });
          })
      .def_property_readonly("closed", &ClientState::closed)
      .def("close", &ClientState::close, R"doc(
Ends every handle and space of this client and closes the connection. Idempotent. Raises
kvtier.BufferInUse, and changes nothing, while an array of one of its handles' blocks is alive.
)doc")
      .def("__enter__", [](py::object self) { return self; })
      .def(
          "__exit__",
          [](ClientState& c, py::handle excType, py::handle, py::handle) {
            try {
              c.close();
            } catch (const PackageError&) {
              // Views still alive while an exception leaves the block: do not mask it; the
              // client closes when its objects are collected.
              if (excType.is_none()) throw;
            }
            return false;
          },
          "exc_type"_a, "exc"_a, "traceback"_a);

  py::class_<PutItemArgs>(m, "PutItem", R"doc(
One put of Space.put_many, with the arguments of Space.put:

PutItem(seq, begin, tokens, kv, *, detached=False, window=0, chunk=0, keys=None)

Kept as given: put_many checks them (and reads tokens and kv) when it is called.
)doc")
      .def(py::init([](std::string seq, uint64_t begin, py::object tokens, py::object kv,
                       bool detached, uint64_t window, uint64_t chunk, py::object keys) {
             return PutItemArgs{std::move(seq), begin, std::move(tokens), std::move(kv), detached,
                                window,         chunk, std::move(keys)};
           }),
           "seq"_a, "begin"_a, "tokens"_a, "kv"_a, py::kw_only(), "detached"_a = false,
           "window"_a = 0, "chunk"_a = 0, "keys"_a = py::none())
      .def_readonly("seq", &PutItemArgs::seq)
      .def_readonly("begin", &PutItemArgs::begin)
      .def_readonly("tokens", &PutItemArgs::tokens)
      .def_readonly("kv", &PutItemArgs::kv)
      .def_readonly("detached", &PutItemArgs::detached)
      .def_readonly("window", &PutItemArgs::window)
      .def_readonly("chunk", &PutItemArgs::chunk)
      .def_readonly("keys", &PutItemArgs::keys)
      .def("__repr__", [](const PutItemArgs& p) {
        return "kvtier.PutItem('" + p.seq + "', " + std::to_string(p.begin) + ", ...)";
      });

  py::class_<PagedCacheArgs>(m, "PagedKvCache", R"doc(
An engine's paged KV cache on a GPU, in vLLM's layout, for Space.put_paged, scatter_to and
gather_to: PagedKvCache(keys, values), for each layer a K and a V torch tensor of shape
(num_blocks, block_tokens, kv_heads, head_dim), contiguous, all of one dtype and device.
block_tokens (the engine's block size) need not be the layout's.

Raises TypeError for what is not a torch tensor and kvtier.InvalidArgument for tensors that do
not make one cache. The tensors are held, not copied: each call checks them against the space's
layout (layers, kv_heads, head_dim, dtype, device) and reads their data_ptr() then.
)doc")
      .def(py::init(&makePagedCache), "keys"_a, "values"_a)
      .def_readonly("keys", &PagedCacheArgs::keys, "The K tensor of each layer.")
      .def_readonly("values", &PagedCacheArgs::values, "The V tensor of each layer.")
      .def_readonly("block_tokens", &PagedCacheArgs::blockTokens, "The engine's block size.")
      .def("__repr__", [](const PagedCacheArgs& c) {
        return "kvtier.PagedKvCache(" + std::to_string(c.keys.size()) +
               " layers, block_tokens=" + std::to_string(c.blockTokens) + ")";
      });

  py::class_<SpaceState, std::shared_ptr<SpaceState>>(m, "Space", R"doc(
One namespace (tenant, layout) on the daemon; made by Client.open().

Positions [0, length) of a named sequence map to KV blocks; full blocks are sealed, keyed by the
tokens (chained SHA-256) and shared through the prefix index with every client of the layout.
`tokens` arguments are sequences of ints or 1-D integer arrays (0 <= t < 2**32); `kv` arguments
are packed arrays (Layout.packed_shape). Every mutation is atomic: on error nothing changed.
)doc")
      .def_property_readonly("layout", &SpaceState::layout)
      .def_property_readonly("fingerprint", &SpaceState::fingerprint)
      .def_property_readonly(
          "device",
          [](const SpaceState& s) -> std::optional<int> {
            if (s.device() < 0) return std::nullopt;
            return s.device();
          },
          "The CUDA device of the space's pool, None for the host pool.")
      .def(
          "put",
          [](SpaceState& s, const std::string& seq, uint64_t begin, py::handle tokens,
             py::handle kv, bool detached, uint64_t window, uint64_t chunk, py::handle keys) {
            PutOptions options = putOptions(detached, window, chunk);
            if (!keys.is_none()) options.keys = keysFrom(keys);
            return put(s, seq, begin, tokens, kv, options);
          },
          "seq"_a, "begin"_a, "tokens"_a, "kv"_a, py::kw_only(), "detached"_a = false,
          "window"_a = 0, "chunk"_a = 0, "keys"_a = py::none(), R"doc(
Stores the KV of `tokens` at positions [begin, begin + len(tokens)) of `seq` and commits it.

kv: a C-contiguous array of shape layout.packed_shape(len(tokens)) and the layout's dtype (a
torch tensor: pass tensor.numpy()). begin <= length(seq); positions from begin on are replaced.
detached: the sequence outlives this client's session. window/chunk: sliding-window or chunked
attention, for a sequence this call creates. keys: the engine's own 16-byte keys (bytes), one
for each block this put completes, instead of kvtier's keys of the tokens (lookup_keys finds
them). Returns CommitInfo.
)doc")
      .def(
          "begin_put",
          [](SpaceState& s, const std::string& seq, uint64_t begin, py::handle tokens,
             bool detached, uint64_t window, uint64_t chunk) {
            return beginPut(s, seq, begin, tokens, putOptions(detached, window, chunk));
          },
          "seq"_a, "begin"_a, "tokens"_a, py::kw_only(), "detached"_a = false, "window"_a = 0,
          "chunk"_a = 0, R"doc(
Asks for the blocks of positions [begin, begin + len(tokens)) of `seq` and returns a WriteHandle:
write each block in place (handle.block(i)) or packed (handle.write), then commit. Nothing is
visible to anyone before the commit. One writer per sequence at a time (kvtier.Conflict).
)doc")
      .def("put_many", &putMany, "items"_a, R"doc(
Several puts in one call, for a writer that hands over KV continuously (a prefill batch, an
engine offloading finished requests): each item — a PutItem, or a tuple (seq, begin, tokens, kv)
— is stored as put() would store it, in order, while the daemon grants the next item's blocks
during this item's copy.

Every item's arguments are checked before anything is sent: a bad one raises (TypeError,
kvtier.InvalidArgument) and nothing is stored. Then each item succeeds or fails on its own: the
result is a list with, for each item, its CommitInfo or the kvtier.Error it failed with
(returned, not raised: `raise r` re-raises it). An Unavailable item may or may not have been
stored (the connection ended under it).
)doc")
      .def(
          "put_paged",
          [](SpaceState& s, const std::string& seq, uint64_t begin, py::handle tokens,
             const PagedCacheArgs& cache, py::handle blockTable, py::handle stream, bool detached,
             uint64_t window, uint64_t chunk, py::handle keys) {
            s.client().checkUsable();
            const std::vector<uint32_t> ids = tokensFrom(tokens);
            const PagedKvCache paged = pagedCacheFor(cache, s);
            const std::vector<int32_t> table = blockTableFrom(blockTable, cache);
            void* cudaStream = streamFrom(stream);
            PutOptions options = putOptions(detached, window, chunk);
            if (!keys.is_none()) options.keys = keysFrom(keys);
            return unwrap(s.call([&](Space& space) {
              return space.putPaged(seq, begin, ids, paged, table, cudaStream, options);
            }));
          },
          "seq"_a, "begin"_a, "tokens"_a, "cache"_a, "block_table"_a, py::kw_only(),
          "stream"_a = py::none(), "detached"_a = false, "window"_a = 0, "chunk"_a = 0,
          "keys"_a = py::none(), R"doc(
put() from an engine's paged cache on the GPU: positions [begin, begin + len(tokens)) of `seq`
are scattered by a kernel from `cache` (a PagedKvCache) into the granted pool blocks, then
committed. block_table[i]: the engine block holding positions [i * cache.block_tokens, ...)
(ints, a 1-D integer array). stream: the engine's CUDA stream (a torch.cuda.Stream, a
cudaStream_t as an int, None: the default stream); returns once the kernel finished on it.

Only for a space opened on a GPU (Client.open(layout, device=...)) by a client built with CUDA:
kvtier.NotSupported otherwise, nothing changed.
)doc")
      .def(
          "scatter_to",
          [](SpaceState& s, WriteHandleState& h, uint64_t start, uint64_t stop,
             const PagedCacheArgs& cache, py::handle blockTable, py::handle stream) {
            checkHandleOf(s, h);
            const PagedKvCache paged = pagedCacheFor(cache, s);
            const std::vector<int32_t> table = blockTableFrom(blockTable, cache);
            h.scatterFrom(start, stop, paged, table, streamFrom(stream));
          },
          "handle"_a, "start"_a, "stop"_a, "cache"_a, "block_table"_a, py::kw_only(),
          "stream"_a = py::none(), R"doc(
The copy step of put_paged, for engines that batch: scatters positions [start, stop) of a
WriteHandle of this space (begin_put) from the engine's paged cache into its blocks; commit the
handle afterwards. As put_paged: a space on a GPU only (kvtier.NotSupported otherwise).
)doc")
      .def(
          "gather_to",
          [](SpaceState& s, ReadHandleState& h, uint64_t start, uint64_t stop,
             const PagedCacheArgs& cache, py::handle blockTable, py::handle stream) {
            checkHandleOf(s, h);
            const PagedKvCache paged = pagedCacheFor(cache, s);
            const std::vector<int32_t> table = blockTableFrom(blockTable, cache);
            h.gatherTo(start, stop, paged, table, streamFrom(stream));
          },
          "handle"_a, "start"_a, "stop"_a, "cache"_a, "block_table"_a, py::kw_only(),
          "stream"_a = py::none(), R"doc(
Gathers positions [start, stop) of a ReadHandle of this space (get, lookup) into the engine's
paged cache with a kernel on `stream`, and returns once it finished. A space on a GPU only
(kvtier.NotSupported otherwise, nothing changed).
)doc")
      .def(
          "get",
          [](SpaceState& s, const std::string& seq, uint64_t begin, std::optional<uint64_t> end) {
            return adoptHandle<ReadHandleState>(
                s, [&](Space& space) { return space.get(seq, begin, end.value_or(kEndPosition)); });
          },
          "seq"_a, "begin"_a = 0, "end"_a = py::none(), R"doc(
A ReadHandle on positions [begin, end) of `seq` (end=None: its length): the blocks stay pinned
until the handle is released. kvtier.NotFound for an unknown sequence.
)doc")
      .def(
          "lookup",
          [](SpaceState& s, py::handle tokens, const std::string& bindSeq, bool detached,
             uint64_t window, uint64_t chunk, const std::string& remote) {
            s.client().checkUsable();
            const std::vector<uint32_t> ids = tokensFrom(tokens);
            LookupOptions options;
            options.bindSeq = bindSeq;
            options.detached = detached;
            options.window = window;
            options.chunk = chunk;
            options.remote = remoteMode(remote);
            return adoptHandle<ReadHandleState>(
                s, [&](Space& space) { return space.lookup(ids, options); });
          },
          "tokens"_a, py::kw_only(), "bind_seq"_a = "", "detached"_a = false, "window"_a = 0,
          "chunk"_a = 0, "remote"_a = "fetch", R"doc(
The longest cached prefix of `tokens` made of whole blocks, as a ReadHandle (matched_tokens may
be 0). bind_seq: also make the matched prefix the whole of that sequence, in the same call.
remote: in a cluster, 'fetch' (default) the continuation from other nodes, 'local', or 'prefetch'.
)doc")
      .def(
          "copy_prefix",
          [](SpaceState& s, const std::string& src, const std::string& dst, uint64_t length,
             bool detached) {
            unwrap(
                s.call([&](Space& space) { return space.copyPrefix(src, dst, length, detached); }));
          },
          "src"_a, "dst"_a, "length"_a, py::kw_only(), "detached"_a = false,
          "dst becomes positions [0, min(length, length(src))) of src; full blocks are shared.")
      .def(
          "remove",
          [](SpaceState& s, const std::string& seq, uint64_t begin, std::optional<uint64_t> end) {
            unwrap(s.call([&](Space& space) {
              return space.remove(seq, begin, end.value_or(kEndPosition));
            }));
          },
          "seq"_a, "begin"_a = 0, "end"_a = py::none(),
          "Removes positions [begin, end) of seq (end=None: to its end).")
      .def(
          "truncate",
          [](SpaceState& s, const std::string& seq, uint64_t length) {
            unwrap(s.call([&](Space& space) { return space.truncate(seq, length); }));
          },
          "seq"_a, "length"_a)
      .def(
          "can_resume",
          [](SpaceState& s, const std::string& seq, uint64_t pos) {
            return unwrap(s.call([&](Space& space) { return space.canResume(seq, pos); }));
          },
          "seq"_a, "pos"_a, "True iff seq holds every position needed to continue at pos.")
      .def(
          "length",
          [](SpaceState& s, const std::string& seq) {
            return unwrap(s.call([&](Space& space) { return space.length(seq); }));
          },
          "seq"_a, "Length of seq, or None if it does not exist.")
      .def(
          "snapshot",
          [](SpaceState& s, const std::string& seq, uint64_t start) {
            return unwrap(s.call([&](Space& space) { return space.snapshot(seq, start); }));
          },
          "seq"_a, "start"_a = 0,
          "An immutable snapshot of positions [start, length) of seq (shares blocks).")
      .def(
          "restore",
          [](SpaceState& s, const std::string& seq, uint64_t snapshotId, uint64_t target,
             bool detached, const std::string& node) {
            unwrap(s.call([&](Space& space) {
              return space.restore(seq, snapshotId, target, putOptions(detached, 0, 0), node);
            }));
          },
          "seq"_a, "snapshot_id"_a, "target"_a, py::kw_only(), "detached"_a = false, "node"_a = "",
          R"doc(
seq becomes its own [0, snapshot.start) plus the snapshot up to target. node: the cluster node
holding the snapshot (Snapshot.node), when it is another: its manifest and blocks are pulled
here first, each checked, and nothing changes if that fails.
)doc")
      .def(
          "drop_snapshot",
          [](SpaceState& s, uint64_t id) {
            unwrap(s.call([&](Space& space) { return space.dropSnapshot(id); }));
          },
          "snapshot_id"_a)
      .def(
          "snapshot_info",
          [](SpaceState& s, uint64_t id) {
            return unwrap(s.call([&](Space& space) { return space.snapshotInfo(id); }));
          },
          "snapshot_id"_a,
          "The Snapshot `snapshot_id` of this namespace (kvtier.NotFound if none).")
      .def(
          "merge_snapshots",
          [](SpaceState& s, uint64_t a, uint64_t b) {
            return unwrap(s.call([&](Space& space) { return space.mergeSnapshots(a, b); }));
          },
          "a"_a, "b"_a, R"doc(
A new snapshot of a's positions followed by b's; requires a.end == b.start (else
kvtier.InvalidArgument, nothing changed). a and b stay.
)doc")
      .def(
          "split_snapshot",
          [](SpaceState& s, uint64_t id, uint64_t at) {
            return unwrap(s.call([&](Space& space) { return space.splitSnapshot(id, at); }));
          },
          "snapshot_id"_a, "at"_a, R"doc(
Two new snapshots: [start, at) and [at, end) of snapshot `snapshot_id` (at or outside its ends:
one of them is empty). A snapshot with recurrent-state checkpoints cannot be split
(kvtier.NotSupported).
)doc")
      .def(
          "rewind",
          [](SpaceState& s, const std::string& seq, uint64_t target) {
            unwrap(s.call([&](Space& space) { return space.rewind(seq, target); }));
          },
          "seq"_a, "target"_a, R"doc(
seq back to `target` <= its length without a snapshot; the window and checkpoint rules apply (a
sequence with checkpoints rewinds only to one of them).
)doc")
      .def(
          "put_checkpoint",
          [](SpaceState& s, const std::string& seq, uint64_t pos, py::handle state) {
            const BytesLike bytes(state, "state");
            unwrap(s.call([&](Space& space) {
              return space.putCheckpoint(seq, pos, bytes.data(), bytes.size());
            }));
          },
          "seq"_a, "pos"_a, "state"_a, R"doc(
Stores a recurrent layer's state (any bytes-like object: bytes, a NumPy array) as the checkpoint
of seq at position `pos` (<= its length). Restores and rewinds of a sequence with checkpoints
stop only at them.
)doc")
      .def(
          "checkpoints",
          [](SpaceState& s, const std::string& seq) {
            return unwrap(s.call([&](Space& space) { return space.checkpoints(seq); }));
          },
          "seq"_a, "The positions of seq's checkpoints, ascending.")
      .def(
          "get_checkpoint",
          [](SpaceState& s, const std::string& seq, uint64_t pos) {
            return adoptHandle<BlobHandleState>(
                s, [&](Space& space) { return space.getCheckpoint(seq, pos); });
          },
          "seq"_a, "pos"_a, R"doc(
The checkpoint of seq at position `pos` as a BlobHandle (its bytes in place, pinned until
release). kvtier.NotFound when seq has no checkpoint there, or no such sequence.
)doc")
      .def(
          "put_entry",
          [](SpaceState& s, py::handle key, py::handle data) {
            const Key128 k = keyFrom(key);
            const BytesLike bytes(data, "data");
            unwrap(s.call(
                [&](Space& space) { return space.putEntry(k, bytes.data(), bytes.size()); }));
          },
          "key"_a, "data"_a, R"doc(
Stores a position-independent entry (an encoder output, an image embedding): `data`, any
non-empty bytes-like object (bytes, a NumPy array), under the 16-byte `key` (content_key(data),
or the engine's own). A key that exists already keeps its bytes. Entries are shared by every
client of the layout and evicted like blocks.
)doc")
      .def(
          "get_entry",
          [](SpaceState& s, py::handle key) {
            const Key128 k = keyFrom(key);
            return adoptHandle<BlobHandleState>(s, [&](Space& space) { return space.getEntry(k); });
          },
          "key"_a, R"doc(
The entry stored under the 16-byte `key` as a BlobHandle (its bytes in place, pinned until
release). kvtier.NotFound when there is none (never stored, or evicted).
)doc")
      .def(
          "copy_range",
          [](SpaceState& s, const std::string& node, const std::string& seq, uint64_t begin,
             std::optional<uint64_t> end, bool move) {
            return unwrap(s.call([&](Space& space) {
              return space.copyRange(node, seq, begin, end.value_or(kEndPosition), move);
            }));
          },
          "node"_a, "seq"_a, "begin"_a = 0, "end"_a = py::none(), py::kw_only(), "move"_a = false,
          R"doc(
Node `node` of the cluster fetches the sealed blocks of seq over [begin, end) and keeps them as
cached blocks of its own (a lookup there hits them). move: once it holds them all, and only then,
this node lets go of them and removes [begin, end) from seq; kvtier.Unavailable if it holds
fewer (nothing here changed). Returns BlockTransfer.
)doc")
      .def(
          "copy_keys",
          [](SpaceState& s, const std::string& node, py::handle keys, bool move) {
            const std::vector<Key128> chain = keysFrom(keys);
            return unwrap(s.call([&](Space& space) { return space.copyKeys(node, chain, move); }));
          },
          "node"_a, "keys"_a, py::kw_only(), "move"_a = false,
          "copy_range for the blocks of 16-byte client keys (from memory or disk).")
      .def(
          "copy_prompt",
          [](SpaceState& s, const std::string& node, py::handle tokens, bool move) {
            s.client().checkUsable();
            const std::vector<uint32_t> ids = tokensFrom(tokens);
            return unwrap(s.call([&](Space& space) { return space.copyPrompt(node, ids, move); }));
          },
          "node"_a, "tokens"_a, py::kw_only(), "move"_a = false,
          "copy_range for the full blocks of the prompt `tokens` (the chain a lookup walks).")
      .def(
          "copy_snapshot",
          [](SpaceState& s, const std::string& node, uint64_t id, bool move) {
            return unwrap(s.call([&](Space& space) { return space.copySnapshot(node, id, move); }));
          },
          "node"_a, "snapshot_id"_a, py::kw_only(), "move"_a = false, R"doc(
Copies snapshot `snapshot_id` of cluster node `node` to this daemon as a snapshot of its own (a
new id); move: the source drops its copy once this daemon holds it. Returns the new Snapshot.
)doc")
      .def(
          "read_refs",
          [](SpaceState& s, const std::vector<BlockRef>& refs) {
            auto blocks = unwrap(s.call([&](Space& space) { return space.readRefs(refs); }));
            py::list out;
            for (const auto& b : blocks) {
              out.append(py::bytes(reinterpret_cast<const char*>(b.data()), b.size()));
            }
            return out;
          },
          "refs"_a, R"doc(
Copies of the sealed blocks named by `refs` (ReadHandle.refs), as bytes, read through the daemon
whether or not the handle is still held. kvtier.StaleReference once one of them was reused for
other bytes: never another block's bytes.
)doc")
      .def(
          "lookup_keys",
          [](SpaceState& s, py::handle keys, const std::string& bindSeq, bool detached,
             uint64_t window, uint64_t chunk, const std::string& remote) {
            s.client().checkUsable();
            const std::vector<Key128> chain = keysFrom(keys);
            LookupOptions options;
            options.bindSeq = bindSeq;
            options.detached = detached;
            options.window = window;
            options.chunk = chunk;
            options.remote = remoteMode(remote);
            return adoptHandle<ReadHandleState>(
                s, [&](Space& space) { return space.lookupKeys(chain, options); });
          },
          "keys"_a, py::kw_only(), "bind_seq"_a = "", "detached"_a = false, "window"_a = 0,
          "chunk"_a = 0, "remote"_a = "fetch",
          R"doc(
lookup() for an engine that keys its own blocks: the longest cached prefix of a chain of 16-byte
keys, one per block (bytes objects), as a ReadHandle.
)doc");

  m.def(
      "content_key",
      [](py::handle data) {
        const BytesLike bytes(data, "data");
        return keyBytes(contentKey(bytes.data(), bytes.size()));
      },
      "data"_a, "SHA-256 of a bytes-like object truncated to 16 bytes: a content key for entries.");

  py::class_<ReadHandleState, std::shared_ptr<ReadHandleState>>(m, "ReadHandle", R"doc(
Blocks pinned under a read lease (Space.get or Space.lookup), readable in place.

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
      .def_property_readonly("refs", &ReadHandleState::refs,
                             "The BlockRef of each block (names: they outlive the handle).")
      .def_property_readonly("inline_data", &ReadHandleState::inlineData,
                             "True when the blocks are private copies (a map_pool=False client).")
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
