package epoch_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/fenceproof"
	"github.com/tenure-io/tenure/guard/epoch"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestVerifierRejectsForgedProofs: with a verifier, Writer refuses a
// token without a valid proof for the epochs' lock (none, made up,
// another lock's, a real proof with a larger token) as forged and creates
// no directory; a valid proof writes and publishes as before.
func TestVerifierRejectsForgedProofs(t *testing.T) {
	srv := testutil.Start(t, "", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := testutil.Dial(t, srv.Addr(), client.WithFenceProofs())
	v := testutil.Verifier(t, ctx, c)
	seg := testutil.Lock(t, ctx, c, "segments")
	other := testutil.Lock(t, ctx, c, "other")
	root := filepath.Join(t.TempDir(), "epochs")
	d, err := epoch.New(c, root, "segments/epoch", epoch.WithVerifier(v, "segments"))
	if err != nil {
		t.Fatal(err)
	}
	for name, try := range map[string]func() (*epoch.Writer, error){
		"no proof":                          func() (*epoch.Writer, error) { return d.Writer(ctx, 999_999_999) },
		"a made-up proof":                   func() (*epoch.Writer, error) { return d.Writer(ctx, 999_999_999, epoch.WithProof("AQAAAAAAAAAA")) },
		"another lock's proof (cross-lock)": func() (*epoch.Writer, error) { return d.Writer(ctx, other.Token(), epoch.WithProof(other.Proof())) },
		"a real proof, a larger token":      func() (*epoch.Writer, error) { return d.Writer(ctx, other.Token(), epoch.WithProof(seg.Proof())) },
	} {
		if _, err := try(); !errors.Is(err, epoch.ErrForged) || !errors.Is(err, fenceproof.ErrForged) {
			t.Fatalf("%s: %v, want ErrForged", name, err)
		}
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("forged tokens created %s: %v", root, err)
	}
	w, err := d.Writer(ctx, seg.Token(), epoch.WithProof(seg.Proof()))
	if err != nil {
		t.Fatalf("a valid proof: %v", err)
	}
	if err := w.WriteFile(ctx, "seg-1", []byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := w.Publish(ctx); err != nil {
		t.Fatal(err)
	}
}
