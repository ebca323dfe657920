package rendezvous

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
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
	rosterKey  = "ctl/roster"
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
	// roster is P/ctl/roster as stored (gzip'd), decoded only by whoever
	// needs it (Rendezvous.snapRoster), once per version; rosterIndex is
	// its ModifyIndex, 0 if absent.
	roster      []byte
	rosterIndex uint64
}

// Limits on what a member accepts from Consul. Every value under P/ was
// written by another member, or by anyone else who may write the prefix, or
// by a bug: a member reads it as untrusted input, bounded and checked to be
// something a coordinator could have written, so that a corrupt key ends
// the run with a plain error instead of a crash, a gzip bomb, or members
// that disagree on their ranks (FuzzRoster, FuzzRoundRecord,
// FuzzRegistration).
const (
	// MaxMembers bounds a run's group (Config.Max) and so every roster.
	MaxMembers = 10000
	// MaxLocalWorldSize bounds Member.LocalWorldSize (processes per
	// member), which keeps a world size far from overflowing.
	MaxLocalWorldSize = 1024
	// maxRosterBytes bounds the roster's uncompressed text: a member's line
	// is about 100 bytes, so 1 KiB a member is ten times what a real one
	// needs. Consul's 512 KiB value limit does not bound what gzip inflates.
	maxRosterBytes = MaxMembers << 10
)

// checkMember reports a member that Open would not have let take part (see
// New): one whose ID cannot be a key segment, or whose fields would break
// the roster's one-line-per-member, tab-separated text.
//
// It allocates nothing: decodeRoster calls it for every line of every
// roster. (Without '/', the ID is one key segment: cleanKeyPath reduces to
// the three names checked first.)
func checkMember(m Member) error {
	switch {
	case m.ID == "" || m.ID == "." || m.ID == ".." || strings.ContainsAny(m.ID, "/ \t\n"):
		return fmt.Errorf("member ID %q: must be non-empty, not \".\" or \"..\", without '/', spaces, tabs or newlines", m.ID)
	case m.Name == "" || strings.ContainsAny(m.Name, "\t\n") || strings.ContainsAny(m.Addr, "\t\n"):
		return fmt.Errorf("member %q: name %q / address %q must be non-empty (the name) without tabs or newlines", m.ID, m.Name, m.Addr)
	case m.LocalWorldSize < 1 || m.LocalWorldSize > MaxLocalWorldSize:
		return fmt.Errorf("member %q: local world size %d outside [1, %d]", m.ID, m.LocalWorldSize, MaxLocalWorldSize)
	}
	return nil
}

// decodeRoundRecord reads the value of P/ctl/round and checks that it is a
// record the round life cycle could have produced: a known status, a round
// number that can still be incremented, restarts within the budget, a
// group size within [Min, Max].
func decodeRoundRecord(data []byte) (*roundRecord, error) {
	var rec roundRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, err
	}
	switch rec.Status {
	case statusJoining, statusComplete, statusTimeout, statusExhausted:
	default:
		return nil, fmt.Errorf("unknown status %q", rec.Status)
	}
	maxN := MaxMembers
	switch {
	case rec.Number < 1 || rec.Number == math.MaxInt:
		return nil, fmt.Errorf("round number %d out of range", rec.Number)
	case rec.MaxRestarts < 0 || rec.Restarts < 0 || rec.Restarts > rec.MaxRestarts:
		return nil, fmt.Errorf("restarts %d of %d out of range", rec.Restarts, rec.MaxRestarts)
	// Min and Max are both 0 in a record of a version that did not write
	// them (decide then uses the configured ones).
	case rec.Min != 0 || rec.Max != 0:
		if rec.Min < 1 || rec.Max < rec.Min || rec.Max > MaxMembers {
			return nil, fmt.Errorf("group size %d:%d outside 1 <= min <= max <= %d", rec.Min, rec.Max, MaxMembers)
		}
		maxN = rec.Max
	}
	switch {
	case rec.Size < 0 || rec.Size > maxN || rec.Status == statusComplete && rec.Size < 1:
		return nil, fmt.Errorf("%s round of %d members outside [1, %d]", rec.Status, rec.Size, maxN)
	case len(rec.Joined) > MaxMembers || len(rec.Missing) > MaxMembers:
		return nil, fmt.Errorf("%d joined and %d missing members: more than %d", len(rec.Joined), len(rec.Missing), MaxMembers)
	}
	return &rec, nil
}

