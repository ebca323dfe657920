// Package gpujobs is what the gpujob commands share about a training job on
// Nomad: which allocations are its members, what the task driver's events
// say about each (round, node rank, ranks, restarts), the workload's log
// lines (loss, result, rank prefixes), and table and JSON output.
package gpujobs

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
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
	// member's events tell: the driver's annotations, the "N of M restarts
	// left" messages, and the rounds it saw end with a failure.
	Restarts int
	// MaxRestarts is the group's budget when an event stated it, else -1.
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

var (
	// joined round 3 as node 1 of 4 (ranks 4-7 of 16, master 10.0.0.5:24001)
	// joined round 1 as node 0 of 2 (rank 0 of 2, master 127.0.0.1:40469)
	joinedRE = regexp.MustCompile(`^joined round (\d+) as node (\d+) of (\d+) \((?:ranks (\d+)-(\d+)|rank (\d+)) of (\d+), master ([^)]*)\)`)
	// rank 5 exited 137: restarting group, 2 of 3 restarts left
	restartLeftRE = regexp.MustCompile(`: restarting group, (\d+) of (\d+) restarts left$`)
	// round 3 ended by bert.train[2] (rank 9 exited 1): restarting with the group
	endedByRE = regexp.MustCompile(`^round (\d+) ended by .*: restarting with the group$`)
	// rank 5 exited 1: no restarts left (3 used)
	noRestartsRE = regexp.MustCompile(`: no restarts left \((\d+) used\)$`)
)

// EventText is an event's message as `nomad alloc status` shows it.
func EventText(e *api.TaskEvent) string {
	switch {
	case e == nil:
		return ""
	case e.DisplayMessage != "":
		return e.DisplayMessage
	case e.DriverMessage != "":
		return e.DriverMessage
	case e.Message != "":
		return e.Message
	case e.DriverError != "":
		return e.DriverError
	case e.SetupError != "":
		return e.SetupError
	}
	return e.Type
}

// ParseEvents reads a member's task events, oldest first (Nomad's order).
func ParseEvents(events []*api.TaskEvent) Progress {
	p := Progress{NodeRank: -1, FirstRank: -1, LastRank: -1, Round: 0, MaxRestarts: -1}
	ended := 0 // rounds this member saw end with a failure
	for _, e := range events {
		if e == nil {
			continue
		}
		text := EventText(e)
		p.LastEvent = text
		if e.Type == api.TaskDriverMessage || e.Type == "" {
			if restartLeftRE.MatchString(text) || endedByRE.MatchString(text) {
				ended++
			}
			parseDriverEvent(&p, e, text)
			continue
		}
		if e.Type == api.TaskTerminated && e.ExitCode != 0 && p.Failure == "" {
			p.Failure = "exited " + strconv.Itoa(e.ExitCode)
		}
		if e.Type == api.TaskDriverFailure || e.Type == api.TaskSetupFailure || e.Type == api.TaskArtifactDownloadFailed {
			p.Failure = text
		}
	}
	p.Restarts = max(p.Restarts, ended)
	return p
}

func parseDriverEvent(p *Progress, e *api.TaskEvent, text string) {
	if n, ok := atoi(e.Details["restarts"]); ok {
		p.Restarts = max(p.Restarts, n)
	}
	if m := joinedRE.FindStringSubmatch(text); m != nil {
		p.Joined = true
		p.Round, _ = strconv.Atoi(m[1])
		p.NodeRank, _ = strconv.Atoi(m[2])
		p.NNodes, _ = strconv.Atoi(m[3])
		if m[4] != "" {
			p.FirstRank, _ = strconv.Atoi(m[4])
			p.LastRank, _ = strconv.Atoi(m[5])
		} else {
			p.FirstRank, _ = strconv.Atoi(m[6])
			p.LastRank = p.FirstRank
		}
		p.WorldSize, _ = strconv.Atoi(m[7])
		p.Master = m[8]
		p.Failure = ""
		return
	}
	if m := restartLeftRE.FindStringSubmatch(text); m != nil {
		left, _ := strconv.Atoi(m[1])
		total, _ := strconv.Atoi(m[2])
		p.MaxRestarts = total
		p.Restarts = max(p.Restarts, total-left)
		return
	}
	if m := noRestartsRE.FindStringSubmatch(text); m != nil {
		used, _ := strconv.Atoi(m[1])
		p.MaxRestarts = used
		p.Restarts = max(p.Restarts, used)
		p.Failure = text
		return
	}
	if e.Details["kind"] == "failed" || strings.HasPrefix(text, "rendezvous ") {
		p.Failure = text
	}
}

func atoi(s string) (int, bool) {
	if s == "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// ParseJoined reads a "joined round …" message: the driver's event, also
// echoed on the task's stderr as "gpujob: joined round …" (the prefix is
// allowed).
func ParseJoined(text string) (Progress, bool) {
	text = strings.TrimPrefix(text, "gpujob: ")
	if !strings.HasPrefix(text, "joined round ") {
		return Progress{}, false
	}
	p := ParseEvents(nil)
	parseDriverEvent(&p, &api.TaskEvent{Type: api.TaskDriverMessage}, text)
	return p, p.Joined
}
