package kvtier_test

// Tests of the Go bindings against a real kvtierd: tests/go_test.sh (ctest -R Go.Bindings) starts
// one through tests/with_daemon.sh and sets KVTIER_SOCKET. Each test opens its own namespace (a
// layout with the test's model id).

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"kvtier"
)

// 2 layers, 2 KV heads, head dim 8, fp16, 16 tokens per block: 128 bytes of K and V per token.
const (
	layers      = 2
	blockTokens = 16
	tokenBytes  = 32 // one layer's K (or V) of one token
	tokenKV     = 128
)

func layout(model string) kvtier.Layout {
	return kvtier.Layout{ModelID: "go/" + model, Layers: layers, KVHeads: 2, HeadDim: 8,
		DType: kvtier.F16, BlockTokens: blockTokens}
}

func socket(t *testing.T) string {
	s := os.Getenv("KVTIER_SOCKET")
	if s == "" {
		t.Fatal("KVTIER_SOCKET is not set: run these tests through tests/go_test.sh " +
			"(ctest -R Go.Bindings), which starts a daemon")
	}
	return s
}

// open connects and opens the test's namespace; both are closed when the test ends.
func open(t *testing.T, model string, inline bool) (*kvtier.Client, *kvtier.Space) {
	t.Helper()
	c, err := kvtier.Connect(kvtier.Options{SocketPath: socket(t), ClientName: "go-test", Inline: inline})
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	s, err := c.Open(layout(model))
	if err != nil {
		c.Close()
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		s.Close()
		c.Close()
	})
	return c, s
}

func tokens(n int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*100003 + uint32(i)*7919 + 1
	}
	return out
}

func kvBytes(n int, seed uint32) []byte {
	out := make([]byte, n*tokenKV)
	x := seed*2654435761 + 12345
	for i := range out {
		x = x*1103515245 + 12345
		out[i] = byte(x >> 16)
	}
	return out
}

// packRange is positions [from, to) of a packed buffer of n tokens, packed.
func packRange(kv []byte, n, from, to int) []byte {
	out := make([]byte, 0, (to-from)*tokenKV)
	for lkv := 0; lkv < 2*layers; lkv++ {
		out = append(out, kv[(lkv*n+from)*tokenBytes:(lkv*n+to)*tokenBytes]...)
	}
	return out
}

func mustCode(t *testing.T, err error, want *kvtier.Error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got error %v, want %v", err, want.Code)
	}
	var e *kvtier.Error
	if !errors.As(err, &e) || !strings.HasPrefix(e.Error(), want.Code.String()+": ") {
		t.Fatalf("error %q does not start with %s", err, want.Code)
	}
}

