// Arguments from Python: arguments.h.
#include "arguments.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string_view>

#include "block_buffer.h"
#include "python_errors.h"

namespace kvtier::python {

std::string typeName(py::handle obj) { return Py_TYPE(obj.ptr())->tp_name; }

char formatChar(const char* format) {
  if (!format) return 'B';
  std::string_view f(format);
  if (!f.empty() && (f[0] == '@' || f[0] == '=' || f[0] == '<')) f.remove_prefix(1);
  if (f.size() != 1) return 0;
  return f[0];
}

BufferExport::BufferExport(py::handle obj) {
  if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_RECORDS_RO) != 0) throw py::error_already_set();
}

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

template std::vector<uint32_t> integersFrom<uint32_t>(py::handle, const std::string&, const char*,
                                                      const char*);
template std::vector<int32_t> integersFrom<int32_t>(py::handle, const std::string&, const char*,
                                                    const char*);

std::vector<uint32_t> tokensFrom(py::handle obj, const std::string& name) {
  return integersFrom<uint32_t>(obj, name, "token", "token ids are 0 <= t < 2**32");
}

std::string shapeString(const Py_ssize_t* shape, int ndim) {
  std::string s = "(";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + (ndim == 1 ? ",)" : ")");
}

PackedKv::PackedKv(py::handle obj, const Layout& layout, uint64_t tokens, bool writable,
                   const char* name)
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

py::handle PackedKv::checked(py::handle obj, const char* name) {
  if (!PyObject_CheckBuffer(obj.ptr())) {
    throw py::type_error(std::string(name) +
                         " must be a NumPy array (or another object with the buffer protocol), "
                         "not " +
                         typeName(obj) + "; for a torch.Tensor pass tensor.numpy()");
  }
  return obj;
}

BytesLike::BytesLike(py::handle obj, const char* name, bool writable)
    : export_(checked(obj, name)) {
  if (!PyBuffer_IsContiguous(&export_.view(), 'C')) {
    throwError(ErrorCode::kInvalidArgument, name, " must be C-contiguous");
  }
  if (writable && export_.view().readonly) {
    throwError(ErrorCode::kInvalidArgument, name, " is read-only");
  }
}

py::handle BytesLike::checked(py::handle obj, const char* name) {
  if (!PyObject_CheckBuffer(obj.ptr()) || PyUnicode_Check(obj.ptr())) {
    throw py::type_error(std::string(name) + " must be a bytes-like object, not " + typeName(obj));
  }
  return obj;
}

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
                  py::handle dtype, uint32_t blockTokens, std::optional<RopeScheme> rope,
                  uint64_t stateBytes) {
  Layout layout{
      std::move(modelId),         numLayers, numKvHeads, headDim, dtypeFrom(dtype), blockTokens,
      rope.value_or(RopeScheme{})};
  layout.stateBytes = stateBytes;
  // The messages name the fields as the keywords above do (num_kv_heads, not numKvHeads).
  unwrap(layout.validate(Layout::FieldNames::kSnakeCase));
  return layout;
}

py::tuple packedShape(const Layout& l, uint64_t tokens) {
  return py::make_tuple(l.numLayers, 2, tokens, l.numKvHeads, l.headDim);
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

Key128 keyFrom(py::handle obj) {
  BytesLike bytes(obj, "a key");
  if (bytes.size() != 16) {
    throwError(ErrorCode::kInvalidArgument, "a key is 16 bytes, got ", bytes.size());
  }
  Key128 key;
  std::memcpy(key.bytes.data(), bytes.data(), 16);
  return key;
}

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

}  // namespace kvtier::python
