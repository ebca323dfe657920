package rendezvous

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

// Keys relative to Prefix/RunID/ (see the package documentation).
const (
	ctlPrefix  = "ctl/"
	roundKey   = "ctl/round"
	leaderKey  = "ctl/leader"
	livePrefix = "m/live/"
	donePrefix = "m/done/"
	memberPfx  = "m/"
	rosterKey  = "roster"
)

// Round record statuses.
const (
	statusJoining   = "joining"   // round open, members registering
	statusComplete  = "complete"  // membership fixed, training runs
	statusTimeout   = "timeout"   // terminal: the round never completed
	statusExhausted = "exhausted" // terminal: a failure with no restart left
)

// roundRecord is the value of P/ctl/round.
type roundRecord struct {
	Number      int
	Status      string
	Restarts    int
	MaxRestarts int
	Size        int            `json:",omitempty"` // complete: members in the roster
	LastFailure *failureRecord `json:",omitempty"` // what ended the previous round (or this one, if terminal)
	Joined      []Member       `json:",omitempty"` // timeout: who had joined
	Missing     []string       `json:",omitempty"` // timeout: expected names that had not
	Timeout     string         `json:",omitempty"` // timeout: the JoinTimeout that expired
	Min, Max    int            `json:",omitempty"`
}

type failureRecord struct {
	Failure
	MemberID string `json:",omitempty"` // member the failure is about
	ByID     string `json:",omitempty"` // member that reported it through Fail
}

func (rec *roundRecord) terminal() bool {
	return rec != nil && (rec.Status == statusTimeout || rec.Status == statusExhausted)
}

// liveRecord is the value of P/m/live/<ID>.
type liveRecord struct {
	Member Member
	Gen    int // round number this member wants to be part of
}

// doneRecord is the value of P/m/done/<ID>.
type doneRecord struct {
	Gen int
}

// snapshot is what a member knows of P/ctl/.
type snapshot struct {
	round      *roundRecord
	roundIndex uint64 // ModifyIndex of P/ctl/round, 0 if absent
	leader     string // session holding P/ctl/leader, "" if none
}

func parseControl(base string, pairs api.KVPairs) (snapshot, error) {
	var s snapshot
	for _, p := range pairs {
		switch strings.TrimPrefix(p.Key, base) {
		case roundKey:
			var rec roundRecord
			if err := json.Unmarshal(p.Value, &rec); err != nil {
				return s, fmt.Errorf("decode round record %s: %w", p.Key, err)
			}
			s.round = &rec
			s.roundIndex = p.ModifyIndex
		case leaderKey:
			s.leader = p.Session
		}
	}
	return s, nil
}

// memberView is what the coordinator knows of P/m/.
type memberView struct {
	live map[string]liveRecord // by member ID
	done map[string]int        // member ID -> generation it finished in
}

func parseMembers(base string, pairs api.KVPairs) memberView {
	v := memberView{live: map[string]liveRecord{}, done: map[string]int{}}
	for _, p := range pairs {
		rel := strings.TrimPrefix(p.Key, base)
		switch {
		case strings.HasPrefix(rel, livePrefix):
			// A key without a session is a leftover of a lock that
			// was released rather than deleted; it is not live.
			if p.Session == "" {
				continue
			}
			var lr liveRecord
			if json.Unmarshal(p.Value, &lr) == nil && lr.Member.ID != "" {
				v.live[lr.Member.ID] = lr
			}
		case strings.HasPrefix(rel, donePrefix):
			var d doneRecord
			if json.Unmarshal(p.Value, &d) == nil {
				v.done[strings.TrimPrefix(rel, donePrefix)] = d.Gen
			}
		}
	}
	return v
}

// candidates returns the live members registered for generation gen, in rank
// order.
func (v memberView) candidates(gen int) []Member {
	var ms []Member
	for _, lr := range v.live {
		if lr.Gen == gen {
			ms = append(ms, lr.Member)
		}
	}
	sortMembers(ms)
	return ms
}

