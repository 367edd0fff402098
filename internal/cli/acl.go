package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	pb "github.com/tenure-io/tenure/api/tenurepb"
	"github.com/tenure-io/tenure/client"
	"github.com/tenure-io/tenure/internal/fsm"
)

// ruleJSON is one rule in JSON output.
type ruleJSON struct {
	Kind   string `json:"kind"`
	Prefix string `json:"prefix"`
	Access string `json:"access"`
}

type policyJSON struct {
	Name  string     `json:"name"`
	Rules []ruleJSON `json:"rules"`
}

func policyOut(p *pb.AclPolicy) policyJSON {
	out := policyJSON{Name: p.GetName(), Rules: []ruleJSON{}}
	for _, r := range p.GetRules() {
		out.Rules = append(out.Rules, ruleJSON{Kind: r.GetKind(), Prefix: r.GetPrefix(), Access: r.GetAccess()})
	}
	return out
}

func (p policyJSON) text(w io.Writer) {
	rules := make([]string, len(p.Rules))
	for i, r := range p.Rules {
		rules[i] = r.Kind + ":" + r.Prefix + ":" + r.Access
	}
	fmt.Fprintf(w, "%s\t%s\n", p.Name, strings.Join(rules, " "))
}

// secretJSON is what bootstrap and token create print.
type secretJSON struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

func (a *app) emitSecret(t client.TokenSecret) error {
	return a.emit(secretJSON{ID: t.ID, Secret: t.Secret}, func(w io.Writer) {
		fmt.Fprintf(w, "id:     %s\nsecret: %s\npolicies: %s\n(the secret is shown only now: the service keeps only its hash)\n", t.ID, t.Secret, strings.Join(t.Policies, ", "))
	})
}

func (a *app) aclCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "acl",
		Short: "Policies, auth tokens and certificate identities, and their enforcement",
		Long: `Manage the ACLs of a cluster (docs/security.md).

Once the cluster enforces them (tenure acl bootstrap, tenure acl enable,
or a member started with --auth that leads), every member denies every
request unless a policy of its caller allows it. A policy is a list of rules KIND:PREFIX:ACCESS: KIND is lock (which
covers semaphores, read-write locks and elections), fence, queue, kv,
session or cluster; PREFIX is a name prefix ("" is every name; cluster
rules have none); ACCESS is read, write (which includes read) or deny.
The rule with the longest matching prefix wins; rules of equal prefix
merge, deny first. Tokens carry policies, and so can certificate
identities (the common name or a subject alternative name of a verified
client certificate). A session belongs to the identity that created it.

Changes need cluster write; listings need cluster read. Pass the token
with --auth-token or TENURE_AUTH_TOKEN.`,
	}
	cmd.AddCommand(a.aclBootstrapCommand(), a.aclEnableCommand(), a.aclPolicyCommand(), a.aclTokenCommand(), a.aclIdentityCommand(), a.aclWhoAmICommand())
	return cmd
}

func (a *app) aclBootstrapCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "bootstrap",
		Short: "Create the management token (once per cluster)",
		Long: `Create the policy "management" (write on everything) and a token with it,
and print the token. It runs once per cluster and needs no token; run it
as soon as the cluster is up. JSON: {"id","secret"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				t, err := c.BootstrapACL(ctx)
				if err != nil {
					return err
				}
				return a.emitSecret(t)
			})
		},
	}
}

// enableJSON is what acl enable prints.
type enableJSON struct {
	Enforced bool   `json:"enforced"`
	Changed  bool   `json:"changed"`
	Revision uint64 `json:"revision"`
}

func (a *app) aclEnableCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "enable",
		Short: "Make every member of the cluster enforce the ACLs, for good",
		Long: `Make every member of the cluster enforce the ACLs from now on, whether or
