package rendezvous

import (
	"fmt"
	"reflect"
	"testing"
)

// The coordinator's rules, without Consul.

func mem(i int) Member {
	return Member{ID: fmt.Sprintf("id-%d", i), Name: memberName(i), Addr: fmt.Sprintf("10.0.0.%d:1", i), LocalWorldSize: 1}
}

func mems(is ...int) []Member {
	var ms []Member
	for _, i := range is {
		ms = append(ms, mem(i))
	}
	return ms
}

// viewOf builds a member view: live registrations (member index -> gen) and
// done records (member index -> gen).
func viewOf(live, done map[int]int) *memberView {
	v := &memberView{live: map[string]liveRecord{}, done: map[string]int{}}
	for i, gen := range live {
		v.live[mem(i).ID] = liveRecord{Member: mem(i), Gen: gen}
	}
	for i, gen := range done {
		v.done[mem(i).ID] = gen
	}
	return v
}

func TestDecide(t *testing.T) {
	p := policy{Min: 2, Max: 3, MaxRestarts: 2}
	joining := func(n, restarts int) *roundRecord {
		return &roundRecord{Number: n, Status: statusJoining, Restarts: restarts, MaxRestarts: 2, Min: 2, Max: 3}
	}
	complete := func(n, restarts, size int) *roundRecord {
		return &roundRecord{Number: n, Status: statusComplete, Restarts: restarts, MaxRestarts: 2, Min: 2, Max: 3, Size: size}
	}
	vanished := func(i int) *failureRecord {
		return &failureRecord{Failure: Failure{Member: memberName(i), Reason: "left the round without finishing: its Consul session was invalidated (allocation lost, node down, or TTL missed)"}, MemberID: mem(i).ID}
	}
	for _, tc := range []struct {
		name    string
		p       policy
		rec     *roundRecord
		view    *memberView
		members []Member
		lc      lastCall
		want    decision
	}{
		{
			name: "no round: create round 1 with the full budget",
			p:    p, view: nil,
			want: decision{Next: &transition{rec: &roundRecord{Number: 1, Status: statusJoining, MaxRestarts: 2, Min: 2, Max: 3}}},
		},
		{
			name: "open round, view unknown: wait",
			p:    p, rec: joining(1, 0),
		},
		{
			name: "open round below Min: wait, no last call",
			p:    p, rec: joining(1, 0), view: viewOf(map[int]int{0: 1}, nil),
		},
		{
			name: "registrations for another round do not count",
			p:    p, rec: joining(2, 0), view: viewOf(map[int]int{0: 1, 1: 1, 2: 2}, nil),
		},
		{
			name: "Max registered: complete in rank order",
			p:    p, rec: joining(1, 0), view: viewOf(map[int]int{2: 1, 0: 1, 1: 1}, nil),
			want: decision{Next: &transition{rec: complete(1, 0, 3), members: mems(0, 1, 2)}},
		},
		{
			name: "more than Max: the first Max in rank order",
			p:    p, rec: joining(1, 0), view: viewOf(map[int]int{3: 1, 2: 1, 0: 1, 1: 1}, nil),
			want: decision{Next: &transition{rec: complete(1, 0, 3), members: mems(0, 1, 2)}},
		},
		{
			name: "Min<Max with Min registered: start the last call",
			p:    p, rec: joining(1, 0), view: viewOf(map[int]int{0: 1, 1: 1}, nil),
			want: decision{LastCall: 1},
		},
		{
			name: "last call running: keep it",
			p:    p, rec: joining(1, 0), view: viewOf(map[int]int{0: 1, 1: 1}, nil), lc: lastCall{Round: 1},
			want: decision{LastCall: 1},
		},
		{
			name: "last call passed: complete with whoever registered",
			p:    p, rec: joining(1, 0), view: viewOf(map[int]int{0: 1, 1: 1}, nil), lc: lastCall{Round: 1, Due: true},
			want: decision{Next: &transition{rec: complete(1, 0, 2), members: mems(0, 1)}, LastCall: 1},
		},
		{
			name: "a last call of an older round does not complete this one",
			p:    p, rec: joining(2, 0), view: viewOf(map[int]int{0: 2, 1: 2}, nil), lc: lastCall{Round: 1, Due: true},
			want: decision{LastCall: 2},
		},
		{
			name: "the record's Min/Max win over the policy",
			p:    policy{Min: 1, Max: 1}, rec: joining(1, 0), view: viewOf(map[int]int{0: 1}, nil),
			want: decision{LastCall: 0},
		},
		{
			name: "complete round, everyone live: nothing",
			p:    p, rec: complete(1, 0, 3), view: viewOf(map[int]int{0: 1, 1: 1, 2: 1}, nil), members: mems(0, 1, 2),
		},
		{
			name: "complete round, roster unknown: nothing",
			p:    p, rec: complete(1, 0, 3), view: viewOf(map[int]int{0: 1}, nil),
		},
		{
			name: "a member vanished without done: failure, one restart",
			p:    p, rec: complete(1, 0, 3), view: viewOf(map[int]int{0: 1, 2: 1}, nil), members: mems(0, 1, 2),
			want: decision{Next: &transition{rec: &roundRecord{Number: 2, Status: statusJoining, Restarts: 1, MaxRestarts: 2, Min: 2, Max: 3, LastFailure: vanished(1)}}},
		},
		{
			name: "a member that finished and left: not a failure",
			p:    p, rec: complete(3, 1, 3), view: viewOf(map[int]int{0: 3, 2: 3}, map[int]int{1: 3}), members: mems(0, 1, 2),
		},
		{
			name: "a done record of an earlier round does not excuse leaving",
			p:    p, rec: complete(3, 1, 3), view: viewOf(map[int]int{0: 3, 2: 3}, map[int]int{1: 2}), members: mems(0, 1, 2),
			want: decision{Next: &transition{rec: &roundRecord{Number: 4, Status: statusJoining, Restarts: 2, MaxRestarts: 2, Min: 2, Max: 3, LastFailure: vanished(1)}}},
		},
		{
			name: "budget spent: the round becomes exhausted, same number",
			p:    p, rec: complete(3, 2, 3), view: viewOf(map[int]int{0: 3, 1: 3}, nil), members: mems(0, 1, 2),
			want: decision{Next: &transition{rec: &roundRecord{Number: 3, Status: statusExhausted, Restarts: 2, MaxRestarts: 2, Min: 2, Max: 3, Size: 3, LastFailure: vanished(2)}}},
		},
		{
			name: "late joiner with room: new round, no restart consumed",
			p:    p, rec: complete(1, 1, 2), view: viewOf(map[int]int{0: 1, 1: 1, 5: 2}, nil), members: mems(0, 1),
			want: decision{Next: &transition{rec: &roundRecord{Number: 2, Status: statusJoining, Restarts: 1, MaxRestarts: 2, Min: 2, Max: 3,
				LastFailure: &failureRecord{Failure: Failure{Member: memberName(5), Reason: "new member wants to join: starting a new round"}, MemberID: mem(5).ID}}}},
		},
		{
			name: "late joiner with the round full: it waits as a spare",
			p:    p, rec: complete(1, 0, 3), view: viewOf(map[int]int{0: 1, 1: 1, 2: 1, 5: 2}, nil), members: mems(0, 1, 2),
		},
		{
			name: "a failure wins over a late joiner",
			p:    p, rec: complete(1, 0, 2), view: viewOf(map[int]int{0: 1, 5: 2}, nil), members: mems(0, 1),
			want: decision{Next: &transition{rec: &roundRecord{Number: 2, Status: statusJoining, Restarts: 1, MaxRestarts: 2, Min: 2, Max: 3, LastFailure: vanished(1)}}},
		},
		{
			name: "timed out: terminal, nothing",
			p:    p, rec: &roundRecord{Number: 1, Status: statusTimeout, Min: 2, Max: 3}, view: viewOf(map[int]int{0: 1}, nil),
		},
		{
			name: "exhausted: terminal, nothing",
			p:    p, rec: &roundRecord{Number: 4, Status: statusExhausted, Restarts: 2, MaxRestarts: 2}, view: viewOf(nil, nil), members: mems(0),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := decide(tc.p, tc.rec, tc.view, tc.members, tc.lc)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("decide =\n%s\nwant\n%s", describe(got), describe(tc.want))
			}
		})
	}
}

