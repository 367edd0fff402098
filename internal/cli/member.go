package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
)

// memberJSON is one member in `tenure member ... -o json`. The health
// fields are the leader's view; null when a follower answered (it does
// not watch its peers).
type memberJSON struct {
	ID            string  `json:"id"`
	PeerAddr      string  `json:"peer_addr"`
	Voter         bool    `json:"voter"`
	Leader        bool    `json:"leader"`
	Reachable     *bool   `json:"reachable"`
	LastContactMs *int64  `json:"last_contact_ms"`
	MatchIndex    *uint64 `json:"match_index"`
	Lag           *uint64 `json:"lag"`
	// Protocol is the format version the member speaks (1: a release
	// before versions; 0: it did not answer); Version its release.
	Protocol uint32 `json:"protocol"`
	Version  string `json:"version"`
}

type membersJSON struct {
	// View is the leader whose view the health fields give; "" when a
	// follower answered.
	View    string       `json:"view"`
	Members []memberJSON `json:"members"`
}

func (a *app) emitMembers(resp *pb.MemberListResponse) error {
	out := membersJSON{View: resp.GetView(), Members: []memberJSON{}}
	for _, m := range resp.GetMembers() {
		j := memberJSON{ID: m.GetId(), PeerAddr: m.GetPeerAddr(), Voter: m.GetVoter(), Leader: m.GetLeader(), Protocol: m.GetProtocol(), Version: m.GetVersion()}
		if out.View != "" {
			reachable, contact, match, lag := m.GetReachable(), m.GetLastContactMs(), m.GetMatchIndex(), m.GetLag()
			j.Reachable, j.LastContactMs, j.MatchIndex, j.Lag = &reachable, &contact, &match, &lag
		}
		out.Members = append(out.Members, j)
	}
	return a.emit(out, func(w io.Writer) {
		for _, m := range out.Members {
			role := "voter"
			if !m.Voter {
				role = "non-voter"
			}
			if m.Leader {
				role += ", leader"
			}
			health := ""
			switch {
			case m.Reachable == nil:
			case m.Leader:
				health = fmt.Sprintf("\tmatch index %d", *m.MatchIndex)
			case *m.Reachable:
				health = fmt.Sprintf("\treachable, last contact %s ago, match index %d, lag %d", time.Duration(*m.LastContactMs)*time.Millisecond, *m.MatchIndex, *m.Lag)
			default:
				health = fmt.Sprintf("\tUNREACHABLE, last contact %s ago, match index %d, lag %d", time.Duration(*m.LastContactMs)*time.Millisecond, *m.MatchIndex, *m.Lag)
			}
			fmt.Fprintf(w, "%s\t%s\t%s%s\t%s\n", m.ID, m.PeerAddr, role, health, memberVersion(m))
		}
		if out.View == "" && len(out.Members) > 0 {
			fmt.Fprintln(w, "(answered by a follower, which does not watch its peers: ask the leader for their reachability and lag)")
		}
	})
}

// memberVersion is a member's version as `member list` prints it.
func memberVersion(m memberJSON) string {
	switch {
	case m.Protocol == 0:
		return "version unknown (no answer)"
	case m.Version == "":
		return fmt.Sprintf("protocol %d", m.Protocol)
	}
	return fmt.Sprintf("protocol %d (%s)", m.Protocol, m.Version)
}

