package httpguard_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/guard/httpguard"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestVerifierRejectsForgedProofs: with a verifier, a request whose token
// comes without a valid proof for the resource's lock (none, made up,
// another lock's, a real proof with a larger token) is answered 403
// forged, before the store and the handler, and the store's mark does
// not move; a valid proof, sent by the Transport from a real hold, passes.
func TestVerifierRejectsForgedProofs(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	_, shard := lock(t, ctx, c, "shard-7", "a", 10*time.Second)
	_, other := lock(t, ctx, c, "billing", "b", 10*time.Second)

	store := newMemStore()
	var e effects
	g, err := httpguard.New(httpguard.Config{Store: store, Verifier: testutil.Verifier(t, ctx, c),
		LockOf: func(key string) string { return strings.SplitN(key, "/", 2)[0] }})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(g.Wrap(e.handler()))
	defer hs.Close()

	for name, h := range map[string]map[string]string{
		"no proof":                          fenceHeaders("shard-7/state", 999_999_999),
		"a made-up proof":                   withProof(fenceHeaders("shard-7/state", 999_999_999), "AQAAAAAAAAAA"),
		"another lock's proof (cross-lock)": withProof(fenceHeaders("shard-7/state", other.Token()), other.Proof()),
		"a real proof, a larger token":      withProof(fenceHeaders("shard-7/state", other.Token()), shard.Proof()),
	} {
		r := post(t, hs.URL, "x", h)
		if r.status != http.StatusForbidden || r.header.Get(httpguard.HeaderResult) != "forged" || r.body["error"] != httpguard.ForgedMessage || r.body["lock"] != "shard-7" {
			t.Fatalf("%s: %d %v %v, want 403 forged", name, r.status, r.header, r.body)
		}
	}
	if len(e.list()) != 0 || store.mark["shard-7/state"] != 0 {
		t.Fatalf("forged requests had effects %v or moved the mark to %d", e.list(), store.mark["shard-7/state"])
	}
	if st := g.Stats(); st.Forged != 4 || st.Stale != 0 {
		t.Fatalf("stats %+v", st)
	}

	// The sender side: a Transport over a real hold sends its proof, and
	// CheckResponse tells a forged answer apart.
	tr, err := httpguard.NewTransport(nil, shard, "shard-7/state")
	if err != nil {
		t.Fatal(err)
	}
	resp, err := (&http.Client{Transport: tr}).Post(hs.URL, "text/plain", strings.NewReader("v"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a valid proof through the Transport: %d", resp.StatusCode)
	}
	tr2, _ := httpguard.NewTransport(nil, other, "shard-7/state") // billing's hold on shard-7's resource
	resp, err = (&http.Client{Transport: tr2}).Post(hs.URL, "text/plain", strings.NewReader("v"))
	if err != nil {
		t.Fatal(err)
	}
	var fe *httpguard.ForgedError
	if err := httpguard.CheckResponse(resp); !errors.Is(err, fenceproof.ErrForged) || !errors.As(err, &fe) || fe.Lock != "shard-7" {
		t.Fatalf("CheckResponse of a cross-lock request: %v", err)
	}
}

func withProof(h map[string]string, proof string) map[string]string {
	h[httpguard.HeaderProof] = proof
	return h
}
