// Package taskevent is the one definition of the gpujob supervisor's
// milestones (joined a round, restarting, succeeded, failed, stopped, a
// sweep's trial stopped on request) as they travel from the supervisor,
// through the task driver, to the CLI.
//
// The supervisor writes each Event as a JSON line to its events file; the
// driver passes Encode's map as the Nomad task event's annotations, which
// the Nomad client stores unchanged as the event's Details (see
// allocRunner.GetTaskEventHandler in Nomad v1.6.3); the CLI reads them back
// with Decode. The human message travels beside them as the event's
// DriverMessage and is only ever written, never parsed, with one exception:
// ParseJoinedLine, for the supervisor's echo on the task's stderr, which has
// no details.
package taskevent

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Kind is what happened.
type Kind string

const (
	// Joined: the member is in a complete round and starts its ranks.
	Joined Kind = "joined"
	// Restarting: the round ended with a failure (this member's, or another
	// member's when Remote) and the group goes on to the next round.
	Restarting Kind = "restarting"
	// Succeeded: every local rank exited 0.
	Succeeded Kind = "succeeded"
	// Failed: the member cannot go on (join timeout, restart budget
	// exhausted, Consul unreachable); Failure.Reason says why.
	Failed Kind = "failed"
	// Stopped: Nomad stopped the task.
	Stopped Kind = "stopped"
	// TrialStopped: the sweep this member's trial belongs to asked the
	// trial to stop (early stopping, the sweep's goal reached, a user's
	// sweep stop); the member stopped its ranks and exits 0, so Nomad
	// neither restarts it nor counts it failed. Stop.Reason says why.
	TrialStopped Kind = "trial_stopped"
)

// Stop is the sweep's stop request that ended a TrialStopped member.
type Stop struct {
	Reason string    `json:"reason,omitempty"` // the request's words, the event's message
	At     time.Time `json:"at,omitzero"`      // when the request was made
}

// Failure says who ended a round and why.
type Failure struct {
	Member   string `json:"member,omitempty"`
	Reason   string `json:"reason,omitempty"`
	ExitCode int    `json:"exit_code,omitempty"`
}

// Event is one milestone of one member. Rank fields describe the round the
// event belongs to; Round is 0 before the member joined any.
type Event struct {
	Time    time.Time `json:"time"`
	Kind    Kind      `json:"kind"`
	Message string    `json:"message"` // Describe's text, filled by the writer

	Round     int    `json:"round,omitempty"`
	NodeRank  int    `json:"node_rank"`
	NNodes    int    `json:"nnodes,omitempty"`
	FirstRank int    `json:"first_rank"` // the member's global ranks are FirstRank..LastRank
	LastRank  int    `json:"last_rank"`
	WorldSize int    `json:"world_size,omitempty"`
	Master    string `json:"master,omitempty"` // host:port of node rank 0

	Restarts    int `json:"restarts"`     // group restarts used before this round
	MaxRestarts int `json:"max_restarts"` // the group's budget

	// Failure is set for Restarting (the round's failure) and Failed (why
	// the member gives up).
	Failure Failure `json:"failure,omitzero"`
	// Remote marks a Restarting event whose failure was another member's.
	Remote bool `json:"remote,omitempty"`
	// Warning is something that went wrong without changing the outcome,
	// e.g. a success that could not be recorded in Consul.
	Warning string `json:"warning,omitempty"`
	// Stop is set for TrialStopped.
	Stop Stop `json:"stop,omitzero"`
}

// LocalRanks is how many ranks the member runs.
func (e Event) LocalRanks() int { return e.LastRank - e.FirstRank + 1 }

// RestartsUsed is how many group restarts were spent once this event
// happened: a Restarting event spends one, up to the budget.
func (e Event) RestartsUsed() int {
	if e.Kind == Restarting {
		return min(e.Restarts+1, e.MaxRestarts)
	}
	return e.Restarts
}

// BudgetExhausted reports a Restarting event after which no restart is left:
// the group fails.
func (e Event) BudgetExhausted() bool {
	return e.Kind == Restarting && !e.Remote && e.Restarts >= e.MaxRestarts
}

// ranksText is "ranks 4-7" or "rank 4".
func (e Event) ranksText() string {
	if e.FirstRank == e.LastRank {
		return fmt.Sprintf("rank %d", e.FirstRank)
	}
	return fmt.Sprintf("ranks %d-%d", e.FirstRank, e.LastRank)
}

// joinedFormat is the joined message; ParseJoinedLine reads it back.
const joinedFormat = "joined round %d as node %d of %d (%s of %d, master %s)"

// Describe is the event as a sentence for people: the task event's message
// and the supervisor's stderr line.
func (e Event) Describe() string {
	var s string
	switch e.Kind {
	case Joined:
		s = fmt.Sprintf(joinedFormat, e.Round, e.NodeRank, e.NNodes, e.ranksText(), e.WorldSize, e.Master)
	case Restarting:
		switch left := e.MaxRestarts - e.Restarts - 1; {
		case e.Remote:
			s = fmt.Sprintf("round %d ended by %s (%s): restarting with the group", e.Round, e.Failure.Member, e.Failure.Reason)
		case left < 0:
			s = fmt.Sprintf("%s: no restarts left (%d used)", e.Failure.Reason, e.MaxRestarts)
		default:
			s = fmt.Sprintf("%s: restarting group, %d of %d restarts left", e.Failure.Reason, left, e.MaxRestarts)
		}
	case Succeeded:
		if e.LocalRanks() == 1 {
			s = fmt.Sprintf("rank %d exited 0", e.FirstRank)
		} else {
			s = fmt.Sprintf("all %d local ranks exited 0", e.LocalRanks())
		}
	case Stopped:
		if e.Round == 0 {
			s = "stopped while waiting for the group"
		} else {
			s = "stopped by Nomad; local ranks stopped"
		}
	case Failed:
		s = e.Failure.Reason
	case TrialStopped:
		s = e.Stop.Reason
		if s == "" {
			s = "stopped by the sweep"
		}
	default:
		s = string(e.Kind)
	}
	if e.Warning != "" {
		s += " (" + e.Warning + ")"
	}
	return s
}

