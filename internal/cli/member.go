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

// memberJSON is one member in `tenure member ... -o json`.
type memberJSON struct {
	ID       string `json:"id"`
	PeerAddr string `json:"peer_addr"`
	Voter    bool   `json:"voter"`
	Leader   bool   `json:"leader"`
	// Protocol is the format version the member speaks (1: a release
	// before versions; 0: it did not answer); Version its release.
	Protocol uint32 `json:"protocol"`
	Version  string `json:"version"`
}

type membersJSON struct {
	Members []memberJSON `json:"members"`
}

func (a *app) emitMembers(resp *pb.MemberListResponse) error {
	out := membersJSON{Members: []memberJSON{}}
	for _, m := range resp.GetMembers() {
		out.Members = append(out.Members, memberJSON{ID: m.GetId(), PeerAddr: m.GetPeerAddr(), Voter: m.GetVoter(), Leader: m.GetLeader(), Protocol: m.GetProtocol(), Version: m.GetVersion()})
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
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", m.ID, m.PeerAddr, role, memberVersion(m))
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

JSON: {"members":[{"id","peer_addr","voter","leader","protocol","version"}]}:
protocol is the format version the member reports over its peer address
(1 for a release before versions, 0 when it did not answer), version its
release; what a member reported is reused for up to 5 seconds (1 second
for an older protocol or no answer).

A change is refused, --force or not, if it would leave fewer reachable
voters than a majority of the voters before it (for an add, also of the
voters after it); the leader asks every voter first. A new voter's peer
address must answer before anything changes: it joins as a non-voter and
becomes a voter once it holds the whole log (if it is still catching up
when the request ends it stays a non-voter; add it again later).

A change that leaves an even number of voters is refused unless --force:
an even number tolerates no more failures than one voter fewer, yet needs
a larger quorum. --force overrides only that.`,
	}
	var force bool
	add := &cobra.Command{
		Use:   "add ID PEER_ADDR",
		Short: "Add a voter (start its server with --peer-listen PEER_ADDR --join first)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				resp, err := c.AddMember(ctx, args[0], args[1], force)
				if err != nil {
					return err
				}
				return a.emitMembers(resp)
			})
		},
	}
	add.Flags().BoolVar(&force, "force", false, "allow an even number of voters (nothing else)")
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
Then run this against the cluster: it removes ID's old entry from the
configuration (a voter that has forgotten its log and its vote must not
count for a quorum), then adds it back the way "member add" does: as a
non-voter that receives the log and is made a voter only once it holds all
of it. The number of voters ends where it began.

Running it again after an interruption is safe: a member that is already a
non-voter is not removed again but promoted once it has caught up.

JSON: {"members":[{"id","peer_addr","voter","leader"}]}, after the change.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd, rebuildTimeout, func(ctx context.Context, c *client.Client) error {
				resp, err := rebuildMember(ctx, c, args[0], args[1], force)
				if err != nil {
					return err
				}
				return a.emitMembers(resp)
			})
		},
	}
	rebuild.Flags().BoolVar(&force, "force", false, "allow an even number of voters when ID was not a voter before (nothing else)")
	rebuild.Flags().DurationVar(&rebuildTimeout, "timeout", 5*time.Minute, "how long the member may take to receive the log")
	cmd.AddCommand(list, add, remove, transfer, rebuild)
	return cmd
}

// rebuildMember removes voter id from the configuration, if it is one,
// and adds it back at peerAddr through the add path: a non-voter first,
// promoted once it holds the log. The removal passes force because the add
// restores the number of voters; force applies to the add only when id was
// not a voter.
func rebuildMember(ctx context.Context, c *client.Client, id, peerAddr string, force bool) (*pb.MemberListResponse, error) {
	ms, err := c.Members(ctx)
	if err != nil {
		return nil, err
	}
	removed := false
	for _, m := range ms.GetMembers() {
		if m.GetId() != id || !m.GetVoter() {
			continue
		}
		if _, err := c.RemoveMember(ctx, id, true); err != nil {
			return nil, stepError{"removing " + id + "'s old entry", err}
		}
		removed, force = true, true
	}
	resp, err := c.AddMember(ctx, id, peerAddr, force)
	if err != nil {
		step := "adding " + id + " at " + peerAddr
		if removed {
			step += " (its old entry is removed; run member rebuild again once it answers)"
		}
		return nil, stepError{step, err}
	}
	return resp, nil
}

// stepError names the step of a command that failed; errors.Is sees err.
type stepError struct {
	step string
	err  error
}

func (e stepError) Error() string {
	return e.step + ": " + strings.TrimPrefix(e.err.Error(), "tenure: ")
}

func (e stepError) Unwrap() error { return e.err }