not it was started with --auth. It cannot be undone. On a cluster that does
not enforce them yet it needs no token (anyone who reaches such a cluster
may do anything there); once they are enforced it needs cluster write and
changes nothing. "tenure acl bootstrap" enforces them too, and so does a
member started with --auth once it leads. JSON: {"enforced","changed","revision"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				changed, rev, err := c.EnableACL(ctx)
				if err != nil {
					return err
				}
				out := enableJSON{Enforced: true, Changed: changed, Revision: rev}
				return a.emit(out, func(w io.Writer) {
					if changed {
						fmt.Fprintf(w, "the cluster enforces its ACLs from revision %d on, on every member\n", rev)
						return
					}
					fmt.Fprintln(w, "the cluster enforces its ACLs already")
				})
			})
		},
	}
}

func (a *app) aclPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "policy", Short: "Create, list and delete policies"}
	var rules []string
	var replace bool
	create := &cobra.Command{
		Use:   "create NAME --rule KIND:PREFIX:ACCESS [--rule ...]",
		Short: "Create a policy",
		Long: `Create a policy, for example
  tenure acl policy create jobs --rule lock:jobs/:write --rule kv:config/:read
JSON: {"name","rules":[{"kind","prefix","access"}]}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(rules) == 0 {
				return errors.New("give at least one --rule KIND:PREFIX:ACCESS")
			}
			p := &pb.AclPolicy{Name: args[0]}
			for _, s := range rules {
				r, err := fsm.ParseRule(s)
				if err != nil {
					return err
				}
				p.Rules = append(p.Rules, &pb.AclRule{Kind: string(r.Kind), Prefix: r.Prefix, Access: r.Access.String()})
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.CreatePolicy(ctx, p, replace); err != nil {
					return err
				}
				out := policyOut(p)
				return a.emit(out, out.text)
			})
		},
	}
	create.Flags().StringArrayVar(&rules, "rule", nil, "a rule KIND:PREFIX:ACCESS (repeatable)")
	create.Flags().BoolVar(&replace, "replace", false, "replace the policy of that name if there is one")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the policies",
		Long:  `List the policies by name. JSON: {"policies":[{"name","rules":[{"kind","prefix","access"}]}]}.`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				ps, err := c.Policies(ctx)
				if err != nil {
					return err
				}
				out := struct {
					Policies []policyJSON `json:"policies"`
				}{[]policyJSON{}}
				for _, p := range ps {
					out.Policies = append(out.Policies, policyOut(p))
				}
				return a.emit(out, func(w io.Writer) {
					for _, p := range out.Policies {
						p.text(w)
					}
				})
			})
		},
	}
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a policy no token or identity uses",
		Long:  `Delete a policy; one that a token or identity still uses is refused. JSON: {"deleted"}.`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.DeletePolicy(ctx, args[0]); err != nil {
					return err
				}
				return a.emit(struct {
					Deleted string `json:"deleted"`
				}{args[0]}, func(w io.Writer) { fmt.Fprintf(w, "deleted policy %s\n", args[0]) })
			})
		},
	}
	cmd.AddCommand(create, list, del)
	return cmd
}

func (a *app) aclTokenCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke auth tokens"}
	var policies []string
	var description string
	create := &cobra.Command{
		Use:   "create --policy P [--policy ...]",
		Short: "Create an auth token",
		Long: `Create an auth token carrying the policies and print it; the secret is
shown only now. JSON: {"id","secret"}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(policies) == 0 {
				return errors.New("give at least one --policy")
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				t, err := c.CreateToken(ctx, policies, description)
				if err != nil {
					return err
				}
				return a.emitSecret(t)
			})
		},
	}
	create.Flags().StringArrayVar(&policies, "policy", nil, "a policy the token carries (repeatable)")
	create.Flags().StringVar(&description, "description", "", "what the token is for (shown in the list)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the auth tokens (never their secrets)",
		Long:  `List the auth tokens by id. JSON: {"tokens":[{"id","policies","description","create_revision"}]}.`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				ts, err := c.Tokens(ctx)
				if err != nil {
					return err
				}
				type tokenJSON struct {
					ID             string   `json:"id"`
					Policies       []string `json:"policies"`
					Description    string   `json:"description"`
					CreateRevision uint64   `json:"create_revision"`
				}
				out := struct {
					Tokens []tokenJSON `json:"tokens"`
				}{[]tokenJSON{}}
				for _, t := range ts {
					out.Tokens = append(out.Tokens, tokenJSON{t.GetId(), t.GetPolicies(), t.GetDescription(), t.GetCreateRevision()})
				}
				return a.emit(out, func(w io.Writer) {
					for _, t := range out.Tokens {
						fmt.Fprintf(w, "%s\t%s\t%s\n", t.ID, strings.Join(t.Policies, ","), t.Description)
					}
				})
			})
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "Revoke an auth token",
		Long:  `Revoke an auth token: every request with it is refused from now on. JSON: {"revoked"}.`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.RevokeToken(ctx, args[0]); err != nil {
					return err
				}
				return a.emit(struct {
					Revoked string `json:"revoked"`
				}{args[0]}, func(w io.Writer) { fmt.Fprintf(w, "revoked token %s\n", args[0]) })
			})
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

