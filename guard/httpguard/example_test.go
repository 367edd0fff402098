package httpguard_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"strings"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/guard/httpguard"
)

// The receiving service: the middleware advances a high-water mark kept in
// a Tenure fenced register and calls the handler only for current tokens.
func ExampleGuard() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.DefaultEndpoint)
	if err != nil {
		log.Fatal(err)
	}
	store, err := httpguard.NewRegisterStore(c, "")
	if err != nil {
		log.Fatal(err)
	}
	g, err := httpguard.New(httpguard.Config{
		Store: store,
		OnStale: func(r *http.Request, f httpguard.Fence, accepted uint64) {
			log.Printf("stale request for %s: token %d, accepted %d", f.Key, f.Token, accepted)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/apply", g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := httpguard.FromContext(r.Context())
		log.Printf("applying for %s under token %d (operation %q)", f.Key, f.Token, f.OperationID)
	})))
}

// The sending side: requests carry the hold's token and are not sent at all
// once the hold is suspect, lost or released.
func ExampleNewTransport() {
	ctx := context.Background()
	c, err := client.Dial(ctx, client.DefaultEndpoint)
	if err != nil {
		log.Fatal(err)
	}
	s, err := c.NewSession(ctx)
	if err != nil {
		log.Fatal(err)
	}
	m, _ := s.Mutex("shard-7")
	h, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer h.Unlock(context.Background())
	t, err := httpguard.NewTransport(nil, h, "shard-7")
	if err != nil {
		log.Fatal(err)
	}
	hc := &http.Client{Transport: t}
	req, _ := http.NewRequestWithContext(h.Context(), http.MethodPost, "http://effects.internal/apply", strings.NewReader("v2"))
	httpguard.WithOperationID(req, "shard-7/compact/0042")
	resp, err := hc.Do(req)
	if err != nil {
		log.Fatal(err) // errors.Is(err, client.ErrNotHeld): ownership in doubt, nothing sent
	}
	defer resp.Body.Close()
	if err := httpguard.CheckResponse(resp); errors.Is(err, client.ErrStale) {
		log.Print("a newer owner exists; stopping") // 409 from the guard
	}
}
