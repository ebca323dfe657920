package rendezvous

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// memberEnv turns this test binary into one member process of
// BenchmarkRoundProcesses: "ADDR RUNID M INDEX".
const memberEnv = "GPUJOB_RDZV_BENCH_MEMBER"

// runMember is one member process: it prints "ready", waits for a line on
// stdin (the common start barrier), opens its session and joins, prints
// "done UNIXNANO NODERANK", and leaves the run when stdin closes.
func runMember() int {
	f := strings.Fields(os.Getenv(memberEnv))
	if len(f) != 4 {
		fmt.Println("error bad", memberEnv)
		return 1
	}
	m, _ := strconv.Atoi(f[2])
	idx, _ := strconv.Atoi(f[3])
	cfg := api.DefaultConfig()
	cfg.Address = f[0]
	client, err := api.NewClient(cfg)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	r, err := New(Config{Client: client, RunID: f[1], Min: m, Max: m, JoinTimeout: 2 * time.Minute},
		Member{ID: fmt.Sprintf("p%d", idx), Name: fmt.Sprintf("bench[%d]", idx), Addr: "127.0.0.1:1", LocalWorldSize: 1})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	in := bufio.NewReader(os.Stdin)
	fmt.Println("ready")
	if _, err := in.ReadString('\n'); err != nil {
		return 1
	}
	ctx := context.Background()
	if err := r.Open(ctx); err != nil {
		fmt.Println("error", err)
		return 1
	}
	round, err := r.Join(ctx)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	fmt.Printf("done %d %d\n", time.Now().UnixNano(), round.NodeRank)
	_, _ = io.Copy(io.Discard, in)
	_ = r.Done(ctx, round)
	_ = r.Close(ctx)
	return 0
}

// BenchmarkRoundProcesses is the side-by-side with torch's c10d rendezvous
// (scripts/bench/torch_rdzv.py measures it the same way): M separate member
// processes, started and waiting at a common barrier; the time from the
// barrier opening to the last member returning from Join, session creation
// included.
func BenchmarkRoundProcesses(b *testing.B) {
	addr, _, _ := benchConsul(b)
	for _, m := range []int{8, 32, 64} {
		b.Run(fmt.Sprintf("M=%d", m), func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				total += roundOfProcesses(b, addr, m, fmt.Sprintf("bench/proc-%d-%d-%d", m, i, time.Now().UnixNano()))
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s/round")
		})
	}
}

func roundOfProcesses(b *testing.B, addr string, m int, run string) time.Duration {
	type member struct {
		cmd   *exec.Cmd
		stdin io.WriteCloser
		out   *bufio.Reader
	}
	var ms []member
	defer func() {
		for _, mb := range ms {
			mb.stdin.Close()
		}
		for _, mb := range ms {
			_ = mb.cmd.Wait()
		}
	}()
	for i := 0; i < m; i++ {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d %d", memberEnv, addr, run, m, i))
		stdin, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		ms = append(ms, member{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)})
	}
	for _, mb := range ms {
		if line, err := mb.out.ReadString('\n'); err != nil || strings.TrimSpace(line) != "ready" {
			b.Fatalf("member did not get ready: %q %v", line, err)
		}
	}
	start := time.Now()
	for _, mb := range ms {
		_, _ = mb.stdin.Write([]byte("go\n"))
	}
	var last int64
	ranks := map[string]bool{}
	for _, mb := range ms {
		line, err := mb.out.ReadString('\n')
		f := strings.Fields(line)
		if err != nil || len(f) != 3 || f[0] != "done" {
			b.Fatalf("member failed: %q %v", line, err)
		}
		at, _ := strconv.ParseInt(f[1], 10, 64)
		last = max(last, at)
		ranks[f[2]] = true
	}
	if len(ranks) != m {
		b.Fatalf("%d distinct node ranks for %d members", len(ranks), m)
	}
	return time.Unix(0, last).Sub(start)
}
