package supervisor

import (
	"context"

	"github.com/gpujob/gpujob/driver/rendezvous"
)

// solo is the Coordinator of a member that is a group of one and talks to
// no one: a service replica. Its rounds are local, nothing ends them from
// outside, and its restart budget is the spec's (0 for a replica, whose
// restarts are Nomad's).
type solo struct {
	self        rendezvous.Member
	runID       string
	maxRestarts int
	round       int
	restarts    int
	last        *rendezvous.Failure
}

func newSolo(spec *Spec) *solo {
	return &solo{
		self: rendezvous.Member{ID: spec.Self.ID, Name: spec.Self.Name, Addr: spec.Self.Addr,
			LocalWorldSize: spec.NProcPerNode},
		runID:       spec.RunID,
		maxRestarts: spec.MaxRestarts,
	}
}

// Join starts the next round at once, or says the budget is spent.
func (s *solo) Join(ctx context.Context) (*rendezvous.Round, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.last != nil {
		if s.restarts >= s.maxRestarts {
			return nil, &rendezvous.RestartsExhaustedError{RunID: s.runID, Restarts: s.restarts, Max: s.maxRestarts, LastFailure: *s.last}
		}
		s.restarts++
		s.last = nil
	}
	s.round++
	return &rendezvous.Round{
		Number:    s.round,
		Restarts:  s.restarts,
		Members:   []rendezvous.Member{s.self},
		WorldSize: s.self.LocalWorldSize,
		Master:    s.self,
	}, nil
}

// Watch never reports: there is no one else to fail. A nil channel is never
// ready in the supervisor's select.
func (s *solo) Watch(context.Context, *rendezvous.Round) <-chan rendezvous.Failure { return nil }

// Fail records the failure for the next Join.
func (s *solo) Fail(_ context.Context, _ *rendezvous.Round, f rendezvous.Failure) error {
	s.last = &f
	return nil
}

// Done has no one to tell.
func (s *solo) Done(context.Context, *rendezvous.Round) error { return nil }
