package policy

import (
	"slices"
	"testing"
)

// A gang starts only when every member fits at once; members may spread.
func TestGangFit(t *testing.T) {
	tests := []struct {
		name    string
		nodes   []Node
		running []Running
		job     Job
		admit   bool
	}{
		{"one member per node, spread over two", gpuNodes(2, 4), nil, gang("a", "", 2, 4, 0), true},
		{"two members on one node", gpuNodes(1, 8), nil, gang("a", "", 2, 4, 0), true},
		{"enough GPUs in total but a member has no node", gpuNodes(2, 4),
			[]Running{running(gang("r", "", 2, 1, 0), 0, "n0", "n1")}, gang("a", "", 2, 4, 0), false},
		{"one of two members fits: nothing starts", gpuNodes(2, 4),
			[]Running{running(gang("r", "", 1, 4, 0), 0, "n0")}, gang("a", "", 2, 4, 0), false},
		{"CPU counts: GPUs free but no CPU", []Node{{Name: "n0", Capacity: Resources{GPUs: 8, CPUMHz: 1000}}}, nil,
			Job{ID: "a", Members: 1, PerMember: Resources{GPUs: 1, CPUMHz: 2000}}, false},
		{"unmanaged use is not free", []Node{{Name: "n0", Capacity: Resources{GPUs: 8}, Unmanaged: Resources{GPUs: 6}}}, nil,
			gang("a", "", 1, 4, 0), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := State{Nodes: tt.nodes, Running: tt.running, Pending: []Job{tt.job}}
			d := decide(t, s)
			checkInvariants(t, s, d)
			if got := len(d.Admit) == 1; got != tt.admit {
				t.Fatalf("admitted = %v, want %v (decision %+v)", got, tt.admit, d)
			}
		})
	}
}

func TestBestFitFillsSmallHolesFirst(t *testing.T) {
	free := []Resources{{GPUs: 8}, {GPUs: 1}, {GPUs: 4}}
	got := bestFit(free, Resources{GPUs: 1}, 2, nil)
	want := []nodeMembers{{1, 1}, {2, 1}}
	if !slices.Equal(got, want) {
		t.Fatalf("bestFit = %v, want %v (the 8-GPU node kept whole)", got, want)
	}
	if bestFit(free, Resources{GPUs: 8}, 2, nil) != nil {
		t.Fatal("bestFit placed two 8-GPU members on one 8-GPU node")
	}
}

// The no-fit cache must never answer "no" to a gang that fits.
func TestFitCacheOnlyAnswersLargerGangs(t *testing.T) {
	f := newFitter([]Resources{{GPUs: 4}, {GPUs: 4}})
	if f.fits(Resources{GPUs: 4}, 3) {
		t.Fatal("3 × 4 GPUs fit on 2 × 4")
	}
	if !f.fits(Resources{GPUs: 4}, 2) {
		t.Fatal("2 × 4 GPUs do not fit on 2 × 4 after a larger gang failed")
	}
	if f.fits(Resources{GPUs: 4}, 5) {
		t.Fatal("5 × 4 fit")
	}
}