func parseControl(base string, pairs api.KVPairs) (snapshot, error) {
	var s snapshot
	for _, p := range pairs {
		switch strings.TrimPrefix(p.Key, base) {
		case roundKey:
			rec, err := decodeRoundRecord(p.Value)
			if err != nil {
				return s, fmt.Errorf("decode round record %s: %w", p.Key, err)
			}
			s.round = rec
			s.roundIndex = p.ModifyIndex
		case leaderKey:
			s.leader = p.Session
		case rosterKey:
			s.roster, s.rosterIndex = p.Value, p.ModifyIndex
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
			if lr, ok := decodeRegistration(strings.TrimPrefix(rel, livePrefix), p.Value); ok {
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

// decodeRegistration reads the value of P/m/live/<id>. A registration
// counts only if it is one register could have written: for the member its
// key names (else one key could stand in for another member, alive or
// dead), for a round, with fields the roster can carry.
func decodeRegistration(id string, data []byte) (liveRecord, bool) {
	var lr liveRecord
	if json.Unmarshal(data, &lr) != nil || lr.Member.ID != id || lr.Gen < 1 || checkMember(lr.Member) != nil {
		return liveRecord{}, false
	}
	return lr, true
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
	sort.Slice(ms, func(i, j int) bool { return memberLess(ms[i], ms[j]) })
}

// memberLess is the rank order of sortMembers.
func memberLess(a, b Member) bool {
	if c := naturalCompare(a.Name, b.Name); c != 0 {
		return c < 0
	}
	return a.ID < b.ID
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

// The roster (P/ctl/roster) lists the members of the complete round in rank
// order. It lives beside the round record under the prefix every member
// long-polls, and only while that round is complete (the write that ends a
// round deletes it), so the watch answer that shows the round complete
// carries it: no member needs a request of its own to read it (at a
// thousand members those reads were a third of the time to a complete
// round), and it crosses the wire once per member per round. It is kept out
// of the round record itself so that the coordinator's CAS writes stay
// small, and it is plain text, one member a line, because at a thousand
// members nested JSON decoded by every member dominated the time to a
// complete round.
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

// decodeRoster reads what encodeRoster wrote, and accepts only a roster a
// coordinator could have written: its text bounded (a gzip bomb is cut off
// at maxRosterBytes), every member valid, no ID twice, in rank order. Each
// member derives its rank from its place in the roster; a roster out of
// order or with a repeated member would hand two members one rank.
func decodeRoster(data []byte) (int, []Member, error) {
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		return 0, nil, fmt.Errorf("roster: %w", err)
	}
	// gzip's trailer gives the size (mod 2^32) the text claims: read into
	// a buffer of that size at once (bounded: the claim is untrusted)
	// instead of growing one by doubling.
	var buf bytes.Buffer
	if n := len(data); n >= 4 {
		buf.Grow(int(min(binary.LittleEndian.Uint32(data[n-4:]), maxRosterBytes+1)))
	}
	_, err = buf.ReadFrom(io.LimitReader(zr, maxRosterBytes+1))
	raw := buf.Bytes()
	if err != nil {
		return 0, nil, fmt.Errorf("roster: %w", err)
	}
	if len(raw) > maxRosterBytes {
		return 0, nil, fmt.Errorf("roster: more than %d bytes uncompressed", maxRosterBytes)
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
	if number < 1 {
		return 0, nil, fmt.Errorf("roster: round number %d", number)
	}
	n := strings.Count(rest, "\n")
	if n > MaxMembers {
		return 0, nil, fmt.Errorf("roster: more than %d members", MaxMembers)
	}
	ms := make([]Member, 0, n+1)
	ids := make([]string, 0, n+1) // sorted below to find an ID listed twice
	// Every member decodes the roster of every round it joins, so this
	// loop allocates nothing per line: the fields are substrings of s.
	for rest != "" {
		line, rest, _ = strings.Cut(rest, "\n")
		id, f, ok1 := strings.Cut(line, "\t")
		name, f, ok2 := strings.Cut(f, "\t")
		addr, size, ok3 := strings.Cut(f, "\t")
		if !ok1 || !ok2 || !ok3 || strings.IndexByte(size, '\t') >= 0 {
			return 0, nil, fmt.Errorf("roster: bad line %q", line)
		}
		lws, err := strconv.Atoi(size)
		if err != nil {
			return 0, nil, fmt.Errorf("roster: bad local world size in %q: %w", line, err)
		}
		m := Member{ID: id, Name: name, Addr: addr, LocalWorldSize: lws}
		if err := checkMember(m); err != nil {
			return 0, nil, fmt.Errorf("roster: %w", err)
		}
		if len(ms) > 0 && !memberLess(ms[len(ms)-1], m) {
			return 0, nil, fmt.Errorf("roster: member %q (%s) out of rank order", m.ID, m.Name)
		}
		ids = append(ids, m.ID)
		ms = append(ms, m)
	}
	slices.Sort(ids)
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1] {
			return 0, nil, fmt.Errorf("roster: member %q listed twice", ids[i])
		}
	}
	// A round completes with at least Min >= 1 members.
	if len(ms) == 0 || len(ms) > MaxMembers {
		return 0, nil, fmt.Errorf("roster: %d members outside [1, %d]", len(ms), MaxMembers)
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
