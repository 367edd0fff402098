package cli

import (
	"context"
	"fmt"
	"io"

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
}

type membersJSON struct {
	Members []memberJSON `json:"members"`
}

func (a *app) emitMembers(resp *pb.MemberListResponse) error {
	out := membersJSON{Members: []memberJSON{}}
	for _, m := range resp.GetMembers() {
		out.Members = append(out.Members, memberJSON{ID: m.GetId(), PeerAddr: m.GetPeerAddr(), Voter: m.GetVoter(), Leader: m.GetLeader()})
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
			fmt.Fprintf(w, "%s\t%s\t%s\n", m.ID, m.PeerAddr, role)
		}
	})
}

func (a *app) memberCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "member",
		Short: "List and change the cluster's members",
		Long: `List and change the raft members of a cluster.

JSON: {"members":[{"id","peer_addr","voter","leader"}]}.

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
		Short: "Add a voter (start its server with --peer-listen PEER_ADDR and no --bootstrap-peers first)",
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
	cmd.AddCommand(list, add, remove)
	return cmd
}
