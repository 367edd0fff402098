package server

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/peer"
)

// Default watch limits of a node (--max-watches,
// --max-watches-per-connection).
const (
	DefaultMaxWatches              = 10_000
	DefaultMaxWatchesPerConnection = 1_000
)

// watchSlots counts the open watch streams (KVWatch and Observe) of this
// node, in total and per client connection, and refuses one past either
// limit. A slot is reserved atomically before the stream starts, so
// concurrent watches cannot race past a limit. Safe for concurrent use.
type watchSlots struct {
	maxTotal, maxPerConn int

	// mu guards the fields below.
	mu     sync.Mutex
	total  int
	byConn map[string]int
}

// open is the number of open watch streams.
func (w *watchSlots) open() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.total
}

// take reserves a slot for a stream of ctx's connection; release frees it.
func (w *watchSlots) take(ctx context.Context) (release func(), err error) {
	conn := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		conn = p.Addr.String()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.total >= w.maxTotal:
		return nil, fmt.Errorf("%w: %d watches are open on this node, the limit is %d (--max-watches)", ErrLimit, w.total, w.maxTotal)
	case w.byConn[conn] >= w.maxPerConn:
		return nil, fmt.Errorf("%w: %d watches are open on this connection, the limit is %d (--max-watches-per-connection)", ErrLimit, w.byConn[conn], w.maxPerConn)
	}
	if w.byConn == nil {
		w.byConn = make(map[string]int)
	}
	w.total++
	w.byConn[conn]++
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.total--
			if w.byConn[conn]--; w.byConn[conn] == 0 {
				delete(w.byConn, conn)
			}
		})
	}, nil
}
