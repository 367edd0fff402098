package clienttest

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/testutil"
)

// TestSnapshotRestoreIntoNewCluster: a saved snapshot restored into a new
// server brings back registers, sessions and holds; the next token is
// larger than any in the snapshot; restoring it over newer state is refused.
func TestSnapshotRestoreIntoNewCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := testutil.Start(t, "", nil)
	c := dial(t, old.Addr())
	s, err := c.NewSession(ctx, client.WithTTL(30*time.Second), client.WithOwner("backup-test"))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := s.Mutex("job")
	h, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.FencedPut(ctx, "reg", []byte("v"), h.Token(), "op"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := c.SaveSnapshot(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	saved := buf.Bytes()
	ks, err := c.ClusterKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}

	fresh := testutil.Start(t, "", nil)
	c2 := dial(t, fresh.Addr())
	// Another cluster's snapshot is refused unless its id is named.
	if _, err := c2.RestoreSnapshot(ctx, bytes.NewReader(saved), false); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("restore of another cluster's snapshot: %v, want refusal", err)
	}
	resp, err := c2.RestoreSnapshot(ctx, bytes.NewReader(saved), false, client.FromCluster(ks.ClusterID))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetSessions() != 1 || resp.GetLocks() != 1 || resp.GetRegisters() != 1 {
		t.Fatalf("restored %v", resp)
	}
	reg, err := c2.FencedGet(ctx, "reg")
	if err != nil || string(reg.Value) != "v" || reg.Token != h.Token() {
		t.Fatalf("register after restore: %+v %v", reg, err)
	}
	st, err := c2.LockStatus(ctx, "job")
	if err != nil || st.GetHolder().GetSession() != s.ID() || st.GetHolder().GetToken() != h.Token() {
		t.Fatalf("lock after restore: %v %v", st, err)
	}
	s2, err := c2.NewSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m2, _ := s2.Mutex("other")
	h2, err := m2.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h2.Token() <= resp.GetRevision() {
		t.Fatalf("token %d after restore not above the snapshot's revision %d", h2.Token(), resp.GetRevision())
	}
	// The new cluster has moved on: restoring the old snapshot again would
	// reissue tokens, so it is refused.
	if _, err := c2.RestoreSnapshot(ctx, bytes.NewReader(saved), false, client.FromCluster(ks.ClusterID)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("restore over newer state: %v, want refusal", err)
	}
}
