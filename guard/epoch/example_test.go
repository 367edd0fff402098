package epoch_test

import (
	"context"
	"errors"
	"log"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/epoch"
)

// A writer under a lock writes its epoch and publishes it; readers follow
// the published epoch.
func Example() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.DefaultEndpoint)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	m, _ := s.Mutex("compaction")
	h, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Unlock(context.Background())

	dirs, err := epoch.New(c, "/data/segments", "segments/epoch")
	if err != nil {
		log.Fatal(err)
	}
	w, err := dirs.Writer(ctx, h.Token())
	if errors.Is(err, client.ErrStale) {
		return // a newer epoch is already published
	}
	if err != nil {
		log.Fatal(err)
	}
	if err := w.WriteFile(h.Context(), "seg-000001.kv", []byte("k\tv\n")); err != nil {
		log.Fatal(err)
	}
	if err := w.Publish(ctx); errors.Is(err, client.ErrStale) {
		return // a newer owner published first: our epoch stays unread
	} else if err != nil {
		log.Fatal(err)
	}
	if _, err := dirs.Collect(ctx, 1); err != nil {
		log.Print(err)
	}

	// Elsewhere, a reader:
	data, e, err := dirs.ReadFile(ctx, "seg-000001.kv")
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("epoch %d: %q", e.Token, data)
}
