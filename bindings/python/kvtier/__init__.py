"""kvtier: the Python client of the kvtier KV-cache daemon.

    import kvtier, numpy as np

    layout = kvtier.Layout("my-model", num_layers=4, num_kv_heads=2, head_dim=64,
                           dtype="float32", block_tokens=16)
    with kvtier.Client("kvtier-data/kvtierd.sock") as client:
        space = client.open(layout)
        space.put("req-1", 0, tokens, kv)             # kv: layout.packed_shape(len(tokens))
        with space.lookup(next_prompt) as hit:        # longest cached prefix, pinned
            for block in hit.blocks():
                a = block.numpy()                     # zero-copy view of the shared pool
                ...
                del a                                 # views must go before the release

Blocks are NumPy arrays (and torch tensors through torch.from_numpy) over the daemon's shared
memory, valid only while their handle is open; see docs/sdk.md for lifetimes and errors.
"""

from kvtier._kvtier import (
    BlobHandle,
    Block,
    BlockRef,
    BlockTransfer,
    Client,
    ClusterMember,
    CommitInfo,
    DrainStep,
    Layout,
    PagedKvCache,
    PutItem,
    ReadHandle,
    Rope,
    Snapshot,
    Space,
    WriteHandle,
    __version__,
    content_key,
)
from kvtier.errors import (
    BufferInUse,
    ChecksumMismatch,
    Conflict,
    Error,
    Full,
    Internal,
    InvalidArgument,
    NotFound,
    NotSupported,
    PermissionDenied,
    ProtocolMismatch,
    Released,
    StaleReference,
    Unavailable,
    UsedAfterFork,
)

__all__ = [
    "BlobHandle",
    "Block",
    "BlockRef",
    "BlockTransfer",
    "BufferInUse",
    "ChecksumMismatch",
    "Client",
    "ClusterMember",
    "CommitInfo",
    "DrainStep",
    "Conflict",
    "Error",
    "Full",
    "Internal",
    "InvalidArgument",
    "Layout",
    "NotFound",
    "NotSupported",
    "PagedKvCache",
    "PermissionDenied",
    "ProtocolMismatch",
    "PutItem",
    "ReadHandle",
    "Released",
    "Rope",
    "Snapshot",
    "Space",
    "StaleReference",
    "Unavailable",
    "UsedAfterFork",
    "WriteHandle",
    "__version__",
    "content_key",
]
