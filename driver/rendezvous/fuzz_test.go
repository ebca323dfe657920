package rendezvous

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/consul/api"
)

// The fuzz targets of this file feed a member what another member (or
// anyone who can write the run's prefix) left in Consul: the roster, the
// round record and the registrations. A member must never crash on it, and
// must accept only what a coordinator could have written, so that every
// member derives the same ranks from it. `make fuzz` runs each for a while;
// plain `go test` runs the seeds below and testdata/fuzz/<target>/.

const fuzzBase = "gpujob/rendezvous/ns/job/1/"

func seedMembers() []Member {
	return []Member{
		{ID: "0b6e7c3e-1111-2222-3333-444455556666", Name: "job.train[0]", Addr: "10.0.0.1:24001", LocalWorldSize: 2},
		{ID: "7f1d2a90-aaaa-bbbb-cccc-ddddeeeeffff", Name: "job.train[1]", Addr: "10.0.0.2:24001", LocalWorldSize: 2},
		{ID: "a2", Name: "job.train[10]", Addr: "[::1]:1", LocalWorldSize: 1},
	}
}

// gzipWriters saves the fuzz targets a large allocation per input.
var gzipWriters = sync.Pool{New: func() any { return gzip.NewWriter(nil) }}

func gz(t testing.TB, text []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	zw := gzipWriters.Get().(*gzip.Writer)
	defer gzipWriters.Put(zw)
	zw.Reset(&b)
	if _, err := zw.Write(text); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// FuzzRoster: decodeRoster(data), or of gzip(data) when plain (so that the
// fuzzer explores the text rather than gzip's checksums).
func FuzzRoster(f *testing.F) {
	ms := seedMembers()
	sortMembers(ms)
	f.Add(encodeRoster(3, ms), false)
	f.Add(encodeRoster(1, ms[:1]), false)
	f.Add([]byte{0x1f, 0x8b, 0x08, 0x00}, false)
	// More in testdata/fuzz/FuzzRoster: rosters refused since.
	for _, text := range []string{
		rosterHeader + "1\na\ta\t127.0.0.1:1\t1\n",
		rosterHeader + "2\na\tx[1]\th:1\t1\nb\tx[2]\th:2\t8\n",
		rosterHeader + "-1\n",
		rosterHeader + "1\n\t\t\t1\n",
		rosterHeader + "1\na\tx\th:1\t+1",
		"gpujob-roster v2 1\n",
	} {
		f.Add([]byte(text), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, plain bool) {
		if plain {
			data = gz(t, data)
		}
		n, ms, err := decodeRoster(data)
		if err != nil {
			if n != 0 || ms != nil {
				t.Fatalf("decodeRoster failed (%v) but returned round %d, %d members", err, n, len(ms))
			}
			return
		}
		checkRoster(t, n, ms)
		// What a member accepted re-encodes to the same roster.
		n2, ms2, err := decodeRoster(encodeRoster(n, ms))
		if err != nil || n2 != n || !reflect.DeepEqual(ms2, ms) {
			t.Fatalf("re-encoded roster of round %d decodes to round %d, %v (%v); want %v", n, n2, ms2, err, ms)
		}
	})
}

// checkRoster asserts that an accepted roster is one a coordinator could
// have written, and that every member of it sees the same consistent round.
func checkRoster(t *testing.T, n int, ms []Member) {
	t.Helper()
	if n < 1 {
		t.Fatalf("accepted round number %d", n)
	}
	if len(ms) < 1 || len(ms) > MaxMembers {
		t.Fatalf("accepted a roster of %d members", len(ms))
	}
	ids := map[string]bool{}
	for _, m := range ms {
		if err := checkMember(m); err != nil {
			t.Fatalf("accepted an invalid member: %v", err)
		}
		if ids[m.ID] {
			t.Fatalf("accepted member %q twice", m.ID)
		}
		ids[m.ID] = true
	}
	sorted := slices.Clone(ms)
	sortMembers(sorted)
	if !reflect.DeepEqual(sorted, ms) {
		t.Fatalf("accepted a roster the coordinator would have ordered differently:\n got %v\nwant %v", ms, sorted)
	}
	// Members find themselves at their own node ranks, agree on the world
	// size and master, and their global ranks tile [0, world size). (A few
	// members of a large roster: buildRound is linear in its size.)
	rec := &roundRecord{Number: n, Status: statusComplete, Size: len(ms)}
	offsets := make([]int, len(ms))
	world := 0
	for i, m := range ms {
		offsets[i] = world
		world += m.LocalWorldSize
	}
	if world < len(ms) || world > len(ms)*MaxLocalWorldSize {
		t.Fatalf("world size %d of %d members", world, len(ms))
	}
	for _, i := range []int{0, len(ms) / 2, len(ms) - 1} {
		rd, ok := buildRound(rec, ms, ms[i].ID)
		if !ok || rd.NodeRank != i || rd.RankOffset != offsets[i] || rd.WorldSize != world || rd.Master != ms[0] {
			t.Fatalf("member %d (%s) sees round %+v (ok %v); want node rank %d, offset %d, world size %d",
				i, ms[i].ID, rd, ok, i, offsets[i], world)
		}
	}
}

// TestRosterGzipBombIsBounded: a small roster value that inflates to far
// more than any roster is refused without inflating all of it.
func TestRosterGzipBombIsBounded(t *testing.T) {
	// gzip members concatenate into one stream: a 1 MiB member of roster
	// lines repeated makes a small value that inflates to a lot.
	var head, member bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&head, gzip.BestCompression)
	zw.Write([]byte(rosterHeader + "1\n"))
	zw.Close()
	zw, _ = gzip.NewWriterLevel(&member, gzip.BestCompression)
	zw.Write(bytes.Repeat([]byte("a\tx\th:1\t1\n"), (1<<20)/10))
	zw.Close()
	const inflated = 256 << 20
	b := bytes.NewBuffer(head.Bytes())
	for i := 0; i < inflated>>20; i++ {
		b.Write(member.Bytes())
	}
	if b.Len() > 1<<20 {
		t.Fatalf("the bomb is %d bytes; want a small one", b.Len())
	}
	// TotalAlloc counts every goroutine's allocations (a test's lingering
	// Consul clients too): the least of a few runs is the decoder's.
	least := uint64(math.MaxUint64)
	for range 3 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		_, _, err := decodeRoster(b.Bytes())
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), "uncompressed") {
			t.Fatalf("decodeRoster of a %d-byte value inflating to %d MiB: err %v, want the size limit", b.Len(), inflated>>20, err)
		}
		least = min(least, after.TotalAlloc-before.TotalAlloc)
	}
	// Reading all of it would take twice the inflated size.
	if least > inflated/2 {
		t.Errorf("decoding the bomb allocated %d MiB; the limit is %d MiB of text", least>>20, maxRosterBytes>>20)
	}
	t.Logf("decoding a %d KiB roster that inflates to %d MiB allocated %d MiB", b.Len()>>10, inflated>>20, least>>20)
}

