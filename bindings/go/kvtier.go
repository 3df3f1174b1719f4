// Package kvtier is the Go client of kvtierd, a node's KV-cache daemon for LLM inference: cgo
// over kvtier's C ABI (kvtier/kvtier.h, in libkvtier).
//
//	client, err := kvtier.Connect(kvtier.Options{SocketPath: "kvtier-data/kvtierd.sock"})
//	space, err := client.Open(kvtier.Layout{ModelID: "llama3", Layers: 32, KVHeads: 8,
//		HeadDim: 128, DType: kvtier.F16, BlockTokens: 16})
//	_, err = space.Put("req-1", 0, tokens, kv, nil)     // kv: packed, see Space.Put
//	hit, err := space.Lookup(prompt, nil)                // the longest cached prefix
//	info, err := hit.Info()                              // info.End tokens matched
//	err = hit.CopyTo(0, info.End, out)
//	hit.Close(); space.Close(); client.Close()
//
// Building: cgo finds the library with pkg-config (`#cgo pkg-config: kvtier`): point
// PKG_CONFIG_PATH at an installed prefix's lib/pkgconfig (docs/sdk.md).
//
// Errors are *Error values carrying kvtier's stable code; compare with errors.Is against the
// Err* values (errors.Is(err, kvtier.ErrNotFound)) or read Code with errors.As. A failed call
// changes nothing.
//
// Concurrency: a Client and its Spaces may be used from many goroutines at once; each call blocks
// its goroutine until the daemon answers. A ReadHandle or WriteHandle is safe to share, its calls
// run one at a time. Close may be called at any time, also concurrently: calls already running
// finish first, later calls fail with ErrReleased.
//
// Resources: Close every Client, Space, ReadHandle and WriteHandle (a ReadHandle pins blocks in
// the daemon's pool until it is closed or released). Closing a Client ends its connection at once:
// the daemon releases its leases, and every Space and handle made from it answers ErrReleased
// (close them all the same).
package kvtier

/*
#cgo pkg-config: kvtier
#include <stdlib.h>
#include "kvtier/kvtier.h"
*/
import "C"

import (
	"math"
	"runtime"
	"sync"
	"unsafe"
)

// End stands for "the end of the sequence" (Get, Remove) or "everything granted" (Commit).
const End uint64 = math.MaxUint64

// Code is one of kvtier's stable error codes (kvtier::ErrorCode; the protocol's numbers).
type Code uint32

const (
	OK               Code = C.KVTIER_OK
	InvalidArgument  Code = C.KVTIER_INVALID_ARGUMENT
	NotFound         Code = C.KVTIER_NOT_FOUND
	Full             Code = C.KVTIER_FULL
	NotSupported     Code = C.KVTIER_NOT_SUPPORTED
	StaleReference   Code = C.KVTIER_STALE_REFERENCE
	ChecksumMismatch Code = C.KVTIER_CHECKSUM_MISMATCH
	PermissionDenied Code = C.KVTIER_PERMISSION_DENIED
	Unavailable      Code = C.KVTIER_UNAVAILABLE
	Conflict         Code = C.KVTIER_CONFLICT
	ProtocolMismatch Code = C.KVTIER_PROTOCOL_MISMATCH
	Internal         Code = C.KVTIER_INTERNAL
	Released         Code = C.KVTIER_RELEASED
)

// String is the code's name: "NOT_FOUND", "RELEASED", ...
func (c Code) String() string { return C.GoString(C.kvtier_code_name(C.kvtier_code(c))) }

// Retryable tells whether the same call may succeed later (FULL, UNAVAILABLE, CONFLICT).
func (c Code) Retryable() bool { return c == Full || c == Unavailable || c == Conflict }

// Error is a failed call: its code and the library's message ("NOT_FOUND: no snapshot 7").
type Error struct {
	Code    Code
	Message string
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Message
}

// Is makes errors.Is(err, kvtier.ErrNotFound) match any *Error with that code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && (t.Message == "" || t.Message == e.Message)
}