func (a *app) memberCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List and change the cluster's members",
		Long: `List and change the raft members of a cluster.

JSON: {"view","members":[{"id","peer_addr","voter","leader","reachable",
"last_contact_ms","match_index","lag","protocol","version"}]}. The health
fields are the leader's view, which view names: reachable is whether the
member answered the leader's heartbeat within the last few election
timeouts, last_contact_ms the time since it last did, match_index the last
log index it reported and lag the entries it is behind the leader's last
one. A follower does not watch its peers: when one answers, view is "" and
the health fields are null (ask the leader). protocol is the format version
the member reports over its peer address (1 for a release before versions,
0 when it did not answer), version its release; what a member reported is
reused for up to 5 seconds (1 second for an older protocol or no answer).

A change is refused, --force or not, if it would leave fewer reachable
voters than a majority of the voters before it (for an add, also of the
voters after it); the leader asks every voter first. A new voter's peer
address must answer before anything changes (the leader waits for it up
to --timeout): it joins as a non-voter and becomes a voter once it holds
the whole log (if it is still catching up when the request ends it stays a
non-voter; add it again later).

A change that leaves an even number of voters is refused unless --force:
an even number tolerates no more failures than one voter fewer, yet needs
a larger quorum. --force overrides only that.`,
	}
	var force bool
	var addTimeout time.Duration
	add := &cobra.Command{
		Use:   "add ID PEER_ADDR",
		Short: "Add a voter (start its server with --peer-listen PEER_ADDR --join first)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, addTimeout, func(ctx context.Context, c *client.Client) error {
				resp, err := c.AddMember(ctx, args[0], args[1], force)
				if err != nil {
					return err
				}
				return a.emitMembers(resp)
			})
		},
	}
	add.Flags().BoolVar(&force, "force", false, "allow an even number of voters (nothing else)")
	add.Flags().DurationVar(&addTimeout, "timeout", time.Minute, "how long the new member may take to answer (nothing changes before it does) and to receive the log")
	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "Remove a member (refused if the reachable voters left would be no majority)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.RemoveMember(ctx, args[0], force)
				if err != nil {
					return err
				}
				return a.emitMembers(resp)
			})
		},
	}
	remove.Flags().BoolVar(&force, "force", false, "allow an even number of voters (nothing else)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the members",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.Members(ctx)
				if err != nil {
					return err
				}
				if resp.GetView() == "" {
					resp = a.leaderMembers(ctx, resp)
				}
				return a.emitMembers(resp)
			})
		},
	}
	transfer := &cobra.Command{
		Use:   "transfer-leadership [ID]",
		Short: "Hand leadership to another voter (ID, or the most up to date one)",
		Long: `Ask the leader to hand leadership to the voter ID, or without one to
the most up to date voter, and wait until it has. Holds and sessions carry
over as in any leader change. Use it before stopping the leader for
maintenance; tenure serve does it by itself when it is stopped with
SIGTERM or SIGINT while it leads.

JSON: {"leader"}: the member that leads afterwards.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := ""
			if len(args) == 1 {
				id = args[0]
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				leader, err := c.TransferLeadership(ctx, id)
				if err != nil {
					return err
				}
				return a.emit(struct {
					Leader string `json:"leader"`
				}{leader}, func(w io.Writer) { fmt.Fprintf(w, "leader: %s\n", leader) })
			})
		},
	}
	var rebuildTimeout time.Duration
	rebuild := &cobra.Command{
		Use:   "rebuild ID PEER_ADDR",
		Short: "Rebuild a member whose data was lost from its peers (start it with --peer-listen PEER_ADDR --join on an empty data dir first)",
		Long: `Rebuild member ID, whose data directory was lost or damaged, from the
other members. First move its data directory aside and start it again on an
empty one with "tenure serve --node-id ID --peer-listen PEER_ADDR --join".
Then run this against the cluster. The leader waits (up to --timeout) until
the member answers at PEER_ADDR and changes nothing before: a rebuild run
before the member listens fails after --timeout with the configuration
untouched. Then it removes ID's old entry from the configuration (a voter
that has forgotten its log and its vote must not count for a quorum), and
adds it back the way "member add" does: as a non-voter that receives the
log and is made a voter only once it holds all of it. The number of voters
ends where it began.

Running it again after an interruption is safe: a member that is already a
non-voter (or absent) is not removed again but added, and promoted once it
has caught up.

JSON: as member list, after the change.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, rebuildTimeout, func(ctx context.Context, c *client.Client) error {
				resp, err := c.RebuildMember(ctx, args[0], args[1], force)
				if err != nil {
					return err
				}
				if resp.GetView() == "" {
					// Every leader that knows rebuild names itself in the
					// answer; an older one took the request for a plain
					// add, which changes only a voter's address.
					return fmt.Errorf("the answer names no leader's view: the leader may run an older version that does not know member rebuild and took it for a plain add, which removes nothing; check member list (%s must not stay a voter on an empty data directory): upgrade the leader first, or run member remove %s --force and then member add %s %s", args[0], args[0], args[0], args[1])
				}
				return a.emitMembers(resp)
			})
		},
	}
	rebuild.Flags().BoolVar(&force, "force", false, "allow an even number of voters when ID was not a voter before (nothing else)")
	rebuild.Flags().DurationVar(&rebuildTimeout, "timeout", 5*time.Minute, "how long the member may take to answer (nothing changes before it does) and to receive the log")
	cmd.AddCommand(list, add, remove, transfer, rebuild)
	return cmd
}

// leaderMembers asks each of the endpoints given (when there are several)
// for the member list until one answers with the leader's view; resp, a
// follower's answer, when none does.
func (a *app) leaderMembers(ctx context.Context, resp *pb.MemberListResponse) *pb.MemberListResponse {
	eps := strings.Split(a.endpoint, ",")
	if len(eps) < 2 {
		return resp
	}
	opts, err := a.security.options()
	if err != nil {
		return resp
	}
	for _, ep := range eps {
		c, err := client.Dial(ctx, strings.TrimSpace(ep), opts...)
		if err != nil {
			continue
		}
		r, err := c.Members(ctx)
		c.Close()
		if err == nil && r.GetView() != "" {
			return r
		}
	}
	return resp
}