// Details keys. VersionKey marks an event that carries them.
const (
	VersionKey = "gpujob_event"
	version    = "1"
)

// Encode is the event as Nomad task event annotations (Details).
func (e Event) Encode() map[string]string {
	itoa := strconv.Itoa
	m := map[string]string{
		VersionKey:     version,
		"kind":         string(e.Kind),
		"round":        itoa(e.Round),
		"node_rank":    itoa(e.NodeRank),
		"nnodes":       itoa(e.NNodes),
		"first_rank":   itoa(e.FirstRank),
		"last_rank":    itoa(e.LastRank),
		"world_size":   itoa(e.WorldSize),
		"master":       e.Master,
		"restarts":     itoa(e.Restarts),
		"max_restarts": itoa(e.MaxRestarts),
	}
	if e.Failure != (Failure{}) {
		m["failure_member"] = e.Failure.Member
		m["failure_reason"] = e.Failure.Reason
		m["failure_exit_code"] = itoa(e.Failure.ExitCode)
	}
	if e.Remote {
		m["remote"] = "true"
	}
	if e.Warning != "" {
		m["warning"] = e.Warning
	}
	if e.Stop.Reason != "" {
		m["stop_reason"] = e.Stop.Reason
	}
	if !e.Stop.At.IsZero() {
		m["stop_at"] = e.Stop.At.UTC().Format(time.RFC3339Nano)
	}
	return m
}

// Decode reads an event from a task event's Details; ok is false when they
// are not a gpujob event of a version this package reads (Nomad's own
// events, or a driver older than the details). Time and Message are not in
// the details: they are the task event's own Time and message.
func Decode(details map[string]string) (e Event, ok bool) {
	if details[VersionKey] != version || details["kind"] == "" {
		return Event{}, false
	}
	var bad error
	num := func(key string) int {
		v, ok := details[key]
		if !ok {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil && bad == nil {
			bad = err
		}
		return n
	}
	e = Event{
		Kind:        Kind(details["kind"]),
		Round:       num("round"),
		NodeRank:    num("node_rank"),
		NNodes:      num("nnodes"),
		FirstRank:   num("first_rank"),
		LastRank:    num("last_rank"),
		WorldSize:   num("world_size"),
		Master:      details["master"],
		Restarts:    num("restarts"),
		MaxRestarts: num("max_restarts"),
		Failure: Failure{Member: details["failure_member"], Reason: details["failure_reason"],
			ExitCode: num("failure_exit_code")},
		Remote:  details["remote"] == "true",
		Warning: details["warning"],
		Stop:    Stop{Reason: details["stop_reason"]},
	}
	if v, ok := details["stop_at"]; ok {
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil && bad == nil {
			bad = err
		}
		e.Stop.At = at
	}
	if bad != nil {
		return Event{}, false
	}
	return e, true
}

// EchoPrefix starts the supervisor's echo of each event on the task's stderr.
const EchoPrefix = "gpujob: "

// Echo is the stderr line (without newline) for the event.
func (e Event) Echo() string { return EchoPrefix + e.Message }

// ParseJoinedLine reads a Joined event back from its stderr echo (the
// "gpujob: " prefix is optional): `gpujob logs` learns a member's ranks from
// its log when the task events have not reached it yet.
func ParseJoinedLine(line string) (Event, bool) {
	line = strings.TrimPrefix(strings.TrimSpace(line), EchoPrefix)
	if !strings.HasPrefix(line, "joined round ") {
		return Event{}, false
	}
	e := Event{Kind: Joined}
	var ranks, master string
	// joinedFormat with the ranks text and master split into words.
	head, tail, ok := strings.Cut(line, " (")
	if !ok {
		return Event{}, false
	}
	if _, err := fmt.Sscanf(head, "joined round %d as node %d of %d", &e.Round, &e.NodeRank, &e.NNodes); err != nil {
		return Event{}, false
	}
	inner, ok := strings.CutSuffix(tail, ")")
	if !ok {
		return Event{}, false
	}
	ranksPart, masterPart, ok := strings.Cut(inner, ", master ")
	if !ok {
		return Event{}, false
	}
	master = masterPart
	ranksPart, world, ok := strings.Cut(ranksPart, " of ")
	if !ok {
		return Event{}, false
	}
	if e.WorldSize, ok = atoi(world); !ok {
		return Event{}, false
	}
	ranks = ranksPart
	switch {
	case strings.HasPrefix(ranks, "ranks "):
		first, last, ok1 := strings.Cut(strings.TrimPrefix(ranks, "ranks "), "-")
		var ok2, ok3 bool
		e.FirstRank, ok2 = atoi(first)
		e.LastRank, ok3 = atoi(last)
		if !ok1 || !ok2 || !ok3 {
			return Event{}, false
		}
	case strings.HasPrefix(ranks, "rank "):
		if e.FirstRank, ok = atoi(strings.TrimPrefix(ranks, "rank ")); !ok {
			return Event{}, false
		}
		e.LastRank = e.FirstRank
	default:
		return Event{}, false
	}
	e.Master = master
	e.Message = line
	// Keep the reader honest: what it read must be what Describe writes.
	if e.Describe() != line {
		return Event{}, false
	}
	return e, true
}

func atoi(s string) (int, bool) {
	n, err := strconv.Atoi(s)
	return n, err == nil
}