// FuzzRoundRecord: the value of P/ctl/round as parseControl (every member's
// watch) reads it.
func FuzzRoundRecord(f *testing.F) {
	for _, rec := range []roundRecord{
		{Number: 1, Status: statusJoining, MaxRestarts: 3, Min: 2, Max: 4},
		{Number: 2, Status: statusComplete, Restarts: 1, MaxRestarts: 3, Size: 2, Min: 2, Max: 2,
			LastFailure: &failureRecord{Failure: Failure{Member: "job.train[1]", Reason: "rank 3 exited 1", ExitCode: 1}, MemberID: "b", ByID: "b"}},
		{Number: 3, Status: statusTimeout, MaxRestarts: 0, Min: 1, Max: 2, Joined: seedMembers()[:1], Missing: []string{"job.train[1]"}, Timeout: "5m0s"},
		{Number: 4, Status: statusExhausted, Restarts: 3, MaxRestarts: 3, Size: 4, Min: 4, Max: 4},
		{Number: 1, Status: statusJoining},
	} {
		b, err := json.Marshal(rec)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// More in testdata/fuzz/FuzzRoundRecord: records refused since.
	for _, s := range []string{
		`{"Number":1,"Status":"complete","Size":-3}`,
		`{"number":1,"status":"joining","NUMBER":2}`,
		`null`, `[]`, `{"Number":1e400}`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		snap, err := parseControl(fuzzBase, api.KVPairs{{Key: fuzzBase + roundKey, Value: data, ModifyIndex: 7}})
		if err != nil {
			return
		}
		rec := snap.round
		if rec == nil {
			t.Fatal("parseControl accepted a round record but returned none")
		}
		checkRecord(t, "accepted", rec)
		// encode → decode → encode is the identity: what the coordinator
		// writes back (a CAS of a modified copy) says what it read.
		b1, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		again, err := parseControl(fuzzBase, api.KVPairs{{Key: fuzzBase + roundKey, Value: b1}})
		if err != nil {
			t.Fatalf("re-encoded record %s refused: %v", b1, err)
		}
		if b2, _ := json.Marshal(again.round); !bytes.Equal(b1, b2) {
			t.Fatalf("record changes through encode/decode:\n%s\n%s", b1, b2)
		}
		if rec.Number >= math.MaxInt32-1 {
			return // no next round to check
		}
		// Whatever the coordinator or a failing member writes next from
		// an accepted record is accepted too: a valid run never trips
		// over its own records.
		f := failureRecord{Failure: Failure{Member: "m", Reason: "r"}, MemberID: "a"}
		for _, next := range []*roundRecord{endRound(rec, f, true), endRound(rec, f, false)} {
			checkRecord(t, "next", next)
		}
		p := policy{Min: 1, Max: 2, MaxRestarts: 1}
		live := map[string]liveRecord{}
		for i, m := range seedMembers() {
			live[m.ID] = liveRecord{Member: m, Gen: rec.Number + i%2}
		}
		ms := seedMembers()[:2]
		sortMembers(ms)
		for _, lc := range []lastCall{{}, {Round: rec.Number, Due: true}} {
			d := decide(p, rec, &memberView{live: live, done: map[string]int{}}, ms, lc)
			if d.Next != nil {
				checkRecord(t, "decided", d.Next.rec)
			}
		}
	})
}

