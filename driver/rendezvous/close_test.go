package rendezvous

import "testing"

func TestLastOutIgnoresRegistrationsThatNoLongerMatter(t *testing.T) {
	a, b := Member{ID: "a"}, Member{ID: "b"}
	complete3 := &roundRecord{Number: 3, Status: statusComplete}
	joining3 := &roundRecord{Number: 3, Status: statusJoining}
	live := func(entries map[string]int) map[string]liveRecord {
		out := map[string]liveRecord{}
		for id, gen := range entries {
			out[id] = liveRecord{Member: Member{ID: id}, Gen: gen}
		}
		return out
	}
	cases := []struct {
		name   string
		view   memberView
		rec    *roundRecord
		roster []Member
		want   bool
	}{
		{"nobody left", memberView{}, complete3, []Member{a, b}, true},
		{"a roster member still running", memberView{live: live(map[string]int{"b": 3})}, complete3, []Member{a, b}, false},
		{"a roster member that finished but has not closed: it will clean up",
			memberView{live: live(map[string]int{"b": 3}), done: map[string]int{"b": 3}}, complete3, []Member{a, b}, false},
		{"a replaced member whose session outlives it",
			memberView{live: live(map[string]int{"dead": 2})}, complete3, []Member{a, b}, true},
		{"a member outside the roster registered for this round (dead spare)",
			memberView{live: live(map[string]int{"dead": 3})}, complete3, []Member{a, b}, true},
		{"a late joiner waiting for the next round",
			memberView{live: live(map[string]int{"dead": 4})}, complete3, []Member{a, b}, false},
		{"an open round: every registration counts",
			memberView{live: live(map[string]int{"dead": 2})}, joining3, nil, false},
		{"no round record: every registration counts",
			memberView{live: live(map[string]int{"dead": 1})}, nil, nil, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.view.done == nil {
				tc.view.done = map[string]int{}
			}
			reads := 0
			got, err := lastOut(tc.view, tc.rec, func() ([]Member, error) { reads++; return tc.roster, nil })
			if err != nil || got != tc.want {
				t.Fatalf("lastOut = %v, %v; want %v", got, err, tc.want)
			}
			if reads > 1 {
				t.Fatalf("roster read %d times", reads)
			}
		})
	}
}
