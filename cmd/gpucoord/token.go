package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpucoord/gpucoord/internal/pki"
	pb "github.com/gpucoord/gpucoord/proto/gpucoordpb"
)

func init() { subcommands = append(subcommands, newTokenCmd, newGossipKeyCmd) }

// adminTarget is what every admin command (token, gossip-key) needs: the
// coordinators and an admin identity.
type adminTarget struct {
	coordinator string
	auth        authFlags
}

func (t *adminTarget) register(c *cobra.Command) {
	c.Flags().StringVar(&t.coordinator, "coordinator", "", "coordinator addresses, comma-separated (the first that answers)")
	t.auth.register(c)
}

// call runs f against the first coordinator that answers, as an admin.
func (t *adminTarget) call(ctx context.Context, f func(context.Context, pb.CoordinatorClient) error) error {
	if t.coordinator == "" {
		return usageError(errors.New("needs --coordinator ADDR"))
	}
	addrs := strings.Split(t.coordinator, ",")
	creds, err := t.auth.clientCredentials(ctx, addrs, pki.RoleAdmin)
	if err != nil {
		return err
	}
	if creds == nil {
		return usageError(errors.New("join tokens need a coordinator that serves TLS (started with --token-file or --tls-*), and an admin credential: --token-file with the coordinator's bootstrap token, or an admin token"))
	}
	var errs []error
	for _, addr := range addrs {
		cc, err := pb.Dial(addr, creds, t.auth.connectTimeout)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = f(cctx, pb.NewCoordinatorClient(cc))
		cancel()
		cc.Close()
		if err == nil {
			return nil
		}
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded:
			errs = append(errs, fmt.Errorf("%s: %s", addr, status.Convert(err).Message()))
		default:
			return fmt.Errorf("coordinator %s: %s", addr, status.Convert(err).Message())
		}
	}
	return fmt.Errorf("no coordinator answered: %w", errors.Join(errs...))
}

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token create|list|revoke",
		Short: "Manage join tokens: what agents and users show to obtain their certificates",
		Long: `A join token lets its holder obtain a certificate from the cluster once: an
agent for its node (role node), a user for launch and status (role client),
an operator for these commands (role admin). It carries a hash of the
cluster CA, so that its holder checks the coordinator before it sends the
token's secret. The coordinator's --token-file holds a token good for every
role; these commands, run with it (or another admin token), make more,
list them and revoke them. A revoked or expired token buys nothing more;
certificates it bought stay valid.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newTokenCreateCmd(), newTokenListCmd(), newTokenRevokeCmd())
	return cmd
}

func newTokenCreateCmd() *cobra.Command {
	var t adminTarget
	var ttl time.Duration
	var roles, description string
	cmd := &cobra.Command{
		Use:   "create --coordinator ADDR --token-file ADMIN_TOKEN [--ttl 24h] [--roles node,client]",
		Short: "Make a join token and print it (only this once)",
		Example: `  gpucoord token create --coordinator coord-0:7070 --token-file /etc/gpucoord/token > node.token
  gpucoord token create --coordinator coord-0:7070 --token-file /etc/gpucoord/token --roles client --ttl 8h`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			rs, err := pki.ParseRoles(roles)
			if err != nil {
				return usageError(fmt.Errorf("--roles: %w", err))
			}
			if ttl < 0 {
				return usageError(fmt.Errorf("--ttl %s: want 0 (no expiry) or more", ttl))
			}
			return t.call(c.Context(), func(ctx context.Context, cl pb.CoordinatorClient) error {
				resp, err := cl.CreateToken(ctx, &pb.CreateTokenRequest{TtlSeconds: int64((ttl + time.Second - 1) / time.Second), Roles: rs, Description: description})
				if err != nil {
					return err
				}
				fmt.Fprintln(c.OutOrStdout(), resp.Token)
				fmt.Fprintf(c.ErrOrStderr(), "token %s: roles %s, %s\n", resp.Info.Id, strings.Join(resp.Info.Roles, ","), expiry(resp.Info.ExpiresUnixMs))
				return nil
			})
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token works; 0 for no expiry")
	cmd.Flags().StringVar(&roles, "roles", "node,client", "roles the token may join as: node, client, admin, comma-separated")
	cmd.Flags().StringVar(&description, "description", "", "a note shown by token list")
	t.register(cmd)
	return cmd
}

func expiry(ms int64) string {
	if ms == 0 {
		return "does not expire"
	}
	return "expires " + time.UnixMilli(ms).UTC().Format(time.RFC3339)
}

func newTokenListCmd() *cobra.Command {
	var t adminTarget
	cmd := &cobra.Command{
		Use:   "list --coordinator ADDR --token-file ADMIN_TOKEN",
		Short: "List the join tokens (ids, roles, expiry; never their secrets)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return t.call(c.Context(), func(ctx context.Context, cl pb.CoordinatorClient) error {
				resp, err := cl.ListTokens(ctx, &pb.ListTokensRequest{})
				if err != nil {
					return err
				}
				printTokens(c.OutOrStdout(), resp.Tokens)
				return nil
			})
		},
	}
	t.register(cmd)
	return cmd
}

func printTokens(w io.Writer, tokens []*pb.TokenInfo) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROLES\tCREATED\tEXPIRES\tDESCRIPTION")
	for _, t := range tokens {
		exp := "never"
		if t.ExpiresUnixMs != 0 {
			exp = time.UnixMilli(t.ExpiresUnixMs).UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.Id, strings.Join(t.Roles, ","), time.UnixMilli(t.CreatedUnixMs).UTC().Format(time.RFC3339), exp, t.Description)
	}
	tw.Flush()
}

func newTokenRevokeCmd() *cobra.Command {
	var t adminTarget
	cmd := &cobra.Command{
		Use:   "revoke ID --coordinator ADDR --token-file ADMIN_TOKEN",
		Short: "Revoke a join token: no one obtains a certificate with it again",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			return t.call(c.Context(), func(ctx context.Context, cl pb.CoordinatorClient) error {
				if _, err := cl.RevokeToken(ctx, &pb.RevokeTokenRequest{Id: args[0]}); err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "token %s revoked\n", args[0])
				return nil
			})
		},
	}
	t.register(cmd)
	return cmd
}

func newGossipKeyCmd() *cobra.Command {
	var t adminTarget
	cmd := &cobra.Command{
		Use:   "gossip-key install|use|remove|list --coordinator ADDR --token-file ADMIN_TOKEN",
		Short: "Rotate the gossip pools' key without a restart, one step at a time",
		Long: `The gossip pools (failure detection, one per failure domain) are
encrypted with a key the coordinators keep in etcd and hand to agents. A
rotation takes three steps; let every agent take each one (its next
assignment brings it, within a second) before the next:

  install  a new key that every member accepts, and none sends with yet
  use      send with the new key (the old one is still accepted)
  remove   accept only the new key

A member that missed a step (an agent cut off meanwhile) cannot talk to
the pool after "use"; it is taken for dead and its node leaves the job
until its agent reconnects and registers again. list prints the keys'
fingerprints, never the keys.`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"install", "use", "remove", "list"},
		RunE: func(c *cobra.Command, args []string) error {
			switch args[0] {
			case "install", "use", "remove", "list":
			default:
				return usageError(fmt.Errorf("gossip-key %q: want install, use, remove or list", args[0]))
			}
			return t.call(c.Context(), func(ctx context.Context, cl pb.CoordinatorClient) error {
				resp, err := cl.GossipKeys(ctx, &pb.GossipKeysRequest{Action: args[0]})
				if err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "gossip keys (in use first): %s\n", strings.Join(resp.Fingerprints, ", "))
				return nil
			})
		},
	}
	t.register(cmd)
	return cmd
}