// One value per code, for errors.Is.
var (
	ErrInvalidArgument  = &Error{Code: InvalidArgument}
	ErrNotFound         = &Error{Code: NotFound}
	ErrFull             = &Error{Code: Full}
	ErrNotSupported     = &Error{Code: NotSupported}
	ErrStaleReference   = &Error{Code: StaleReference}
	ErrChecksumMismatch = &Error{Code: ChecksumMismatch}
	ErrPermissionDenied = &Error{Code: PermissionDenied}
	ErrUnavailable      = &Error{Code: Unavailable}
	ErrConflict         = &Error{Code: Conflict}
	ErrProtocolMismatch = &Error{Code: ProtocolMismatch}
	ErrInternal         = &Error{Code: Internal}
	ErrReleased         = &Error{Code: Released}
)

// call runs one C call and turns a failure into an *Error. The C library leaves its message per
// thread: the goroutine stays on its thread from the call until the message is read.
func call(f func() C.kvtier_code) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if code := f(); code != C.KVTIER_OK {
		return &Error{Code: Code(code), Message: C.GoString(C.kvtier_last_error())}
	}
	return nil
}

func closedError(what string) error {
	return &Error{Code: Released, Message: "RELEASED: the " + what + " was closed"}
}

// cString is a C copy of s; free it with C.free.
func cString(s string) *C.char { return C.CString(s) }