func (a *app) aclIdentityCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "identity", Short: "Bind certificate identities to policies"}
	var policies []string
	bind := &cobra.Command{
		Use:   "bind NAME --policy P [--policy ...]",
		Short: "Give a client certificate's identity policies",
		Long: `Give the certificate identity NAME (the common name, or a DNS, email,
URI or IP subject alternative name, of a client certificate the server
verifies with --tls-client-ca) policies, replacing those it had. A
request with an auth token is that token's, whatever its certificate.
JSON: {"name","policies"}.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(policies) == 0 {
				return errors.New("give at least one --policy")
			}
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.BindIdentity(ctx, args[0], policies); err != nil {
					return err
				}
				return a.emit(identityJSON{args[0], policies}, func(w io.Writer) {
					fmt.Fprintf(w, "%s\t%s\n", args[0], strings.Join(policies, ","))
				})
			})
		},
	}
	bind.Flags().StringArrayVar(&policies, "policy", nil, "a policy of the identity (repeatable)")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the bound certificate identities",
		Long:  `List the bound certificate identities. JSON: {"identities":[{"name","policies"}]}.`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				ids, err := c.Identities(ctx)
				if err != nil {
					return err
				}
				out := struct {
					Identities []identityJSON `json:"identities"`
				}{[]identityJSON{}}
				for _, id := range ids {
					out.Identities = append(out.Identities, identityJSON{id.GetName(), id.GetPolicies()})
				}
				return a.emit(out, func(w io.Writer) {
					for _, id := range out.Identities {
						fmt.Fprintf(w, "%s\t%s\n", id.Name, strings.Join(id.Policies, ","))
					}
				})
			})
		},
	}
	unbind := &cobra.Command{
		Use:   "unbind NAME",
		Short: "Remove a certificate identity's policies",
		Long:  `Remove a certificate identity's policies. JSON: {"unbound"}.`,
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.UnbindIdentity(ctx, args[0]); err != nil {
					return err
				}
				return a.emit(struct {
					Unbound string `json:"unbound"`
				}{args[0]}, func(w io.Writer) { fmt.Fprintf(w, "unbound %s\n", args[0]) })
			})
		},
	}
	cmd.AddCommand(bind, list, unbind)
	return cmd
}

type identityJSON struct {
	Name     string   `json:"name"`
	Policies []string `json:"policies"`
}

func (a *app) aclWhoAmICommand() *cobra.Command {
	return &cobra.Command{
		Use:   "whoami",
		Short: "Say who the server takes this client for",
		Long:  `Say who the server takes this client for and with which policies. JSON: {"identity","policies","auth"}.`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.unary(cmd, func(ctx context.Context, c *client.Client) error {
				r, err := c.WhoAmI(ctx)
				if err != nil {
					return err
				}
				out := struct {
					Identity string   `json:"identity"`
					Policies []string `json:"policies"`
					Auth     bool     `json:"auth"`
				}{r.GetIdentity(), append([]string{}, r.GetPolicies()...), r.GetAuth()}
				return a.emit(out, func(w io.Writer) {
					fmt.Fprintf(w, "%s\tpolicies: %s\tauth: %v\n", out.Identity, strings.Join(out.Policies, ","), out.Auth)
				})
			})
		},
	}
}