func TestPutLookupGet(t *testing.T) {
	c, s := open(t, "put-lookup-get", false)
	if m, err := c.Mapped(); err != nil || !m {
		t.Fatalf("Mapped = %v, %v; want a mapped pool", m, err)
	}
	if s.TokenKVBytes() != tokenKV || s.BlockBytes() != tokenKV*blockTokens {
		t.Fatalf("token bytes %d, block bytes %d", s.TokenKVBytes(), s.BlockBytes())
	}
	const n = 40
	tok, kv := tokens(n+8, 1), kvBytes(n, 1)
	info, err := s.Put("req-1", 0, tok[:n], kv, nil)
	if err != nil || info.Length != n || info.SealedBlocks != 2 {
		t.Fatalf("Put = %+v, %v", info, err)
	}

	hit, err := s.Lookup(tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer hit.Close()
	hi, err := hit.Info()
	if err != nil || hi.Begin != 0 || hi.End != 32 || hi.Blocks != 2 {
		t.Fatalf("lookup Info = %+v, %v; want the two sealed blocks", hi, err)
	}
	got := make([]byte, 32*tokenKV)
	if err := hit.CopyTo(0, 32, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, packRange(kv, n, 0, 32)) {
		t.Fatal("looked-up bytes differ from those put")
	}

	g, err := s.Get("req-1", 8, kvtier.End)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got = make([]byte, (n-8)*tokenKV)
	if err := g.CopyTo(8, n, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, packRange(kv, n, 8, n)) {
		t.Fatal("got bytes differ from those put")
	}

	st, err := c.Stats()
	if err != nil || st.Hits == 0 || st.BytesPut < uint64(len(kv)) {
		t.Fatalf("Stats = %+v, %v", st, err)
	}
	js, err := c.StatsJSON()
	if err != nil || !strings.Contains(js, `"hits"`) {
		t.Fatalf("StatsJSON = %q, %v", js, err)
	}
}

func TestBeginPutCommit(t *testing.T) {
	_, s := open(t, "begin-put", true) // inline: bytes travel in the messages
	const n = 32
	tok, kv := tokens(n, 2), kvBytes(n, 2)
	w, err := s.BeginPut("w", 0, tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if wi, err := w.Info(); err != nil || wi.End != n || wi.Blocks != 2 {
		t.Fatalf("Info = %+v, %v", wi, err)
	}
	if err := w.Write(0, n, kv); err != nil {
		t.Fatal(err)
	}
	miss, err := s.Lookup(tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	if mi, _ := miss.Info(); mi.End != 0 {
		t.Fatalf("visible before the commit: %+v", mi)
	}
	miss.Close()
	_, err = w.Commit(n + 1)
	mustCode(t, err, kvtier.ErrInvalidArgument) // leaves the write open
	if ci, err := w.Commit(kvtier.End); err != nil || ci.Length != n || ci.SealedBlocks != 2 {
		t.Fatalf("Commit = %+v, %v", ci, err)
	}
	mustCode(t, w.Write(0, n, kv), kvtier.ErrReleased)

	g, err := s.Get("w", 0, kvtier.End)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := make([]byte, len(kv))
	if err := g.CopyTo(0, n, got); err != nil || !bytes.Equal(got, kv) {
		t.Fatalf("read back %v, equal %v", err, bytes.Equal(got, kv))
	}

	a, err := s.BeginPut("aborted", 0, tok[:16], nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Abort(); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if _, exists, err := s.Length("aborted"); err != nil || exists {
		t.Fatalf("aborted sequence exists=%v (%v)", exists, err)
	}
}

func TestSequenceOps(t *testing.T) {
	_, s := open(t, "sequence-ops", false)
	const n = 40
	kv := kvBytes(n, 3)
	if _, err := s.Put("src", 0, tokens(n, 3), kv, &kvtier.PutOptions{Detached: true}); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyPrefix("src", "dst", 20, false); err != nil {
		t.Fatal(err)
	}
	if l, ok, err := s.Length("dst"); err != nil || !ok || l != 20 {
		t.Fatalf("Length(dst) = %d, %v, %v", l, ok, err)
	}
	if err := s.Truncate("dst", 10); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.CanResume("dst", 10); !ok {
		t.Fatal("cannot resume at the end")
	}
	if ok, _ := s.CanResume("dst", 11); ok {
		t.Fatal("resumes past the end")
	}
	// A lookup that binds its match to a new sequence, in the same call.
	hit, err := s.Lookup(tokens(n, 3), &kvtier.LookupOptions{BindSeq: "bound", Remote: kvtier.RemoteLocal})
	if err != nil {
		t.Fatal(err)
	}
	hit.Close()
	if l, ok, err := s.Length("bound"); err != nil || !ok || l != 32 {
		t.Fatalf("Length(bound) = %d, %v, %v; want the 2 whole blocks", l, ok, err)
	}
	mustCode(t, s.Remove("src", 4, 8), kvtier.ErrNotSupported) // no RoPE declared
	if err := s.Remove("src", 16, kvtier.End); err != nil {
		t.Fatal(err)
	}
	if l, _, _ := s.Length("src"); l != 16 {
		t.Fatalf("Length(src) = %d after removing [16, end)", l)
	}
}

func TestSnapshotRestore(t *testing.T) {
	_, s := open(t, "snapshot", false)
	const n = 48
	kv := kvBytes(n, 4)
	if _, err := s.Put("s", 0, tokens(n, 4), kv, nil); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Snapshot("s", 0)
	if err != nil || snap.From != 0 || snap.To != n {
		t.Fatalf("Snapshot = %+v, %v", snap, err)
	}
	if err := s.Remove("s", 0, kvtier.End); err != nil {
		t.Fatal(err)
	}
	if err := s.Restore("r", snap.ID, 32, nil); err != nil {
		t.Fatal(err)
	}
	g, err := s.Get("r", 0, kvtier.End)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	got := make([]byte, 32*tokenKV)
	if err := g.CopyTo(0, 32, got); err != nil || !bytes.Equal(got, packRange(kv, n, 0, 32)) {
		t.Fatalf("restored bytes differ (%v)", err)
	}
	if err := s.DropSnapshot(snap.ID); err != nil {
		t.Fatal(err)
	}
	mustCode(t, s.Restore("r2", snap.ID, 16, nil), kvtier.ErrNotFound)
}

func TestBadInput(t *testing.T) {
	_, err := kvtier.Connect(kvtier.Options{SocketPath: "/nonexistent/kvtierd.sock"})
	mustCode(t, err, kvtier.ErrUnavailable)
	if !kvtier.Unavailable.Retryable() || kvtier.InvalidArgument.Retryable() {
		t.Fatal("Retryable is wrong")
	}

	c, s := open(t, "bad-input", false)
	_, err = c.Open(kvtier.Layout{ModelID: "go/bad", Layers: 2, KVHeads: 2, HeadDim: 8, BlockTokens: 7})
	mustCode(t, err, kvtier.ErrInvalidArgument)
	_, err = c.Open(kvtier.Layout{ModelID: "go/bad", Layers: 2, KVHeads: 2, HeadDim: 8, DType: 99, BlockTokens: 16})
	mustCode(t, err, kvtier.ErrInvalidArgument)

	const n = 32
	tok, kv := tokens(n, 5), kvBytes(n, 5)
	before, _ := c.Stats()
	_, err = s.Put("x", 0, tok, kv[:len(kv)-1], nil) // one byte short
	mustCode(t, err, kvtier.ErrInvalidArgument)
	_, err = s.Put("x", 0, tok, kv, &kvtier.PutOptions{Keys: make([][16]byte, 7)}) // keys for 2 blocks
	if err == nil {
		t.Fatal("a put with 7 keys for 2 blocks succeeded")
	}
	if _, exists, _ := s.Length("x"); exists {
		t.Fatal("a failed put created its sequence")
	}
	if after, _ := c.Stats(); after.BytesPut != before.BytesPut || after.WriteLeases != 0 {
		t.Fatalf("failed puts changed the daemon: %+v -> %+v", before, after)
	}

	if _, err := s.Put("y", 0, tok, kv, nil); err != nil {
		t.Fatal(err)
	}
	g, err := s.Get("y", 0, kvtier.End)
	if err != nil {
		t.Fatal(err)
	}
	out := bytes.Repeat([]byte{0x5a}, len(kv))
	mustCode(t, g.CopyTo(0, n, out[:len(out)-1]), kvtier.ErrInvalidArgument)
	mustCode(t, g.CopyTo(0, n+1, append(out, make([]byte, tokenKV)...)), kvtier.ErrInvalidArgument)
	if !bytes.Equal(out, bytes.Repeat([]byte{0x5a}, len(kv))) {
		t.Fatal("a failed copy wrote into the buffer")
	}

	// Use after release and after close.
	if err := g.Release(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, g.CopyTo(0, n, out), kvtier.ErrReleased)
	mustCode(t, g.Release(), kvtier.ErrReleased)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	_, err = g.Info()
	mustCode(t, err, kvtier.ErrReleased)
	mustCode(t, g.Close(), kvtier.ErrReleased)
}

func TestClosedClient(t *testing.T) {
	c, err := kvtier.Connect(kvtier.Options{SocketPath: socket(t)})
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(layout("closed-client"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	tok, kv := tokens(n, 6), kvBytes(n, 6)
	if _, err := s.Put("p", 0, tok, kv, nil); err != nil {
		t.Fatal(err)
	}
	hit, err := s.Lookup(tok, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Everything made from the client answers RELEASED, and nothing reaches the daemon.
	_, err = c.Stats()
	mustCode(t, err, kvtier.ErrReleased)
	_, err = s.Put("p", 0, tok, kv, nil)
	mustCode(t, err, kvtier.ErrReleased)
	mustCode(t, hit.CopyTo(0, n, make([]byte, len(kv))), kvtier.ErrReleased)
	mustCode(t, c.Close(), kvtier.ErrReleased)
	if err := hit.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// Many goroutines share one client and one space.
func TestGoroutines(t *testing.T) {
	_, s := open(t, "goroutines", false)
	const n, workers, rounds = 32, 8, 10
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				seed := uint32(1000 + w*rounds + r)
				tok, kv := tokens(n, seed), kvBytes(n, seed)
				if _, err := s.Put(fmt.Sprintf("g%d", seed), 0, tok, kv, nil); err != nil {
					errs <- err
					return
				}
				hit, err := s.Lookup(tok, nil)
				if err != nil {
					errs <- err
					return
				}
				got := make([]byte, len(kv))
				err = hit.CopyTo(0, n, got)
				hit.Close()
				if err != nil || !bytes.Equal(got, kv) {
					errs <- fmt.Errorf("worker %d round %d: bytes differ (%v)", w, r, err)
					return
				}
			}
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