func tokensPtr(tokens []uint32) *C.uint32_t {
	if len(tokens) == 0 {
		return nil
	}
	return (*C.uint32_t)(unsafe.Pointer(&tokens[0]))
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

// DType is the element type of K and V.
type DType uint32

const (
	F16    DType = C.KVTIER_DTYPE_F16
	BF16   DType = C.KVTIER_DTYPE_BF16
	F32    DType = C.KVTIER_DTYPE_F32
	F8E4M3 DType = C.KVTIER_DTYPE_F8E4M3
	F8E5M2 DType = C.KVTIER_DTYPE_F8E5M2
	I8     DType = C.KVTIER_DTYPE_I8
)

// RopeStyle is how the model rotates K; declaring it lets kvtier remove a middle range of a
// sequence (re-rotating the K that moves).
type RopeStyle uint32

const (
	RopeNone RopeStyle = C.KVTIER_ROPE_NONE
	RopeNeox RopeStyle = C.KVTIER_ROPE_NEOX // pairs (d, d + RotaryDims/2): Llama (HF), Qwen, Mistral
	RopeGptj RopeStyle = C.KVTIER_ROPE_GPTJ // pairs (2d, 2d + 1)
)

// Layout is what one block holds. Blocks are shared only between spaces of equal layouts.
type Layout struct {
	ModelID     string
	Layers      uint32
	KVHeads     uint32
	HeadDim     uint32
	DType       DType
	BlockTokens uint32 // 16..512
	Rope        RopeStyle
	RotaryDims  uint32  // with a Rope: even, <= HeadDim
	RopeBase    float64 // with a Rope: 0 means 10000
}

// Options of Connect.
type Options struct {
	SocketPath string // "" means kvtier-data/kvtierd.sock
	ClientName string // "" means kvtier-go
	// Inline: bytes travel in the RPC messages instead of through the daemon's shared memory.
	Inline bool
}

// Stats are the daemon's main counters; Client.StatsJSON has all of them.
type Stats struct {
	BlocksTotal, BlocksUsed, BlocksPinned, BlocksCached uint64
	BytesTotal, BytesUsed                               uint64
	Hits, Misses, Evictions                             uint64
	Clients, Sequences, ReadLeases, WriteLeases         uint64
	BytesPut, BytesGot                                  uint64
	Snapshots                                           uint64
	Spilled, Promoted, ColdRecords, ColdBytes           uint64
}

// Client is a connection to the daemon.
type Client struct {
	mu sync.RWMutex // Close holds it exclusively; calls hold it shared
	c  *C.kvtier_client
}

// Connect connects to the daemon (ErrUnavailable if none answers on the socket).
func Connect(o Options) (*Client, error) {
	var sock, name *C.char
	if o.SocketPath != "" {
		sock = cString(o.SocketPath)
		defer C.free(unsafe.Pointer(sock))
	}
	if o.ClientName == "" {
		o.ClientName = "kvtier-go"
	}
	name = cString(o.ClientName)
	defer C.free(unsafe.Pointer(name))
	var flags C.uint32_t
	if o.Inline {
		flags |= C.KVTIER_CONNECT_INLINE
	}
	var c *C.kvtier_client
	if err := call(func() C.kvtier_code { return C.kvtier_connect(sock, name, flags, &c) }); err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// Close ends the connection and frees the client. Closing twice returns ErrReleased.
func (cl *Client) Close() error {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.c == nil {
		return closedError("client")
	}
	C.kvtier_client_destroy(cl.c)
	cl.c = nil
	return nil
}

func (cl *Client) with(f func(c *C.kvtier_client) C.kvtier_code) error {
	cl.mu.RLock()
	defer cl.mu.RUnlock()
	if cl.c == nil {
		return closedError("client")
	}
	return call(func() C.kvtier_code { return f(cl.c) })
}

// Mapped tells whether bytes move through the daemon's mapped pool (false: inline).
func (cl *Client) Mapped() (bool, error) {
	var m C.int
	err := cl.with(func(c *C.kvtier_client) C.kvtier_code { return C.kvtier_client_mapped(c, &m) })
	return m != 0, err
}

// Stats returns the daemon's main counters.
func (cl *Client) Stats() (Stats, error) {
	var s C.kvtier_stats
	if err := cl.with(func(c *C.kvtier_client) C.kvtier_code { return C.kvtier_client_stats(c, &s) }); err != nil {
		return Stats{}, err
	}
	return Stats{
		BlocksTotal: uint64(s.blocks_total), BlocksUsed: uint64(s.blocks_used),
		BlocksPinned: uint64(s.blocks_pinned), BlocksCached: uint64(s.blocks_cached),
		BytesTotal: uint64(s.bytes_total), BytesUsed: uint64(s.bytes_used),
		Hits: uint64(s.hits), Misses: uint64(s.misses), Evictions: uint64(s.evictions),
		Clients: uint64(s.clients), Sequences: uint64(s.sequences),
		ReadLeases: uint64(s.read_leases), WriteLeases: uint64(s.write_leases),
		BytesPut: uint64(s.bytes_put), BytesGot: uint64(s.bytes_got), Snapshots: uint64(s.snapshots),
		Spilled: uint64(s.spilled), Promoted: uint64(s.promoted),
		ColdRecords: uint64(s.cold_records), ColdBytes: uint64(s.cold_bytes),
	}, nil
}

// StatsJSON returns every counter of the daemon as a JSON object.
func (cl *Client) StatsJSON() (string, error) {
	var out *C.char
	if err := cl.with(func(c *C.kvtier_client) C.kvtier_code { return C.kvtier_client_stats_json(c, &out) }); err != nil {
		return "", err
	}
	defer C.kvtier_free(unsafe.Pointer(out))
	return C.GoString(out), nil
}

// Open opens (or joins) the namespace for the layout on the host pool.
func (cl *Client) Open(l Layout) (*Space, error) {
	model := cString(l.ModelID)
	defer C.free(unsafe.Pointer(model))
	cl2 := C.kvtier_layout{
		model_id: model, num_layers: C.uint32_t(l.Layers), num_kv_heads: C.uint32_t(l.KVHeads),
		head_dim: C.uint32_t(l.HeadDim), dtype: C.uint32_t(l.DType),
		block_tokens: C.uint32_t(l.BlockTokens), rope_style: C.uint32_t(l.Rope),
		rotary_dims: C.uint32_t(l.RotaryDims), rope_base: C.double(l.RopeBase),
	}
	var s *C.kvtier_space
	if err := cl.with(func(c *C.kvtier_client) C.kvtier_code { return C.kvtier_open(c, &cl2, -1, &s) }); err != nil {
		return nil, err
	}
	sp := &Space{s: s}
	var info C.kvtier_space_info
	if err := sp.with(func(s *C.kvtier_space) C.kvtier_code { return C.kvtier_space_get_info(s, &info) }); err != nil {
		sp.Close()
		return nil, err
	}
	sp.tokenKvBytes = uint64(info.token_kv_bytes)
	sp.blockBytes = uint64(info.block_bytes)
	sp.fingerprint = uint64(info.fingerprint)
	return sp, nil
}

// PutOptions are the options of Put, BeginPut and Restore; nil means the defaults.
type PutOptions struct {
	Detached bool   // the sequence outlives this client's session
	Window   uint64 // sliding-window attention: keep the last Window tokens (0: all)
	Chunk    uint64 // chunked attention: keep the current chunk (0: all)
	// The client's own keys for the blocks the put completes (nil: derived from the tokens).
	Keys [][16]byte
}

// RemoteMode is what a lookup does about blocks other cluster nodes hold.
type RemoteMode uint32

const (
	RemoteFetch    RemoteMode = C.KVTIER_REMOTE_FETCH    // fetch the longest continuation first
	RemoteLocal    RemoteMode = C.KVTIER_REMOTE_LOCAL    // this node only
	RemotePrefetch RemoteMode = C.KVTIER_REMOTE_PREFETCH // the local hit now, the rest meanwhile
)

// LookupOptions are the options of Lookup and LookupKeys; nil means the defaults.
type LookupOptions struct {
	BindSeq  string // also make the matched prefix the whole of this sequence ("": none)
	Detached bool   // for a sequence BindSeq creates
	Window   uint64
	Chunk    uint64
	Remote   RemoteMode
}

// CommitInfo says what a put or commit left.
type CommitInfo struct {
	Length       uint64 // of the sequence after the commit
	SealedBlocks uint32 // blocks sealed (and entered in the prefix index) by it
}

// HandleInfo is the range of positions a read or write handle covers.
type HandleInfo struct {
	Begin, End    uint64 // a lookup: [0, tokens matched)
	FirstPosition uint64 // of block 0's first slot
	Blocks        uint64
}

// SnapshotInfo names a snapshot and the positions it holds.
type SnapshotInfo struct {
	ID, From, To uint64
}

// cPutOptions converts o; the returned function frees what it allocated.
func cPutOptions(o *PutOptions) (*C.kvtier_put_options, func()) {
	if o == nil {
		return nil, func() {}
	}
	co := (*C.kvtier_put_options)(C.calloc(1, C.sizeof_kvtier_put_options))
	if o.Detached {
		co.flags = C.KVTIER_DETACHED
	}
	co.window = C.uint64_t(o.Window)
	co.chunk = C.uint64_t(o.Chunk)
	if len(o.Keys) > 0 {
		keys := C.malloc(C.size_t(len(o.Keys) * 16))
		copy(unsafe.Slice((*byte)(keys), len(o.Keys)*16), unsafe.Slice(&o.Keys[0][0], len(o.Keys)*16))
		co.keys = (*C.uint8_t)(keys)
		co.num_keys = C.size_t(len(o.Keys))
	}
	return co, func() {
		C.free(unsafe.Pointer(co.keys))
		C.free(unsafe.Pointer(co))
	}
}

func cLookupOptions(o *LookupOptions) (*C.kvtier_lookup_options, func()) {
	if o == nil {
		return nil, func() {}
	}
	co := (*C.kvtier_lookup_options)(C.calloc(1, C.sizeof_kvtier_lookup_options))
	if o.BindSeq != "" {
		co.bind_seq = cString(o.BindSeq)
	}
	if o.Detached {
		co.flags = C.KVTIER_DETACHED
	}
	co.window = C.uint64_t(o.Window)
	co.chunk = C.uint64_t(o.Chunk)
	co.remote = C.uint32_t(o.Remote)
	return co, func() {
		C.free(unsafe.Pointer(co.bind_seq))
		C.free(unsafe.Pointer(co))
	}
}

// Space is one namespace (tenant, layout) on the daemon.
type Space struct {
	mu                                    sync.RWMutex
	s                                     *C.kvtier_space
	tokenKvBytes, blockBytes, fingerprint uint64
}

// TokenKVBytes is the size of one token's K and V over all layers: packed buffers hold this many
// bytes per token.
func (sp *Space) TokenKVBytes() uint64 { return sp.tokenKvBytes }

// BlockBytes is the size of one block.
func (sp *Space) BlockBytes() uint64 { return sp.blockBytes }

// Fingerprint is the layout's 64-bit fingerprint.
func (sp *Space) Fingerprint() uint64 { return sp.fingerprint }

// Close frees the space; its handles stay usable until closed.
func (sp *Space) Close() error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.s == nil {
		return closedError("space")
	}
	C.kvtier_space_destroy(sp.s)
	sp.s = nil
	return nil
}

func (sp *Space) with(f func(s *C.kvtier_space) C.kvtier_code) error {
	sp.mu.RLock()
	defer sp.mu.RUnlock()
	if sp.s == nil {
		return closedError("space")
	}
	return call(func() C.kvtier_code { return f(sp.s) })
}

// onSeq runs f with seq as a C string.
func (sp *Space) onSeq(seq string, f func(s *C.kvtier_space, seq *C.char) C.kvtier_code) error {
	cseq := cString(seq)
	defer C.free(unsafe.Pointer(cseq))
	return sp.with(func(s *C.kvtier_space) C.kvtier_code { return f(s, cseq) })
}

// Put stores the KV of tokens at positions [begin, begin+len(tokens)) of seq (positions from
// begin on are replaced; begin must be <= the sequence's length). kv is packed:
// [layer][K|V][token][kvHead][headDim] over these tokens, len(tokens) * TokenKVBytes() bytes.
func (sp *Space) Put(seq string, begin uint64, tokens []uint32, kv []byte, o *PutOptions) (CommitInfo, error) {
	co, free := cPutOptions(o)
	defer free()
	var info C.kvtier_commit_info
	err := sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_put(s, cseq, C.uint64_t(begin), tokensPtr(tokens), C.size_t(len(tokens)),
			bytesPtr(kv), C.size_t(len(kv)), co, &info)
	})
	return CommitInfo{uint64(info.length), uint32(info.sealed_blocks)}, err
}

