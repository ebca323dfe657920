package queue

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/taskcreds"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/queue/nomadseam"
)

// ControllerOptions is what `queue controller`'s flags ask for.
type ControllerOptions struct {
	// ID names this controller in the leader key; default the Nomad
	// allocation it runs in (NOMAD_ALLOC_ID), else host and process.
	ID string
	// Resync is the longest time between two rounds (0: the controller's
	// default).
	Resync time.Duration
}

func newControllerCmd(f *factory.Factory) *cobra.Command { return NewControllerCmd(f, nil) }

// NewControllerCmd is the command running runF instead when runF is not
// nil: a test checks the Options the flags parse into without running.
func NewControllerCmd(f *factory.Factory, runF func(context.Context, *ControllerOptions) error) *cobra.Command {
	o := &ControllerOptions{}
	cmd := &cobra.Command{
		Use:   "controller",
		Short: "Run the queue's admission controller (what its Nomad job runs; not for people)",
		Long: `Controller admits queued jobs until SIGTERM: one controller of those running
leads (a Consul election on gpujob/queues/state/leader) and starts queued gangs
whole, preempts for them and writes why the rest wait. On SIGTERM it resigns,
so that a standby leads at once. gpujob queue apply runs it as the Nomad job
gpujob-queue-controller.

It reaches Consul with CONSUL_HTTP_ADDR and friends and Nomad with NOMAD_ADDR
and friends; in its job on a cluster with ACLs or TLS ($` + render.EnvQueueControllerSecrets + ` set)
it reads its tokens and Consul's TLS material from that Nomad variable with its
workload identity, and reaches Nomad through its Task API socket.`,
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if o.ID == "" {
				o.ID = defaultControllerID()
			}
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runController(ctx, f, o) })
		},
	}
	cmd.Flags().StringVar(&o.ID, "id", "", "this controller's `name` in the leader key (default $NOMAD_ALLOC_ID, else host:pid)")
	cmd.Flags().DurationVar(&o.Resync, "resync", 0, "the longest `time` between two rounds (default 30s)")
	return cmd
}

// defaultControllerID is the allocation the controller runs in: the leader
// key then names what `nomad alloc status` shows.
func defaultControllerID() string {
	if id := os.Getenv("NOMAD_ALLOC_ID"); id != "" {
		return id
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

func runController(ctx context.Context, f *factory.Factory, o *ControllerOptions) error {
	logger := log.New(f.IO.ErrOut, "gpujob queue controller: ", log.LstdFlags)
	cc, nc, from, err := controllerClients(f)
	if err != nil {
		return err
	}
	logger.Printf("%s starting (Nomad at %s, credentials from %s)", o.ID, nc.Address(), from)
	c := &admit.Controller{Consul: cc, Nomad: nomadseam.New(nc), ID: o.ID, Resync: o.Resync, Logf: logger.Printf, Now: f.Now}
	err = c.Run(ctx)
	if err == nil {
		logger.Printf("%s stopped (leadership resigned)", o.ID)
	}
	return err
}

// controllerClients are the controller's Consul and Nomad: from its
// variable when its job says so (taskcreds, as the gateways and exporters
// get theirs), else the environment's.
func controllerClients(f *factory.Factory) (*consul.Client, *nomad.Client, string, error) {
	path := os.Getenv(render.EnvQueueControllerSecrets)
	if path == "" {
		cc, err := f.Consul()
		if err != nil {
			return nil, nil, "", err
		}
		nc, err := nomadapi.NewRaw(nomadapi.Options{})
		if err != nil {
			return nil, nil, "", err
		}
		return cc, nc, "the environment", nil
	}
	creds, err := taskcreds.Load(path, "the queue controller's", fmt.Sprintf(
		"put the controller's tokens there (nomad var put %s nomad_token=... consul_token=...; "+
			"their policies: gpujob acl policy nomad-queue-controller, consul-queue-controller)", path))
	if err != nil {
		return nil, nil, "", fmt.Errorf("%s is set: %w", render.EnvQueueControllerSecrets, err)
	}
	cc, err := creds.Consul()
	if err != nil {
		return nil, nil, "", err
	}
	nc, err := nomadapi.NewRaw(creds.NomadOptions(""))
	if err != nil {
		return nil, nil, "", err
	}
	return cc, nc, "the variable " + path, nil
}
