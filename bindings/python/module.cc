// kvtier._kvtier: the Python binding of the client SDK (kvtier/client.h). The package `kvtier`
// (kvtier/__init__.py) re-exports it with the exception classes of kvtier/errors.py.
//
// Every argument from Python is checked before anything reaches the daemon (types, shapes,
// dtypes, token values; arguments.h), so bad input raises and changes nothing. Who owns what, and
// the rules for lifetimes, views, fork and threads: handle_states.h and block_buffer.h.
//
// This file defines the module: its small value types, Layout and Client; kvtier.Space is in
// space_bindings.cc, the handle classes in handle_bindings.cc.
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arguments.h"
#include "block_buffer.h"
#include "handle_bindings.h"
#include "handle_states.h"
#include "python_errors.h"
#include "space_bindings.h"

namespace kvtier::python {
namespace {

using namespace pybind11::literals;

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
What one KV block holds: model, layers, KV heads, head dim, dtype, tokens per block, RoPE; and
for a model with recurrent layers, the size of the state it has after a prefix.

Layout(model_id, num_layers, num_kv_heads, head_dim, dtype='float16', block_tokens=16, rope=None,
       *, state_bytes=0)

dtype: 'float16', 'bfloat16', 'float32', 'float8_e4m3', 'float8_e5m2', 'int8', or the NumPy or
torch dtype. A field out of bounds raises kvtier.InvalidArgument naming it by its keyword
(num_kv_heads, block_tokens 16..512, rope rotary_dims).
Blocks are shared only between clients that open the same layout.

KV travels "packed": an array of shape packed_shape(n) = (layers, 2, n, kv_heads, head_dim) for n
tokens (axis 1: K, then V), dtype numpy_dtype (bfloat16 as uint16, fp8 as uint8 bit patterns).

state_bytes: bytes of the recurrent state (state-space, linear-attention or short-convolution
layers) a model has after a prefix, which cannot be rebuilt from KV; 0: none. A space of such a
layout caches prefix states (Space.put_state) and its lookups answer only prefixes whose state is
cached (ReadHandle.read_state). A model of recurrent layers only has no KV: num_layers,
num_kv_heads and head_dim all 0.
)doc")
      .def(py::init(&makeLayout), "model_id"_a, "num_layers"_a, "num_kv_heads"_a, "head_dim"_a,
           "dtype"_a = "float16", "block_tokens"_a = 16, "rope"_a = py::none(), py::kw_only(),
           "state_bytes"_a = 0)
      .def_readonly("model_id", &Layout::modelId)
      .def_readonly("num_layers", &Layout::numLayers)
      .def_readonly("num_kv_heads", &Layout::numKvHeads)
      .def_readonly("head_dim", &Layout::headDim)
      .def_readonly("block_tokens", &Layout::blockTokens)
      .def_readonly("state_bytes", &Layout::stateBytes,
                    "Bytes of the recurrent state after a prefix (0: the model has none).")
      .def_property_readonly("has_kv", &Layout::hasKv,
                             "False for a model of recurrent layers only (no KV, a state).")
      .def_property_readonly("has_state", &Layout::hasState, "True when state_bytes is not 0.")
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
               "', block_tokens=" + std::to_string(l.blockTokens) +
               (l.hasState() ? ", state_bytes=" + std::to_string(l.stateBytes) : "") + ")";
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
       lane=True, reconnect=True)

Connecting maps nothing yet; open() maps the daemon's shared pool, and blocks are then read and
written in place (map_pool=False: bytes travel inline in the RPC messages instead). lane: lookups
and puts over the session's fast lane (one small message each way; False: every call over Cap'n
Proto). Raises kvtier.Unavailable when no daemon answers.

When the daemon goes away, calls raise kvtier.Unavailable; once a daemon answers on the socket
again the client connects to it by itself (reconnect=True; attempts at most every 250 ms however
often calls come): spaces opened before are opened again on it at their next call (its pool is
new: what the old daemon cached is a miss), handles from before raise kvtier.Unavailable, and
reconnects counts the times. reconnect=False: every call after the loss raises; make a new
Client.

A context manager: leaving the `with` block closes the client. close() ends every handle (read
leases released, unfinished writes aborted) and space of the client; afterwards every call
raises kvtier.Released. Methods may be called from several threads; each releases the GIL while
it waits for the daemon. A Client cannot be used in a child process after fork()
(kvtier.UsedAfterFork): connect a new one there.
)doc")
      .def(py::init([](const std::string& socketPath, const std::string& clientName, bool mapPool,
                       bool lane, bool reconnect) {
             ClientOptions options;
             options.socketPath = socketPath;
             options.clientName = clientName;
             options.mapPool = mapPool;
             options.lane = lane;
             options.reconnect = reconnect;
             return ClientState::connect(options);
           }),
           "socket_path"_a = "kvtier-data/kvtierd.sock", py::kw_only(),
           "client_name"_a = "kvtier-python", "map_pool"_a = true, "lane"_a = true,
           "reconnect"_a = true)
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
          "reconnects",
          [](ClientState& c) { return c.call([&] { return c.client().reconnects(); }); },
          "Times the client connected again after its daemon went away.")
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

  defineSpace(m);
  defineHandles(m);
}
