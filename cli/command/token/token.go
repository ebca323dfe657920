// Package token is `gpujob token`: the bearer tokens the gpujob gateway
// asks of a service's callers, stored hashed in Consul KV.
package token

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/servestore"
	"github.com/gpujob/gpujob/internal/servekv"
)

// NewCmd returns the token command and its subcommands.
func NewCmd(f *factory.Factory) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "token",
		Short: "Create, list and revoke a service's bearer tokens",
		Long: `A service whose route has auth = true (the default) answers only requests
with "Authorization: Bearer <token>" carrying one of its tokens. Tokens are
stored in Consul KV as the SHA-256 of the secret: the secret is shown once,
by create, and kept nowhere. Revoking takes effect at every gateway within a
second. A token may carry its own rate limit, instead of the route's.`,
		Example: `  gpujob token create --service bert-clf --name ci
  gpujob token create --service bert-clf --rps 100 --burst 200 -json
  gpujob token list --service bert-clf
  gpujob token revoke --service bert-clf 1a2b3c4d5e6f`,
	}
	cmd.AddCommand(newCreateCmd(f), newListCmd(f), newRevokeCmd(f))
	return cmd
}

func serviceFlag(cmd *cobra.Command, dst *string) {
	cmd.Flags().StringVar(dst, "service", "", "the service's `name` (required)")
	_ = cmd.MarkFlagRequired("service")
}

// Created is create's -json: the only time the secret is shown.
type Created struct {
	Service   string         `json:"service"`
	Namespace string         `json:"namespace"`
	ID        string         `json:"id"`
	Name      string         `json:"name,omitempty"`
	Secret    string         `json:"secret"`
	Limit     *servekv.Limit `json:"rate_limit,omitempty"`
	Created   time.Time      `json:"created"`
}

func newCreateCmd(f *factory.Factory) *cobra.Command {
	var svc, name string
	var rps float64
	var burst int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "create --service NAME",
		Short: "Create a token and print its secret (shown only now)",
		Example: `  gpujob token create --service bert-clf --name ci
  gpujob token create --service bert-clf --rps 100 --burst 200 -json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var limit *servekv.Limit
			switch {
			case rps < 0 || burst < 0:
				return fmt.Errorf("--rps and --burst must be positive")
			case rps > 0:
				limit = &servekv.Limit{RPS: rps, Burst: burst}
				if burst == 0 {
					limit.Burst = max(1, int(rps+0.999))
				}
			case burst > 0:
				return fmt.Errorf("--burst needs --rps")
			}
			store, err := servestore.Open(f)
			if err != nil {
				return err
			}
			ns := f.Namespace()
			ctx := cmd.Context()
			r, err := store.Route(ctx, ns, svc)
			if err != nil {
				return err
			}
			if r == nil {
				return fmt.Errorf("service %s/%s has no route in Consul: deploy it first (gpujob service deploy)", ns, svc)
			}
			secret, tok, err := store.CreateToken(ctx, ns, svc, name, limit, f.Now())
			if err != nil {
				return err
			}
			if asJSON {
				return gpujobs.PrintJSON(f.IO.Out, Created{Service: svc, Namespace: ns, ID: tok.ID, Name: tok.Name,
					Secret: secret, Limit: tok.Limit, Created: tok.Created})
			}
			fmt.Fprintf(f.IO.ErrOut, "created token %s for %s/%s; its secret is shown only now:\n", tok.ID, ns, svc)
			fmt.Fprintln(f.IO.Out, secret)
			return nil
		},
	}
	serviceFlag(cmd, &svc)
	cmd.Flags().StringVar(&name, "name", "", "a `label` for the token (who holds it)")
	cmd.Flags().Float64Var(&rps, "rps", 0, "the token's own rate limit, requests per second (default: the route's)")
	cmd.Flags().IntVar(&burst, "burst", 0, "the token's burst (default: --rps rounded up)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func newListCmd(f *factory.Factory) *cobra.Command {
	var svc string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list --service NAME",
		Short: "List a service's tokens (never their secrets)",
		Example: `  gpujob token list --service bert-clf
  gpujob token list --service bert-clf -json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := servestore.Open(f)
			if err != nil {
				return err
			}
			toks, err := store.Tokens(cmd.Context(), f.Namespace(), svc)
			if err != nil {
				return err
			}
			if asJSON {
				list := make([]servekv.Token, 0, len(toks))
				for _, t := range toks {
					list = append(list, t.Token)
				}
				return gpujobs.PrintJSON(f.IO.Out, list)
			}
			if len(toks) == 0 {
				fmt.Fprintf(f.IO.Out, "service %s has no tokens: gpujob token create --service %s\n", svc, svc)
				return nil
			}
			t := gpujobs.NewTable(f.IO.Out, "ID", "NAME", "RATE LIMIT", "CREATED")
			for _, tok := range toks {
				limit := "route's"
				if tok.Limit != nil {
					limit = fmt.Sprintf("%g/s burst %d", tok.Limit.RPS, tok.Limit.Burst)
				}
				t.Row(tok.ID, tok.Name, limit, tok.Created.Format(time.RFC3339))
			}
			return t.Flush()
		},
	}
	serviceFlag(cmd, &svc)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print as JSON")
	return cmd
}

func newRevokeCmd(f *factory.Factory) *cobra.Command {
	var svc string
	cmd := &cobra.Command{
		Use:     "revoke --service NAME ID",
		Short:   "Revoke a token: every gateway refuses it within a second",
		Example: `  gpujob token revoke --service bert-clf 1a2b3c4d5e6f`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			store, err := servestore.Open(f)
			if err != nil {
				return err
			}
			tok, err := store.RevokeToken(cmd.Context(), f.Namespace(), svc, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(f.IO.Out, "revoked token %s of %s\n", tok.ID, svc)
			return nil
		},
	}
	serviceFlag(cmd, &svc)
	return cmd
}