// sortMembers orders members by rank: Name in natural order, then ID. A
// replacement allocation carries the name of the one it replaces, so it gets
// the same rank.
func sortMembers(ms []Member) {
	sort.Slice(ms, func(i, j int) bool {
		if c := naturalCompare(ms[i].Name, ms[j].Name); c != 0 {
			return c < 0
		}
		return ms[i].ID < ms[j].ID
	})
}

// naturalCompare compares strings with runs of digits compared as numbers,
// so "train[2]" < "train[10]".
func naturalCompare(a, b string) int {
	for a != "" && b != "" {
		if isDigit(a[0]) && isDigit(b[0]) {
			da, db := digitRun(a), digitRun(b)
			na, nb := strings.TrimLeft(a[:da], "0"), strings.TrimLeft(b[:db], "0")
			if len(na) != len(nb) {
				return cmpInt(len(na), len(nb))
			}
			if c := strings.Compare(na, nb); c != 0 {
				return c
			}
			a, b = a[da:], b[db:]
			continue
		}
		if a[0] != b[0] {
			return cmpInt(int(a[0]), int(b[0]))
		}
		a, b = a[1:], b[1:]
	}
	return cmpInt(len(a), len(b))
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func digitRun(s string) int {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return i
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// The roster (P/roster) lists the members of the latest complete round in
// rank order. It is kept out of the round record, which every member long-
// polls, so that the record stays small and the roster crosses the wire once
// per member per round; and it is plain text, one member a line, because at
// a thousand members nested JSON decoded by every member dominated the time
// to a complete round.
const rosterHeader = "gpujob-roster v1 "

// The stored roster is gzip-compressed text: compressed once by the
// coordinator instead of once per reader by Consul's HTTP gzip, and about
// five times smaller to carry (base64 inside JSON) to every member.
func encodeRoster(number int, ms []Member) []byte {
	var b strings.Builder
	b.Grow(len(ms) * 64)
	b.WriteString(rosterHeader)
	b.WriteString(strconv.Itoa(number))
	b.WriteByte('\n')
	for _, m := range ms {
		b.WriteString(m.ID)
		b.WriteByte('\t')
		b.WriteString(m.Name)
		b.WriteByte('\t')
		b.WriteString(m.Addr)
		b.WriteByte('\t')
		b.WriteString(strconv.Itoa(m.LocalWorldSize))
		b.WriteByte('\n')
	}
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed)
	zw.Write([]byte(b.String())) // writes to a bytes.Buffer do not fail
	zw.Close()
	return z.Bytes()
}

func decodeRoster(data []byte) (int, []Member, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return 0, nil, fmt.Errorf("roster: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return 0, nil, fmt.Errorf("roster: %w", err)
	}
	s := string(raw)
	line, rest, _ := strings.Cut(s, "\n")
	if !strings.HasPrefix(line, rosterHeader) {
		return 0, nil, fmt.Errorf("roster: bad header %q", line)
	}
	number, err := strconv.Atoi(strings.TrimPrefix(line, rosterHeader))
	if err != nil {
		return 0, nil, fmt.Errorf("roster: bad round number: %w", err)
	}
	ms := make([]Member, 0, strings.Count(rest, "\n"))
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\n")
		f := strings.Split(line, "\t")
		if len(f) != 4 {
			return 0, nil, fmt.Errorf("roster: bad line %q", line)
		}
		lws, err := strconv.Atoi(f[3])
		if err != nil {
			return 0, nil, fmt.Errorf("roster: bad local world size in %q: %w", line, err)
		}
		ms = append(ms, Member{ID: f[0], Name: f[1], Addr: f[2], LocalWorldSize: lws})
	}
	return number, ms, nil
}

// buildRound turns a complete record into this member's view of it; ok is
// false when the member is not part of it.
func buildRound(rec *roundRecord, members []Member, selfID string) (*Round, bool) {
	rd := &Round{Number: rec.Number, Restarts: rec.Restarts, Members: members, NodeRank: -1}
	for i, m := range members {
		if m.ID == selfID {
			rd.NodeRank = i
			rd.RankOffset = rd.WorldSize
		}
		rd.WorldSize += m.LocalWorldSize
	}
	if rd.NodeRank < 0 || len(members) == 0 {
		return nil, false
	}
	rd.Master = members[0]
	return rd, true
}
