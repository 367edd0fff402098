package testutil

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
)

// Verifier returns a verifier of the fence proofs of the cluster c talks
// to, built as a resource would build it: from the JSON of its keys.
func Verifier(t testing.TB, ctx context.Context, c *client.Client) *fenceproof.Verifier {
	t.Helper()
	ks, err := c.ClusterKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(ks)
	if err != nil {
		t.Fatal(err)
	}
	v, err := fenceproof.ParseKeyset(data)
	if err != nil {
		t.Fatalf("keyset %s: %v", data, err)
	}
	return v
}

// Lock takes lock name in a new session of c and returns the hold; the
// session is closed when the test ends.
func Lock(t testing.TB, ctx context.Context, c *client.Client, name string) *client.Hold {
	t.Helper()
	m, err := Session(t, ctx, c).Mutex(name)
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return h
}
