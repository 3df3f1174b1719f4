// kvtier.Space: space_bindings.h.
#include "space_bindings.h"

#include <pybind11/stl.h>

#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "arguments.h"
#include "handle_states.h"
#include "python_errors.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

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

// Space.put_state: the state after `tokens` and, for a position inside a block, the KV of the
// positions past the last whole block; everything is checked before anything is sent.
void putState(SpaceState& s, py::handle tokens, py::handle state, py::handle partialKv) {
  s.client().checkUsable();
  const std::vector<uint32_t> ids = tokensFrom(tokens);
  const BytesLike bytes(state, "state");
  const Layout& layout = s.layout();
  const uint32_t partial = static_cast<uint32_t>(ids.size() % layout.blockTokens);
  std::optional<PackedKv> kv;
  if (!partialKv.is_none()) {
    kv.emplace(partialKv, layout, partial, false, "partial_kv");
  } else if (partial > 0 && layout.hasKv() && layout.hasState() &&
             bytes.size() == layout.stateBytes) {
    // (Other errors first, in the SDK's order: a layout without a state, a wrong size.)
    throwError(ErrorCode::kInvalidArgument, "a state after ", ids.size(),
               " tokens needs partial_kv: the KV of the ", partial,
               " positions past the last whole block, an array of shape layout.packed_shape(",
               partial, ")");
  }
  unwrap(s.call([&](Space& space) {
    return space.putState(ids, bytes.data(), bytes.size(), kv ? kv->data() : nullptr,
                          kv ? kv->bytes() : 0);
  }));
}

}  // namespace

void defineSpace(py::module_& m) {
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

In a space whose layout has a state (Layout.state_bytes), the answer is instead the deepest
position whose state is cached (put_state) with the blocks before it, at a block boundary or
inside a block; the handle holds both (ReadHandle.read_state, copy_to). No state cached: 0
tokens, whatever blocks are cached. With bind_seq such a lookup matches whole blocks alone.
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
keys, one per block (bytes objects), as a ReadHandle. In a space whose layout has a state: the
deepest block boundary whose state is cached (put_state_keys) with the blocks before it.
)doc")
      .def("put_state", &putState, "tokens"_a, "state"_a, "partial_kv"_a = py::none(), R"doc(
Stores the state a model with recurrent layers had after tokens[0, n), n = len(tokens) >= 1
(at a block boundary while it evaluates a prompt, or at the end of a turn), so that a lookup of
any prompt beginning with those tokens, by any client of the layout, can restore there. A lookup
answers it only with the KV of the whole blocks before n, which put() stores under the same
tokens.

state: a bytes-like object (bytes, a NumPy uint8 array, ...) of exactly layout.state_bytes
bytes. partial_kv: when n is not a multiple of block_tokens, the KV of the n % block_tokens
positions past the last whole block, a packed array of shape layout.packed_shape(n %
block_tokens) in the layout's dtype; None otherwise (and for a layout without KV). A state cached
already is kept.

kvtier.InvalidArgument for a layout without a state, a wrong size, no tokens or too many, with
nothing stored; kvtier.Full when the pool has no room.
)doc")
      .def(
          "put_state_keys",
          [](SpaceState& s, py::handle keys, py::handle state) {
            s.client().checkUsable();
            const std::vector<Key128> chain = keysFrom(keys);
            const BytesLike bytes(state, "state");
            unwrap(s.call([&](Space& space) {
              return space.putStateKeys(chain, bytes.data(), bytes.size());
            }));
          },
          "keys"_a, "state"_a, R"doc(
put_state() for an engine that keys its own blocks (put(..., keys=...), lookup_keys): stores
`state` (layout.state_bytes bytes) as the state after the blocks of the 16-byte `keys`, one per
block (at least one), which lookup_keys then answers.
)doc");

  m.def(
      "content_key",
      [](py::handle data) {
        const BytesLike bytes(data, "data");
        return keyBytes(contentKey(bytes.data(), bytes.size()));
      },
      "data"_a, "SHA-256 of a bytes-like object truncated to 16 bytes: a content key for entries.");
}

}  // namespace kvtier::python
