package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
)

// sessionJSON is one live session.
type sessionJSON struct {
	ID           uint64   `json:"id"`
	Owner        string   `json:"owner"`
	TTLMs        int64    `json:"ttl_ms"`
	Held         []string `json:"held"`
	Waiting      []string `json:"waiting"`
	HeldCount    uint32   `json:"held_count"`
	WaitingCount uint32   `json:"waiting_count"`
}

// sessionListJSON is `tenure session list -o json`.
type sessionListJSON struct {
	Sessions []sessionJSON `json:"sessions"`
	Revision uint64        `json:"revision"`
}

func (a *app) sessionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "Inspect sessions",
	}
	cmd.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List the live sessions",
		Long: `List the live sessions, by id, with the locks each holds and waits for
(at most 1,000 names of each; held_count and waiting_count count them all).

The server answers in pages, which are read one after the other: with
more sessions than one page holds, the list is not one snapshot, and
"revision" is the first page's. A session that lives through the whole
listing is listed exactly once.

JSON: {"sessions":[{"id","owner","ttl_ms","held":[..],"waiting":[..],
"held_count","waiting_count"}],"revision"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.listing(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Sessions(ctx)
				if err != nil {
					return err
				}
				out := sessionListJSON{Sessions: make([]sessionJSON, 0, len(resp.GetSessions())), Revision: resp.GetRevision()}
				for _, s := range resp.GetSessions() {
					out.Sessions = append(out.Sessions, sessionJSON{
						ID: s.GetId(), Owner: s.GetOwner(), TTLMs: s.GetTtlMs(),
						Held: nonNil(s.GetHeld()), Waiting: nonNil(s.GetWaiting()),
						HeldCount: s.GetHeldCount(), WaitingCount: s.GetWaitingCount(),
					})
				}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "%d sessions\n", len(out.Sessions))
					for _, s := range out.Sessions {
						fmt.Fprintf(w, "  %d  %s  ttl %dms  held [%s]  waiting [%s]\n", s.ID, s.Owner, s.TTLMs, names(s.Held, s.HeldCount), names(s.Waiting, s.WaitingCount))
					}
				})
			})
		},
	})
	return cmd
}

// statusJSON is `tenure status -o json`.
type statusJSON struct {
	Node         string   `json:"node"`
	Leader       string   `json:"leader"`
	Term         uint64   `json:"term"`
	Revision     uint64   `json:"revision"`
	Voters       []string `json:"voters"`
	AppliedIndex uint64   `json:"applied_index"`
	// The node's watch history (docs/kv.md).
	WatchCompactRevision uint64 `json:"watch_compact_revision"`
	WatchHistoryEvents   uint64 `json:"watch_history_events"`
	// StorageError: why the node's last write to its disk failed; "" when
	// it succeeded.
	StorageError string `json:"storage_error"`
}

func (a *app) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the server's view: node, leader, term, revision",
		Long: `Show the server's view of the cluster.

JSON: {"node","leader","term","revision","voters":[..],"applied_index",
"watch_compact_revision","watch_history_events","storage_error"}: the
node's watch history holds watch_history_events key changes, every one
after watch_compact_revision; storage_error is why the node's last write to
its disk failed ("storage full on node X: ..."), "" when it succeeded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				st, err := c.Status(ctx)
				if err != nil {
					return err
				}
				out := statusJSON{Node: st.GetNode(), Leader: st.GetLeader(), Term: st.GetTerm(), Revision: st.GetRevision(), Voters: nonNil(st.GetVoters()), AppliedIndex: st.GetAppliedIndex(),
					WatchCompactRevision: st.GetWatchCompactRevision(), WatchHistoryEvents: st.GetWatchHistoryEvents(), StorageError: st.GetStorageError()}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "node:     %s\nleader:   %s\nterm:     %d\nrevision: %d\nvoters:   %s\n", out.Node, out.Leader, out.Term, out.Revision, strings.Join(out.Voters, " "))
					fmt.Fprintf(w, "watch:    %d key changes held, from revision %d\n", out.WatchHistoryEvents, out.WatchCompactRevision+1)
					storage := "ok"
					if out.StorageError != "" {
						storage = out.StorageError
					}
					fmt.Fprintf(w, "storage:  %s\n", storage)
				})
			})
		},
	}
}

// names joins the names listed, saying how many more there are.
func names(listed []string, count uint32) string {
	s := strings.Join(listed, " ")
	if n := int(count) - len(listed); n > 0 {
		s += fmt.Sprintf(" ...%d more", n)
	}
	return s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