// BeginPut is the first step of Put: a write lease on [begin, begin+len(tokens)) of seq. Nothing
// is visible until WriteHandle.Commit.
func (sp *Space) BeginPut(seq string, begin uint64, tokens []uint32, o *PutOptions) (*WriteHandle, error) {
	co, free := cPutOptions(o)
	defer free()
	var w *C.kvtier_write_handle
	err := sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_begin_put(s, cseq, C.uint64_t(begin), tokensPtr(tokens), C.size_t(len(tokens)), co, &w)
	})
	if err != nil {
		return nil, err
	}
	return &WriteHandle{w: w}, nil
}

// Get takes a read lease on positions [begin, end) of seq (end End: its length).
func (sp *Space) Get(seq string, begin, end uint64) (*ReadHandle, error) {
	var r *C.kvtier_read_handle
	err := sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_get(s, cseq, C.uint64_t(begin), C.uint64_t(end), &r)
	})
	if err != nil {
		return nil, err
	}
	return &ReadHandle{r: r}, nil
}

// Lookup finds the longest cached prefix of tokens made of whole sealed blocks, under a read
// lease. A miss is a handle with End 0, not an error.
func (sp *Space) Lookup(tokens []uint32, o *LookupOptions) (*ReadHandle, error) {
	co, free := cLookupOptions(o)
	defer free()
	var r *C.kvtier_read_handle
	err := sp.with(func(s *C.kvtier_space) C.kvtier_code {
		return C.kvtier_lookup(s, tokensPtr(tokens), C.size_t(len(tokens)), co, &r)
	})
	if err != nil {
		return nil, err
	}
	return &ReadHandle{r: r}, nil
}

