package rendezvous

import (
	"fmt"
	"strings"
)

// JoinTimeoutError says that a round did not complete within JoinTimeout.
// Every member waiting for that round gets the same error.
type JoinTimeoutError struct {
	RunID    string
	Round    int
	Timeout  string   // the JoinTimeout of the member that declared it
	Min, Max int      // members the round needed
	Joined   []Member // members that had joined, in rank order
	Missing  []string // Expected names that had not joined
	// Cause is set when this member could not reach Consul to record the
	// timeout for everyone: the last Consul error (Joined is then
	// unknown and Missing lists every expected name).
	Cause error
}

func (e *JoinTimeoutError) Error() string {
	names := make([]string, len(e.Joined))
	for i, m := range e.Joined {
		names[i] = m.Name
	}
	need := fmt.Sprint(e.Max)
	if e.Min != e.Max {
		need = fmt.Sprintf("%d:%d", e.Min, e.Max)
	}
	msg := fmt.Sprintf("rendezvous %s round %d: join timed out after %s: %d of %s members joined [%s]",
		e.RunID, e.Round, e.Timeout, len(e.Joined), need, strings.Join(names, ", "))
	if len(e.Missing) > 0 {
		msg += "; never joined: " + strings.Join(e.Missing, ", ")
	}
	if e.Cause != nil {
		msg += "; consul unreachable: " + e.Cause.Error()
	}
	return msg
}

// RestartsExhaustedError says that a round failed with the group's restart
// budget spent. Every member gets it.
type RestartsExhaustedError struct {
	RunID       string
	Restarts    int // restarts used
	Max         int // the budget
	LastFailure Failure
}

func (e *RestartsExhaustedError) Error() string {
	return fmt.Sprintf("rendezvous %s: restart budget exhausted (%d of %d restarts used); last failure: %s",
		e.RunID, e.Restarts, e.Max, e.LastFailure)
}

func (r *Rendezvous) terminalError(rec *roundRecord) error {
	switch rec.Status {
	case statusTimeout:
		return &JoinTimeoutError{
			RunID: r.cfg.RunID, Round: rec.Number, Timeout: timeoutReason(rec),
			Min: rec.Min, Max: rec.Max,
			Joined: append([]Member(nil), rec.Joined...), Missing: append([]string(nil), rec.Missing...),
		}
	case statusExhausted:
		e := &RestartsExhaustedError{RunID: r.cfg.RunID, Restarts: rec.Restarts, Max: rec.MaxRestarts}
		if rec.LastFailure != nil {
			e.LastFailure = rec.LastFailure.Failure
		}
		return e
	}
	return nil
}

func timeoutReason(rec *roundRecord) string {
	if rec.Timeout != "" {
		return rec.Timeout
	}
	return "the join timeout"
}
