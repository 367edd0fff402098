package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/version"
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
	// TimeLeftMs: until the session expires without a keepalive, on the
	// leader's clock; null when a follower answered.
	TimeLeftMs *int64 `json:"time_left_ms"`
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

time_left_ms is how long the session has before it expires unless a
keepalive arrives, on the leader's clock (null when a follower answered,
with --consistency serializable).

JSON: {"sessions":[{"id","owner","ttl_ms","held":[..],"waiting":[..],
"held_count","waiting_count","time_left_ms"}],"revision"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.listing(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Sessions(ctx)
				if err != nil {
					return err
				}
				out := sessionListJSON{Sessions: make([]sessionJSON, 0, len(resp.GetSessions())), Revision: resp.GetRevision()}
				for _, s := range resp.GetSessions() {
					sj := sessionJSON{
						ID: s.GetId(), Owner: s.GetOwner(), TTLMs: s.GetTtlMs(),
						Held: nonNil(s.GetHeld()), Waiting: nonNil(s.GetWaiting()),
						HeldCount: s.GetHeldCount(), WaitingCount: s.GetWaitingCount(),
					}
					if left := s.GetTimeLeftMs(); left >= 0 {
						sj.TimeLeftMs = &left
					}
					out.Sessions = append(out.Sessions, sj)
				}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "%d sessions\n", len(out.Sessions))
					for _, s := range out.Sessions {
						left := "?"
						if s.TimeLeftMs != nil {
							left = (time.Duration(*s.TimeLeftMs) * time.Millisecond).String()
						}
						fmt.Fprintf(w, "  %d  %s  ttl %dms  left %s  held [%s]  waiting [%s]\n", s.ID, s.Owner, s.TTLMs, left, names(s.Held, s.HeldCount), names(s.Waiting, s.WaitingCount))
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
	CommitIndex  uint64   `json:"commit_index"`
	// Ready: the node knows a leader, has applied what is committed and
	// its storage accepts a write (/readyz); NotReady says why not.
	Ready    bool   `json:"ready"`
	NotReady string `json:"not_ready"`
	// Version is the server's release; Protocol the newest format
	// version it speaks, MinProtocol the oldest cluster version it serves
	// in, ClusterVersion the one the cluster writes now (below Protocol
	// until every voter speaks it: docs/operations.md).
	Version        string `json:"version"`
	Protocol       uint32 `json:"protocol"`
	MinProtocol    uint32 `json:"min_protocol"`
	ClusterVersion uint32 `json:"cluster_version"`
	// The node's watch history (docs/kv.md).
	WatchCompactRevision uint64 `json:"watch_compact_revision"`
	WatchHistoryEvents   uint64 `json:"watch_history_events"`
	// StorageError: why the node's last write to its disk failed; "" when
	// it succeeded.
	StorageError string `json:"storage_error"`
	// Degraded: on the leader, the members that do not answer its
	// heartbeat ("n3 unreachable"); "" when all do, and on a follower.
	Degraded string `json:"degraded"`
}

func (a *app) statusCommand() *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "status [--wait D]",
		Short: "Show the server's view: node, leader, term, revision, readiness, version",
		Long: `Show the server's view of the cluster.

With --wait D, wait until the node is ready (it knows a leader, has
applied everything committed and its storage accepts a write) and then
show it; after D without that, exit 5 (timeout).

JSON: {"node","leader","term","revision","voters":[..],"applied_index",
"commit_index","ready","not_ready","version","protocol","min_protocol",
"cluster_version","watch_compact_revision","watch_history_events",
"storage_error","degraded"}: protocol is the newest format version the server speaks,
min_protocol the oldest cluster version it serves in, cluster_version the
one the cluster writes now (raised to the voters' oldest protocol once
every voter reports it: docs/operations.md); not_ready says why the node is not
ready ("" when it is); the node's watch history holds watch_history_events
key changes, every one after watch_compact_revision; storage_error is why
the node's last write to its disk failed ("storage full on node X: ..."),
"" when it succeeded; degraded, on the leader, names the members that do
not answer its heartbeat ("n3 unreachable"), "" when all do and on a
follower (which does not watch its peers). A degraded cluster that keeps a
quorum is still ready.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if wait < 0 {
				return fmt.Errorf("--wait must not be negative, not %s", wait)
			}
			timeout := requestTimeout
			if wait > 0 {
				timeout = wait
			}
			return a.call(cmd, timeout, func(ctx context.Context, c *client.Client) error {
				st, err := c.Status(ctx)
				for wait > 0 && (err != nil || !st.GetReady()) {
					poll := time.NewTimer(statusPoll)
					select {
					case <-ctx.Done():
						poll.Stop()
						why := "it did not answer"
						if err == nil {
							why = st.GetNotReady()
						} else {
							why += ": " + err.Error()
						}
						return fmt.Errorf("the node was not ready after %s (%s): %w", wait, why, context.DeadlineExceeded)
					case <-poll.C:
					}
					st, err = c.Status(ctx)
				}
				if err != nil {
					return err
				}
				out := statusJSON{Node: st.GetNode(), Leader: st.GetLeader(), Term: st.GetTerm(), Revision: st.GetRevision(), Voters: nonNil(st.GetVoters()), AppliedIndex: st.GetAppliedIndex(),
					CommitIndex: st.GetCommitIndex(), Ready: st.GetReady(), NotReady: st.GetNotReady(), Version: st.GetVersion(),
					Protocol: st.GetProtocol(), MinProtocol: st.GetMinProtocol(), ClusterVersion: max(st.GetClusterVersion(), 1),
					WatchCompactRevision: st.GetWatchCompactRevision(), WatchHistoryEvents: st.GetWatchHistoryEvents(), StorageError: st.GetStorageError(), Degraded: st.GetDegraded()}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "node:     %s\nleader:   %s\nterm:     %d\nrevision: %d\nvoters:   %s\n", out.Node, out.Leader, out.Term, out.Revision, strings.Join(out.Voters, " "))
					ready := "yes"
					if !out.Ready {
						ready = "no (" + out.NotReady + ")"
					}
					if out.Degraded != "" {
						ready += " (degraded: " + out.Degraded + ")"
					}
					fmt.Fprintf(w, "applied:  %d of %d committed\nready:    %s\nversion:  %s\n", out.AppliedIndex, out.CommitIndex, ready, out.Version)
					fmt.Fprintf(w, "protocol: %d (serves in clusters of version %d or newer); cluster version %d\n", out.Protocol, out.MinProtocol, out.ClusterVersion)
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
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait up to this long for the node to be ready (exit 5 if it is not)")
	return cmd
}

// statusPoll is how often status --wait asks again.
const statusPoll = 100 * time.Millisecond

// versionJSON is `tenure version -o json`.
type versionJSON struct {
	Version string `json:"version"`
	Go      string `json:"go"`
	// Protocol is the newest format version this build speaks;
	// MinProtocol the oldest cluster version it serves in.
	Protocol    uint32 `json:"protocol"`
	MinProtocol uint32 `json:"min_protocol"`
}

func (a *app) versionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show this build's version",
		Long: `Show this build's version (the server's is in tenure status).

JSON: {"version","go","protocol","min_protocol"}: protocol is the newest
format version this build speaks, min_protocol the oldest cluster version
it serves in (docs/operations.md, "Upgrading").`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := versionJSON{Version: version.String(), Go: version.Go(), Protocol: version.Protocol, MinProtocol: version.MinProtocol}
			return a.emit(out, func(w io.Writer) {
				fmt.Fprintf(w, "tenure %s (%s), protocol %d, serves in clusters of version %d or newer\n", out.Version, out.Go, out.Protocol, out.MinProtocol)
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