// LookupKeys is Lookup for a chain of the client's own block keys.
func (sp *Space) LookupKeys(keys [][16]byte, o *LookupOptions) (*ReadHandle, error) {
	co, free := cLookupOptions(o)
	defer free()
	var ptr *C.uint8_t
	if len(keys) > 0 {
		ptr = (*C.uint8_t)(unsafe.Pointer(&keys[0][0]))
	}
	var r *C.kvtier_read_handle
	err := sp.with(func(s *C.kvtier_space) C.kvtier_code {
		return C.kvtier_lookup_keys(s, ptr, C.size_t(len(keys)), co, &r)
	})
	if err != nil {
		return nil, err
	}
	return &ReadHandle{r: r}, nil
}

// CopyPrefix makes dst positions [0, min(n, length of src)) of src (full blocks shared).
func (sp *Space) CopyPrefix(src, dst string, n uint64, detached bool) error {
	csrc, cdst := cString(src), cString(dst)
	defer C.free(unsafe.Pointer(csrc))
	defer C.free(unsafe.Pointer(cdst))
	var flags C.uint32_t
	if detached {
		flags = C.KVTIER_DETACHED
	}
	return sp.with(func(s *C.kvtier_space) C.kvtier_code {
		return C.kvtier_copy_prefix(s, csrc, cdst, C.uint64_t(n), flags)
	})
}

