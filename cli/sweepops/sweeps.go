// Package sweepops is what the `gpujob sweep` verbs do to a sweep that was
// submitted: read its record and state, change its state, read its status
// (with Nomad's word on why queued trials wait), and stop it, through its
// controller or by itself, and purge it. The commands parse and print.
//
// Status lives here and not in cli/sweepjob because it explains placements
// with cli/observe, which imports cli/sweepjob.
package sweepops

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// Sweeps is where the sweeps of a namespace live: their records and
// states in Consul KV under Prefix, their controller and trial jobs in
// Nomad.
type Sweeps struct {
	Consul *consul.Client
	// Nomad is nil for the verbs that read only Consul.
	Nomad     nomadapi.API
	Namespace string
	// Prefix is the sweeps' KV prefix (sweepjob.KeyPrefix).
	Prefix string
	// ACL says which clusters enforce ACLs (DetectACL), for the verbs
	// that register a controller or purge one.
	ACL sweepcreds.Mode
	// Now is the clock that stamps what Stop records (time.Now when nil).
	Now func() time.Time
	// QueuePrefix is the queues' tree (contract.QueuePrefix when ""),
	// where a controller in queue mode queued the trials.
	QueuePrefix string
}

func (s *Sweeps) now() time.Time {
	if s.Now == nil {
		return time.Now()
	}
	return s.Now()
}

// ErrNoSweep is Load's error for a name with no record and no state.
var ErrNoSweep = errors.New("no sweep")

// Load reads a sweep's record and state, and the state's modify index; a
// sweep that was never submitted is an error that says so (ErrNoSweep).
func (s *Sweeps) Load(ctx context.Context, name string) (*sweepjob.Record, *controller.State, uint64, error) {
	rec, err := sweepjob.LoadRecord(ctx, s.Consul, s.Prefix, s.Namespace, name)
	if err != nil {
		return nil, nil, 0, err
	}
	st, index, err := controller.LoadState(ctx, s.Consul, s.Prefix, s.Namespace, name)
	if err != nil {
		return nil, nil, 0, err
	}
	if rec == nil && index == 0 {
		return nil, nil, 0, fmt.Errorf("%w %q in namespace %s (Consul at %s)", ErrNoSweep, name, s.Namespace, ConsulAddr())
	}
	if rec == nil {
		return nil, nil, 0, fmt.Errorf("sweep %q has a state but no record in Consul: remove it with gpujob sweep stop --purge %s", name, name)
	}
	return rec, st, index, nil
}

// ConsulAddr is the Consul address the CLI uses, for messages and for the
// controller's environment.
func ConsulAddr() string {
	if a := os.Getenv(consul.HTTPAddrEnvName); a != "" {
		return a
	}
	return "127.0.0.1:8500"
}

// Update applies change to the sweep's state with check-and-set, retrying
// on a concurrent write (the controller saves every round).
func (s *Sweeps) Update(ctx context.Context, name string, change func(*controller.State) error) (*controller.State, error) {
	for {
		st, index, err := controller.LoadState(ctx, s.Consul, s.Prefix, s.Namespace, name)
		if err != nil {
			return nil, err
		}
		if err := change(st); err != nil {
			return nil, err
		}
		ok, err := controller.SaveState(ctx, s.Consul, s.Prefix, st, index)
		if err != nil {
			return nil, err
		}
		if ok {
			return st, nil
		}
	}
}

// NextState reads sweep name's state with a blocking query from index (up
// to wait); nil when there is none.
func (s *Sweeps) NextState(ctx context.Context, name string, index uint64, wait time.Duration) (*controller.State, *consul.QueryMeta, error) {
	key := sweepkv.StateKey(s.Prefix, s.Namespace, name)
	pair, meta, err := s.Consul.KV().Get(key, (&consul.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx))
	if err != nil {
		return nil, nil, err
	}
	if pair == nil {
		return nil, meta, nil
	}
	var st controller.State
	if err := json.Unmarshal(pair.Value, &st); err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", key, err)
	}
	return &st, meta, nil
}

// TrialCounts is the state's trials by state, keyed by the state's name
// (as Status.Counts).
func TrialCounts(st *controller.State) map[string]int {
	c := map[string]int{}
	for s, n := range st.Counts() {
		c[string(s)] = n
	}
	return c
}

// ControllerTrouble says why the sweep's controller does not run when
// Nomad has tried it at least twice and none of its allocations runs: the
// last failed allocation's last task event. "" otherwise, and without
// Nomad.
func (s *Sweeps) ControllerTrouble(name string) string {
	if s.Nomad == nil {
		return ""
	}
	allocs, _, err := s.Nomad.JobAllocations(controller.ControllerJobID(name), nil)
	if err != nil {
		return ""
	}
	failed := 0
	var last *api.AllocationListStub
	for _, a := range allocs {
		switch a.ClientStatus {
		case "running", "pending":
			return ""
		case "failed", "lost":
			failed++
			if last == nil || a.CreateIndex > last.CreateIndex {
				last = a
			}
		}
	}
	if failed < 2 {
		return ""
	}
	// The driver's own words when there are any ("failed to launch
	// command …"), else the last event.
	for _, ts := range last.TaskStates {
		for i := len(ts.Events) - 1; i >= 0; i-- {
			if ev := ts.Events[i]; ev.Type == api.TaskDriverFailure || ev.DriverError != "" {
				return gpujobs.EventText(ev)
			}
		}
	}
	for _, ts := range last.TaskStates {
		if n := len(ts.Events); n > 0 {
			return gpujobs.EventText(ts.Events[n-1])
		}
	}
	return last.ClientDescription
}

// DetectACL asks Nomad and Consul whether they enforce ACLs (into ACL).
func (s *Sweeps) DetectACL() error {
	m, err := sweepcreds.Detect(s.Nomad, sweepcreds.NewConsul(s.Consul))
	if err != nil {
		return err
	}
	s.ACL = m
	return nil
}

// Credentials detects whether the clusters enforce ACLs and returns the
// issuer of sweep name's controller credentials.
func (s *Sweeps) Credentials(name string) (*sweepcreds.Issuer, error) {
	if err := s.DetectACL(); err != nil {
		return nil, err
	}
	return s.Issuer(name)
}

// Issuer issues and revokes the credentials of sweep name's controller,
// as ACL says. The Consul TLS files the CLI uses are read here, to be
// handed over.
func (s *Sweeps) Issuer(name string) (*sweepcreds.Issuer, error) {
	is := &sweepcreds.Issuer{Nomad: s.Nomad, Consul: sweepcreds.NewConsul(s.Consul), Mode: s.ACL,
		Namespace: s.Namespace, Sweep: name, KeyPrefix: s.Prefix, JobID: controller.ControllerJobID(name)}
	for _, f := range []struct {
		env string
		to  *[]byte
	}{{"CONSUL_CACERT", &is.ConsulTLS.CA}, {"CONSUL_CLIENT_CERT", &is.ConsulTLS.Cert}, {"CONSUL_CLIENT_KEY", &is.ConsulTLS.Key}} {
		path := os.Getenv(f.env)
		if path == "" || !s.ACL.Any() {
			continue
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.env, err)
		}
		*f.to = b
	}
	return is, nil
}