// checkRecord asserts that rec is accepted by a member.
func checkRecord(t *testing.T, what string, rec *roundRecord) {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := decodeRoundRecord(b)
	if err != nil {
		t.Fatalf("%s record %s is refused: %v", what, b, err)
	}
	switch {
	case got.Number < 1,
		got.Restarts < 0 || got.Restarts > got.MaxRestarts,
		got.Max > MaxMembers || got.Min > got.Max || got.Max > 0 && got.Min < 1,
		got.Status == statusComplete && got.Size < 1,
		got.Size < 0 || got.Size > MaxMembers:
		t.Fatalf("%s record is not self-consistent: %+v", what, got)
	}
}

// FuzzRegistration: two members' registrations (P/m/live/<id>) as the
// coordinator reads them; what it accepts becomes the roster every member
// reads, so the roster it would write from them must decode to the same
// members in the same order.
func FuzzRegistration(f *testing.F) {
	reg := func(m Member, gen int) []byte {
		b, _ := json.Marshal(liveRecord{Member: m, Gen: gen})
		return b
	}
	ms := seedMembers()
	// More in testdata/fuzz/FuzzRegistration: registrations refused since.
	f.Add(ms[0].ID, reg(ms[0], 1), ms[1].ID, reg(ms[1], 1))
	f.Add(ms[0].ID, reg(ms[0], 2), ms[2].ID, reg(ms[2], 2))
	f.Fuzz(func(t *testing.T, id1 string, v1 []byte, id2 string, v2 []byte) {
		pairs := api.KVPairs{
			{Key: fuzzBase + livePrefix + id1, Value: v1, Session: "s1"},
			{Key: fuzzBase + livePrefix + id2, Value: v2, Session: "s2"},
			{Key: fuzzBase + donePrefix + id2, Value: v2},
		}
		view := parseMembers(fuzzBase, pairs)
		if len(view.live) > 2 {
			t.Fatalf("two registrations gave %d live members", len(view.live))
		}
		gens := map[int]bool{}
		for id, lr := range view.live {
			if lr.Member.ID != id || (id != id1 && id != id2) {
				t.Fatalf("live member %q came from a key of another member (keys %q, %q)", lr.Member.ID, id1, id2)
			}
			if err := checkMember(lr.Member); err != nil || lr.Gen < 1 {
				t.Fatalf("accepted an invalid registration %+v: %v", lr, err)
			}
			gens[lr.Gen] = true
		}
		for gen := range gens {
			cands := view.candidates(gen)
			n, roster, err := decodeRoster(encodeRoster(gen, cands))
			if err != nil || n != gen || !reflect.DeepEqual(roster, cands) {
				t.Fatalf("the roster of accepted members %v decodes to %d, %v (%v)", cands, n, roster, err)
			}
			checkRoster(t, n, roster)
		}
	})
}

// TestMemberLimitsAgreeWithOpen: Open refuses a member or a group the
// others would refuse in a roster.
func TestMemberLimitsAgreeWithOpen(t *testing.T) {
	client, err := api.NewClient(api.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	good := Member{ID: "a", Name: "x[0]", Addr: "h:1", LocalWorldSize: 1}
	cfg := Config{Client: client, RunID: "r", Min: 1, Max: 1}
	for _, c := range []struct {
		name string
		cfg  Config
		m    Member
	}{
		{"a tab in the ID", cfg, Member{ID: "a\tb", Name: "x", LocalWorldSize: 1}},
		{"a newline in the name", cfg, Member{ID: "a", Name: "x\n", LocalWorldSize: 1}},
		{"too many processes", cfg, Member{ID: "a", Name: "x", LocalWorldSize: MaxLocalWorldSize + 1}},
		{"too large a group", Config{Client: client, RunID: "r", Min: 1, Max: MaxMembers + 1}, good},
	} {
		if _, err := New(c.cfg, c.m); err == nil {
			t.Errorf("%s: New accepted it", c.name)
		}
	}
	if _, err := New(Config{Client: client, RunID: "r", Min: 1, Max: MaxMembers}, Member{ID: "a", Name: "x", LocalWorldSize: MaxLocalWorldSize}); err != nil {
		t.Errorf("New refused a group at the limits: %v", err)
	}
}