// Remove removes [begin, end) of seq; end End truncates. An unknown sequence or a range past the
// end is no error; a middle range needs the layout's Rope (else ErrNotSupported).
func (sp *Space) Remove(seq string, begin, end uint64) error {
	return sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_remove(s, cseq, C.uint64_t(begin), C.uint64_t(end))
	})
}

// Truncate keeps [0, n) of seq.
func (sp *Space) Truncate(seq string, n uint64) error {
	return sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_truncate(s, cseq, C.uint64_t(n))
	})
}

// CanResume tells whether seq holds every position needed to continue at pos.
func (sp *Space) CanResume(seq string, pos uint64) (bool, error) {
	var ok C.int
	err := sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_can_resume(s, cseq, C.uint64_t(pos), &ok)
	})
	return ok != 0, err
}

// Length returns the length of seq, and whether it exists.
func (sp *Space) Length(seq string) (uint64, bool, error) {
	var exists C.int
	var n C.uint64_t
	err := sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_length(s, cseq, &exists, &n)
	})
	return uint64(n), exists != 0, err
}

// Snapshot makes an immutable snapshot of [from, length) of seq that outlives later writes to,
// and removal of, the sequence.
func (sp *Space) Snapshot(seq string, from uint64) (SnapshotInfo, error) {
	var info C.kvtier_snapshot_info
	err := sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_snapshot(s, cseq, C.uint64_t(from), &info)
	})
	return SnapshotInfo{uint64(info.id), uint64(info.from), uint64(info.to)}, err
}

// Restore makes seq its own [0, snapshot From) plus the snapshot's [From, target).
func (sp *Space) Restore(seq string, id, target uint64, o *PutOptions) error {
	co, free := cPutOptions(o)
	defer free()
	return sp.onSeq(seq, func(s *C.kvtier_space, cseq *C.char) C.kvtier_code {
		return C.kvtier_restore(s, cseq, C.uint64_t(id), C.uint64_t(target), co)
	})
}

// DropSnapshot deletes a snapshot.
func (sp *Space) DropSnapshot(id uint64) error {
	return sp.with(func(s *C.kvtier_space) C.kvtier_code { return C.kvtier_drop_snapshot(s, C.uint64_t(id)) })
}

// ReadHandle holds blocks under a read lease (Get, Lookup); they stay pinned until Release or
// Close.
type ReadHandle struct {
	mu sync.RWMutex
	r  *C.kvtier_read_handle
}

