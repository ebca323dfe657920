package driver

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
)

// BenchmarkInternalGroupRestart is an internal micro-benchmark of the
// supervisor's restart path, not the product's recovery figure: two members
// of two `sh` ranks each, through Nomad's driver harness and executor but
// without Nomad, on the test Consul; rank 3 exits 9 in round 1 and the figure
// is the time from that exit to the last of the four ranks of round 2
// starting. It times no training (no torch, no process group), so it
// catches regressions in detection, rendezvous and re-spawn only. The
// end-to-end figure (kill -9 of a torch rank until all four ranks step
// again, beside torchrun and a fresh launch) is scripts/bench/recovery.sh.
//
// It reports the median over its b.N iterations, once, as s/restart (with
// the fastest and slowest as s/restart-min and s/restart-max); run it with
// -benchtime Nx, N >= 5. ns/op is set to 0: the timer is stopped throughout,
// so Go's own per-op figure would mean nothing.
func BenchmarkInternalGroupRestart(b *testing.B) {
	b.StopTimer()
	var took []time.Duration
	for i := 0; i < b.N; i++ {
		took = append(took, restartOnce(b, i))
	}
	slices.Sort(took)
	b.ReportMetric(medianDuration(took).Seconds(), "s/restart")
	b.ReportMetric(took[0].Seconds(), "s/restart-min")
	b.ReportMetric(took[len(took)-1].Seconds(), "s/restart-max")
	b.ReportMetric(0, "ns/op")
}

// medianDuration of sorted durations (the mean of the middle two for an even count).
func medianDuration(sorted []time.Duration) time.Duration {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// restartOnce runs one crash-and-restart group and returns the time from
// rank 3's exit to every rank of round 2 running.
func restartOnce(b *testing.B, i int) time.Duration {
	dir := b.TempDir()
	tb := benchT{b}
	h := harness(tb, Config{})
	p := ports(tb, 2)
	script := `now() { date +%s.%N; }
if [ "$GPUJOB_GENERATION" = 1 ]; then
  if [ "$RANK" = 3 ]; then sleep 0.3; now > "$OUT/crash"; exit 9; fi
  exec sleep 60
fi
now > "$OUT/start.$RANK"`
	tc := TaskConfig{Command: "/bin/sh", Args: []string{"-c", script}, NProcPerNode: 2, MaxRestarts: 1,
		Env:        []map[string]string{{"OUT": dir}},
		Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv", JoinTimeout: "30s"}}
	job := "bench-restart-" + strconv.Itoa(i)
	cfgs := []*drivers.TaskConfig{member(tb, h, job, 0, p[0], tc), member(tb, h, job, 1, p[1], tc)}
	for _, r := range startAll(tb, h, cfgs, 60*time.Second) {
		if !r.Successful() {
			b.Fatalf("member exited %+v", r)
		}
	}
	crash := readTime(b, filepath.Join(dir, "crash"))
	var last time.Time
	for r := 0; r < 4; r++ {
		if s := readTime(b, filepath.Join(dir, "start."+strconv.Itoa(r))); s.After(last) {
			last = s
		}
	}
	return last.Sub(crash)
}

func readTime(b *testing.B, path string) time.Time {
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(string(raw)), 64)
	if err != nil {
		b.Fatal(err)
	}
	return time.Unix(0, int64(f*1e9))
}
