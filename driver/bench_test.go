package driver

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/plugins/drivers"
)

// BenchmarkFailureToRunning measures, on the local Consul, the time from one
// rank's crash to every rank of the group running again: two members of two
// ranks each; rank 3 crashes in round 1, and each rank of round 2 records when
// it started. The figure is what torchrun needs a 15 s heartbeat to notice.
func BenchmarkFailureToRunning(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		d := recoveryOnce(b, i)
		b.ReportMetric(d.Seconds(), "s/recovery")
		b.StartTimer()
	}
}

// recoveryOnce runs one crash-and-recover group and returns crash → all
// ranks running again.
func recoveryOnce(b *testing.B, i int) time.Duration {
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
	job := "bench-recovery-" + strconv.Itoa(i)
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
