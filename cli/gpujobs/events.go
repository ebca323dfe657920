// Package gpujobs is what the gpujob commands share about a training job on
// Nomad: which allocations are its members, what the task driver's events
// say about each (round, node rank, ranks, restarts), the workload's log
// lines (loss, result, rank prefixes), and table and JSON output.
package gpujobs

import (
	"regexp"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/taskevent"
)

// Progress is what a member's task events say about it. Rank fields are -1
// until the member has joined a round.
type Progress struct {
	// Joined is true once a "joined round" event was seen; the fields
	// below describe the latest round joined.
	Joined    bool
	Round     int
	NodeRank  int
	NNodes    int
	FirstRank int // the member's global ranks are FirstRank..LastRank
	LastRank  int
	WorldSize int
	Master    string
	// Restarts is how many group restarts were used, as far as this
	// member's events tell: those used before its latest round, plus the
	// one a round it saw end with a failure spent.
	Restarts int
	// MaxRestarts is the group's budget once a driver event stated it, else -1.
	MaxRestarts int
	// LastEvent is the latest event's message, of any type.
	LastEvent string
	// Failure is the driver's or Nomad's reason when the task failed (a
	// join timeout, "no restarts left", a non-zero exit), else "".
	Failure string
}

// HasRank reports whether rank is one of the member's global ranks.
func (p Progress) HasRank(rank int) bool {
	return p.Joined && rank >= p.FirstRank && rank <= p.LastRank
}

// Ranks is the member's global ranks as a list.
func (p Progress) Ranks() []int {
	if !p.Joined {
		return nil
	}
	out := make([]int, 0, p.LastRank-p.FirstRank+1)
	for r := p.FirstRank; r <= p.LastRank; r++ {
		out = append(out, r)
	}
	return out
}

// RanksText is "4-7", "2" or "-".
func (p Progress) RanksText() string {
	switch {
	case !p.Joined:
		return "-"
	case p.FirstRank == p.LastRank:
		return strconv.Itoa(p.FirstRank)
	default:
		return strconv.Itoa(p.FirstRank) + "-" + strconv.Itoa(p.LastRank)
	}
}

// EventText is an event's message as `nomad alloc status` shows it, less
// the gRPC wrapping of an error that crossed the plugin boundary (a task
// the driver refused to start): the reason is in plain words after it.
func EventText(e *api.TaskEvent) string {
	switch {
	case e == nil:
		return ""
	case e.DisplayMessage != "":
		return unwrapRPC(e.DisplayMessage)
	case e.DriverMessage != "":
		return e.DriverMessage
	case e.Message != "":
		return unwrapRPC(e.Message)
	case e.DriverError != "":
		return unwrapRPC(e.DriverError)
	case e.SetupError != "":
		return e.SetupError
	}
	return e.Type
}

// rpcWrapping is how go-plugin's gRPC hands a plugin's error to Nomad.
var rpcWrapping = regexp.MustCompile(`^rpc error: code = \w+ desc = `)

func unwrapRPC(s string) string { return rpcWrapping.ReplaceAllString(s, "") }

// DriverEvent is the gpujob driver's structured milestone in a task event:
// its Details, as internal/taskevent defines them. ok is false for Nomad's
// own events, and for events of a driver older than the details (their
// text is shown but not read).
func DriverEvent(e *api.TaskEvent) (taskevent.Event, bool) {
	if e == nil || (e.Type != api.TaskDriverMessage && e.Type != "") {
		return taskevent.Event{}, false
	}
	d, ok := taskevent.Decode(e.Details)
	if ok {
		d.Message = EventText(e)
		d.Time = time.Unix(0, e.Time)
	}
	return d, ok
}

// ParseEvents reads a member's task events, oldest first (Nomad's order).
func ParseEvents(events []*api.TaskEvent) Progress {
	p := Progress{NodeRank: -1, FirstRank: -1, LastRank: -1, Round: 0, MaxRestarts: -1}
	for _, e := range events {
		if e == nil {
			continue
		}
		text := EventText(e)
		p.LastEvent = text
		if d, ok := DriverEvent(e); ok {
			p.apply(d)
			continue
		}
		if e.Type == api.TaskTerminated && e.ExitCode != 0 && p.Failure == "" {
			p.Failure = "exited " + strconv.Itoa(e.ExitCode)
		}
		if e.Type == api.TaskDriverFailure || e.Type == api.TaskSetupFailure || e.Type == api.TaskArtifactDownloadFailed {
			p.Failure = text
		}
	}
	return p
}

// apply folds one driver milestone into the progress.
func (p *Progress) apply(e taskevent.Event) {
	p.Restarts = max(p.Restarts, e.RestartsUsed())
	p.MaxRestarts = e.MaxRestarts
	switch {
	case e.Kind == taskevent.Joined:
		p.Joined = true
		p.Round, p.NodeRank, p.NNodes = e.Round, e.NodeRank, e.NNodes
		p.FirstRank, p.LastRank, p.WorldSize, p.Master = e.FirstRank, e.LastRank, e.WorldSize, e.Master
		p.Failure = ""
	case e.Kind == taskevent.Failed, e.BudgetExhausted():
		p.Failure = e.Message
		if p.Failure == "" {
			p.Failure = e.Describe()
		}
	}
}

// ParseJoined reads the supervisor's "gpujob: joined round …" line on the
// task's stderr (the echo of its Joined event), for `gpujob logs`, which
// may see it before the task event.
func ParseJoined(line string) (Progress, bool) {
	e, ok := taskevent.ParseJoinedLine(line)
	if !ok {
		return Progress{}, false
	}
	p := ParseEvents(nil)
	p.apply(e)
	p.MaxRestarts = -1 // the line does not say
	p.LastEvent = e.Message
	return p, true
}
