package server

import (
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/tenure-io/tenure/internal/fsm"
)

// TestWatchRingProperties feeds the ring random applied batches (some with
// several changes at one revision, some with none, and restores) under
// random bounds, while readers with random start revisions read at random
// paces. Every reader either receives exactly the committed history of its
// key from its start revision, in order and without gaps, or ends with
// ErrCompacted at a revision the history really no longer holds.
func TestWatchRingProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxEvents := rapid.IntRange(1, 20).Draw(t, "maxEvents")
		maxBytes := rapid.IntRange(100, 2000).Draw(t, "maxBytes")
		r := newWatchRing(maxEvents, maxBytes)
		keys := []string{"a", "b", "ab"}
		var history []kvEvent // every change fed
		var base uint64       // revision of the last restore
		epoch := 0            // restores so far
		rev := uint64(0)

		type reader struct {
			key    string
			start  uint64
			cursor uint64
			sent   uint64
			got    []kvEvent
			dead   error
			epoch  int
		}
		var readers []*reader
		match := func(key string) func(*fsm.KV) bool {
			return func(kv *fsm.KV) bool { return len(kv.Key) >= len(key) && kv.Key[:len(key)] == key }
		}
		want := func(rd *reader) []kvEvent {
			var out []kvEvent
			for _, e := range history {
				if e.kv.ModRevision >= rd.start && match(rd.key)(&e.kv) {
					out = append(out, e)
				}
			}
			return out
		}
		t.Repeat(map[string]func(*rapid.T){
			"batch": func(t *rapid.T) {
				for range rapid.IntRange(0, 3).Draw(t, "commands") {
					rev++
					for range rapid.IntRange(0, 3).Draw(t, "changes") {
						k := rapid.SampledFrom(keys).Draw(t, "key")
						v := make([]byte, rapid.IntRange(0, 50).Draw(t, "size"))
						kv := fsm.KV{Key: k, Value: v, ModRevision: rev}
						kind := fsm.EventKVPut
						if rapid.Bool().Draw(t, "delete") {
							kind, kv.Value = fsm.EventKVDelete, nil
						}
						r.feed(fsm.Event{Kind: kind, Revision: rev, KV: &kv})
						history = append(history, newKVEvent(kind == fsm.EventKVPut, kv, nil))
					}
				}
				r.feed(fsm.Event{Kind: fsm.EventApplied, Revision: rev})
			},
			"restore": func(t *rapid.T) {
				rev += uint64(rapid.IntRange(0, 5).Draw(t, "jump"))
				base = rev
				epoch++
				r.feed(fsm.Event{Kind: fsm.EventRestored, Revision: rev})
			},
			"newReader": func(t *rapid.T) {
				rd := &reader{key: rapid.SampledFrom(keys).Draw(t, "key"), start: rapid.Uint64Range(1, rev+2).Draw(t, "start")}
				cur, err := r.seek(rd.start)
				compactRev, _ := r.history()
				if err != nil {
					if !errors.Is(err, ErrCompacted) || rd.start > compactRev {
						t.Fatalf("seek(%d): %v with history after %d", rd.start, err, compactRev)
					}
					return
				}
				if rd.start <= base {
					t.Fatalf("seek(%d) accepted below the restore at %d", rd.start, base)
				}
				rd.cursor, rd.sent, rd.epoch = cur, rd.start-1, epoch
				readers = append(readers, rd)
			},
			"read": func(t *rapid.T) {
				if len(readers) == 0 {
					return
				}
				rd := rapid.SampledFrom(readers).Draw(t, "reader")
				if rd.dead != nil {
					return
				}
				m := match(rd.key)
				evs, cur, through, _, _, err := r.read(rd.cursor, rd.sent+1, func(ev *kvEvent) bool { return ev.kv.ModRevision >= rd.start && m(&ev.kv) })
				if err != nil {
					var ce *CompactedError
					if !errors.As(err, &ce) || ce.Requested != rd.sent+1 {
						t.Fatalf("read: %v", err)
					}
					// Really gone: the history no longer starts at or
					// before the revision the reader needs next (or a
					// restore skipped what it needed).
					if ce.CompactRevision < rd.sent+1 {
						t.Fatalf("compacted at %d though the reader needs %d", ce.CompactRevision, rd.sent+1)
					}
					rd.dead = err
					return
				}
				if rd.epoch != epoch && base >= rd.sent+1 {
					t.Fatalf("a reader went on across a restore that skipped revisions it needed")
				}
				rd.cursor, rd.epoch = cur, epoch
				rd.got = append(rd.got, evs...)
				rd.sent = max(rd.sent, through)
			},
			"": func(t *rapid.T) {
				for _, rd := range readers {
					if rd.dead != nil || rd.epoch != epoch {
						continue
					}
					w := want(rd)
					// What a live reader got is a prefix of the history.
					if len(rd.got) > len(w) {
						t.Fatalf("reader %q from %d got %d events, history has %d", rd.key, rd.start, len(rd.got), len(w))
					}
					for i := range rd.got {
						if rd.got[i].put != w[i].put || fmt.Sprint(rd.got[i].kv) != fmt.Sprint(w[i].kv) {
							t.Fatalf("reader %q from %d: event %d is %v, want %v", rd.key, rd.start, i, rd.got[i], w[i])
						}
					}
				}
			},
		})
	})
}
