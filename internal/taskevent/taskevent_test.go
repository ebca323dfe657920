package taskevent

import (
	"reflect"
	"testing"
	"time"
)

func TestEncodeDecodeRoundTrip(t *testing.T) {
	events := []Event{
		{Kind: Joined, Round: 3, NodeRank: 1, NNodes: 4, FirstRank: 4, LastRank: 7, WorldSize: 16,
			Master: "10.0.0.5:24001", Restarts: 2, MaxRestarts: 3},
		{Kind: Restarting, Round: 2, NodeRank: 0, NNodes: 2, FirstRank: 0, LastRank: 0, WorldSize: 2, Master: "h:1",
			Restarts: 1, MaxRestarts: 3, Remote: true,
			Failure: Failure{Member: "bert.train[1]", Reason: "rank 1 exited 137", ExitCode: 137}},
		{Kind: Succeeded, Round: 1, FirstRank: 0, LastRank: 1, Warning: "recording the success in Consul failed: EOF"},
		{Kind: Failed, Failure: Failure{Reason: "join timed out"}, MaxRestarts: 1},
		{Kind: TrialStopped, Round: 2, FirstRank: 0, LastRank: 0, WorldSize: 1, Restarts: 1, MaxRestarts: 3,
			Stop: Stop{Reason: "stopped by ASHA at step 120: 0.71 < rung cut 0.78", At: time.Date(2026, 12, 2, 10, 0, 0, 5, time.UTC)}},
	}
	for _, e := range events {
		got, ok := Decode(e.Encode())
		if !ok {
			t.Fatalf("Decode(Encode(%+v)) not ok", e)
		}
		if !reflect.DeepEqual(got, e) {
			t.Errorf("round trip:\n got %+v\nwant %+v", got, e)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	for name, d := range map[string]map[string]string{
		"nomad's own details":    {"driver_message": "x"},
		"an older driver":        {"kind": "joined", "round": "1", "node_rank": "0", "restarts": "0"},
		"a future version":       {VersionKey: "2", "kind": "joined"},
		"a malformed number":     {VersionKey: version, "kind": "joined", "round": "one"},
		"nil":                    nil,
		"version without a kind": {VersionKey: version},
		"a malformed stop time":  {VersionKey: version, "kind": "trial_stopped", "stop_at": "yesterday"},
	} {
		if e, ok := Decode(d); ok {
			t.Errorf("%s: decoded %+v", name, e)
		}
	}
}

func TestDescribe(t *testing.T) {
	tests := []struct {
		e    Event
		want string
	}{
		{Event{Kind: Joined, Round: 1, NodeRank: 0, NNodes: 2, FirstRank: 0, LastRank: 0, WorldSize: 2, Master: "127.0.0.1:1"},
			"joined round 1 as node 0 of 2 (rank 0 of 2, master 127.0.0.1:1)"},
		{Event{Kind: Joined, Round: 3, NodeRank: 1, NNodes: 4, FirstRank: 4, LastRank: 7, WorldSize: 16, Master: "10.0.0.5:24001"},
			"joined round 3 as node 1 of 4 (ranks 4-7 of 16, master 10.0.0.5:24001)"},
		{Event{Kind: Restarting, Restarts: 0, MaxRestarts: 3, Failure: Failure{Reason: "rank 5 exited 137"}},
			"rank 5 exited 137: restarting group, 2 of 3 restarts left"},
		{Event{Kind: Restarting, Restarts: 3, MaxRestarts: 3, Failure: Failure{Reason: "rank 0 exited 1"}},
			"rank 0 exited 1: no restarts left (3 used)"},
		{Event{Kind: Restarting, Round: 2, Remote: true, Failure: Failure{Member: "bert.train[2]", Reason: "rank 9 exited 1"}},
			"round 2 ended by bert.train[2] (rank 9 exited 1): restarting with the group"},
		{Event{Kind: Succeeded, FirstRank: 2, LastRank: 3}, "all 2 local ranks exited 0"},
		{Event{Kind: Succeeded, FirstRank: 2, LastRank: 2, Warning: "w"}, "rank 2 exited 0 (w)"},
		{Event{Kind: Stopped}, "stopped while waiting for the group"},
		{Event{Kind: Stopped, Round: 1}, "stopped by Nomad; local ranks stopped"},
		{Event{Kind: Failed, Failure: Failure{Reason: "restart budget exhausted"}}, "restart budget exhausted"},
		{Event{Kind: TrialStopped, Round: 4, Stop: Stop{Reason: "stopped by ASHA at step 120: 0.71 < rung cut 0.78"}},
			"stopped by ASHA at step 120: 0.71 < rung cut 0.78"},
		{Event{Kind: TrialStopped}, "stopped by the sweep"},
	}
	for _, tt := range tests {
		if got := tt.e.Describe(); got != tt.want {
			t.Errorf("Describe(%+v) = %q, want %q", tt.e, got, tt.want)
		}
	}
}

func TestRestartsUsed(t *testing.T) {
	tests := []struct {
		e         Event
		used      int
		exhausted bool
	}{
		{Event{Kind: Joined, Restarts: 2, MaxRestarts: 3}, 2, false},
		{Event{Kind: Restarting, Restarts: 2, MaxRestarts: 3}, 3, false},
		{Event{Kind: Restarting, Restarts: 3, MaxRestarts: 3}, 3, true},
		{Event{Kind: Restarting, Restarts: 3, MaxRestarts: 3, Remote: true}, 3, false},
	}
	for _, tt := range tests {
		if got := tt.e.RestartsUsed(); got != tt.used {
			t.Errorf("RestartsUsed(%+v) = %d, want %d", tt.e, got, tt.used)
		}
		if got := tt.e.BudgetExhausted(); got != tt.exhausted {
			t.Errorf("BudgetExhausted(%+v) = %v, want %v", tt.e, got, tt.exhausted)
		}
	}
}

func TestParseJoinedLine(t *testing.T) {
	for _, e := range []Event{
		{Kind: Joined, Round: 3, NodeRank: 1, NNodes: 4, FirstRank: 4, LastRank: 7, WorldSize: 16, Master: "10.0.0.5:24001"},
		{Kind: Joined, Round: 1, NodeRank: 0, NNodes: 1, FirstRank: 0, LastRank: 0, WorldSize: 1, Master: "[::1]:29400"},
	} {
		e.Message = e.Describe()
		got, ok := ParseJoinedLine(e.Echo())
		if !ok || !reflect.DeepEqual(got, e) {
			t.Errorf("ParseJoinedLine(%q) = %+v, %v; want %+v", e.Echo(), got, ok, e)
		}
	}
	for _, line := range []string{
		"gpujob: rank 0 exited 0",
		"gpujob: joined round x as node 0 of 1 (rank 0 of 1, master h:1)",
		"gpujob: joined round 1 as node 0 of 1 (rank 0 of 1)",
		"gpujob: joined round 1 as node 0 of 1 (ranks 0-a of 1, master h:1)",
		"joined round 1 as node 0 of 1 (rank 0 of 1, master h:1) trailing",
	} {
		if e, ok := ParseJoinedLine(line); ok {
			t.Errorf("ParseJoinedLine(%q) accepted: %+v", line, e)
		}
	}
}