func (h *ReadHandle) with(f func(r *C.kvtier_read_handle) C.kvtier_code) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.r == nil {
		return closedError("read handle")
	}
	return call(func() C.kvtier_code { return f(h.r) })
}

// Info returns the positions the handle holds: for a lookup, End is the number of tokens matched.
func (h *ReadHandle) Info() (HandleInfo, error) {
	var i C.kvtier_handle_info
	err := h.with(func(r *C.kvtier_read_handle) C.kvtier_code { return C.kvtier_read_info(r, &i) })
	return HandleInfo{uint64(i.begin), uint64(i.end), uint64(i.first_position), uint64(i.block_count)}, err
}

// CopyTo copies positions [from, to) into out, packed; len(out) must be
// (to - from) * Space.TokenKVBytes(). Each block is checked against its writer's checksum as it
// is copied: an error matching ErrChecksumMismatch when one changed in the pool (use nothing of
// out; the daemon drops the block, so the next lookup stops before it).
func (h *ReadHandle) CopyTo(from, to uint64, out []byte) error {
	return h.with(func(r *C.kvtier_read_handle) C.kvtier_code {
		return C.kvtier_read_copy(r, C.uint64_t(from), C.uint64_t(to), bytesPtr(out), C.size_t(len(out)))
	})
}

// Release unpins the blocks now; later calls fail with ErrReleased (Close still frees).
func (h *ReadHandle) Release() error {
	return h.with(func(r *C.kvtier_read_handle) C.kvtier_code { return C.kvtier_read_release(r) })
}

// Close releases the blocks if still held and frees the handle.
func (h *ReadHandle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.r == nil {
		return closedError("read handle")
	}
	C.kvtier_read_destroy(h.r)
	h.r = nil
	return nil
}

// WriteHandle holds blocks under a write lease (BeginPut). Nothing is visible until Commit.
type WriteHandle struct {
	mu sync.RWMutex
	w  *C.kvtier_write_handle
}

func (h *WriteHandle) with(f func(w *C.kvtier_write_handle) C.kvtier_code) error {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if h.w == nil {
		return closedError("write handle")
	}
	return call(func() C.kvtier_code { return f(h.w) })
}

// Info returns the positions granted.
func (h *WriteHandle) Info() (HandleInfo, error) {
	var i C.kvtier_handle_info
	err := h.with(func(w *C.kvtier_write_handle) C.kvtier_code { return C.kvtier_write_info(w, &i) })
	return HandleInfo{uint64(i.begin), uint64(i.end), uint64(i.first_position), uint64(i.block_count)}, err
}

// Write writes positions [from, to) of the grant from a packed buffer of
// (to - from) * Space.TokenKVBytes() bytes.
func (h *WriteHandle) Write(from, to uint64, kv []byte) error {
	return h.with(func(w *C.kvtier_write_handle) C.kvtier_code {
		return C.kvtier_write(w, C.uint64_t(from), C.uint64_t(to), bytesPtr(kv), C.size_t(len(kv)))
	})
}

// Commit makes [begin, upTo) visible (End: everything granted) and ends the write. A bad upTo
// (ErrInvalidArgument) leaves the write open for another try.
func (h *WriteHandle) Commit(upTo uint64) (CommitInfo, error) {
	var info C.kvtier_commit_info
	err := h.with(func(w *C.kvtier_write_handle) C.kvtier_code {
		return C.kvtier_commit(w, C.uint64_t(upTo), &info)
	})
	return CommitInfo{uint64(info.length), uint32(info.sealed_blocks)}, err
}

// Abort ends the write without making anything visible.
func (h *WriteHandle) Abort() error {
	return h.with(func(w *C.kvtier_write_handle) C.kvtier_code { return C.kvtier_abort(w) })
}

// Close aborts the write if still open and frees the handle.
func (h *WriteHandle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.w == nil {
		return closedError("write handle")
	}
	C.kvtier_write_destroy(h.w)
	h.w = nil
	return nil
}