func describe(d decision) string {
	if d.Next == nil {
		return fmt.Sprintf("no write, last call %d", d.LastCall)
	}
	rec := *d.Next.rec
	lf := "<nil>"
	if rec.LastFailure != nil {
		lf = fmt.Sprintf("%+v", *rec.LastFailure)
	}
	return fmt.Sprintf("write %+v (last failure %s) members %v, last call %d", rec, lf, d.Next.members, d.LastCall)
}

// A round's Min/Max come from its record; the policy only fills a record
// that lacks them (written by an older version).
func TestDecideRecordWithoutMinMax(t *testing.T) {
	rec := &roundRecord{Number: 1, Status: statusJoining}
	got := decide(policy{Min: 1, Max: 1}, rec, viewOf(map[int]int{0: 1}, nil), nil, lastCall{})
	if got.Next == nil || got.Next.rec.Status != statusComplete || !reflect.DeepEqual(got.Next.members, mems(0)) {
		t.Fatalf("decide = %s", describe(got))
	}
}

func TestBackoff(t *testing.T) {
	b := newBackoff()
	prevCap := backoffBase
	for i := 0; i < 12; i++ {
		d := b.Next()
		want := min(prevCap, backoffCap)
		if d < want/2 || d > want {
			t.Fatalf("delay %d = %s, want in [%s, %s]", i, d, want/2, want)
		}
		prevCap *= 2
	}
	b.Reset()
	if d := b.Next(); d > b.Base() {
		t.Fatalf("after reset: %s > %s", d, backoffBase)
	}
}
