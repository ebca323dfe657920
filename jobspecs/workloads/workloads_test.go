// Package workloads holds no Go code: its tests run the training scripts of
// this directory with Debian's /usr/bin/python3 and torch (CPU, gloo) and
// check the lines the driver and a sweep read from them: the
// "gpujob-metric: {json}" points of rank 0, the final "gpujob-result:" line,
// the step sequence across a resume from a checkpoint, and the landscape
// sweep_toy.py promises. Where torch is missing they are skipped.
package workloads

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

const python = "/usr/bin/python3"

var (
	torchOnce sync.Once
	torchErr  error
)

// needTorch skips the test unless /usr/bin/python3 imports torch (the pyenv
// python3 on PATH has none).
func needTorch(t *testing.T) {
	t.Helper()
	torchOnce.Do(func() {
		out, err := exec.Command(python, "-c", "import torch").CombinedOutput()
		if err != nil {
			torchErr = fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
		}
	})
	if torchErr != nil {
		t.Skipf("%s cannot import torch: %v", python, torchErr)
	}
}

func script(name string) string {
	p, err := filepath.Abs(name)
	if err != nil {
		panic(err)
	}
	return p
}

// rankEnv is the environment the driver gives a rank, and nothing of the
// test's own (GPUJOB_CHECKPOINT_EVERY, say). world 1 leaves the distributed
// variables out, as a single-process run has them.
func rankEnv(ckdir string, rank, world int, port string) []string {
	env := []string{"PATH=/usr/bin:/bin", "HOME=" + os.TempDir(), "OMP_NUM_THREADS=1",
		"PYTHONDONTWRITEBYTECODE=1", "GPUJOB_CHECKPOINT_DIR=" + ckdir}
	if world > 1 {
		env = append(env, "RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(world),
			"LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port)
	}
	return env
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

type exit struct {
	out  string // stdout
	err  string // stderr
	code int
}

// run starts world ranks of the script on ckdir and waits for all; stop, if
// not nil, sees rank 0's stdout lines as they come and kills every rank when
// it returns true (the run's exits are then the kills').
func run(t *testing.T, name, ckdir string, world int, stop func(line string) bool, args ...string) []exit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	port := ""
	if world > 1 {
		port = freePort(t)
	}
	cmds := make([]*exec.Cmd, world)
	outs := make([]*strings.Builder, world)
	errs := make([]*strings.Builder, world)
	var pipe io.Reader
	for r := range world {
		c := exec.CommandContext(ctx, python, append([]string{script(name)}, args...)...)
		c.Env = rankEnv(ckdir, r, world, port)
		outs[r], errs[r] = &strings.Builder{}, &strings.Builder{}
		c.Stderr = errs[r]
		if r == 0 && stop != nil {
			p, err := c.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			pipe = p
		} else {
			c.Stdout = outs[r]
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = c
	}
	if pipe != nil {
		sc := bufio.NewScanner(pipe)
		stopped := false
		for sc.Scan() {
			outs[0].WriteString(sc.Text() + "\n")
			if !stopped && stop(sc.Text()) {
				stopped = true
				for _, c := range cmds {
					c.Process.Kill()
				}
			}
		}
	}
	res := make([]exit, world)
	for r, c := range cmds {
		err := c.Wait()
		res[r] = exit{out: outs[r].String(), err: errs[r].String(), code: c.ProcessState.ExitCode()}
		if ctx.Err() != nil {
			t.Fatalf("%s rank %d ran past the timeout: %v\nstdout:\n%s\nstderr:\n%s", name, r, err, res[r].out, res[r].err)
		}
	}
	return res
}

// ok runs the script and fails the test unless every rank exits 0; it
// returns rank 0's stdout.
func ok(t *testing.T, name, ckdir string, world int, args ...string) string {
	t.Helper()
	ex := run(t, name, ckdir, world, nil, args...)
	for r, e := range ex {
		if e.code != 0 {
			t.Fatalf("%s %v rank %d exited %d\nstdout:\n%s\nstderr:\n%s", name, args, r, e.code, e.out, e.err)
		}
	}
	for r, e := range ex[1:] {
		if strings.Contains(e.out, sweepkv.MetricLinePrefix) || strings.Contains(e.out, sweepkv.ResultLinePrefix) {
			t.Errorf("rank %d printed metric or result lines; only rank 0 may:\n%s", r+1, e.out)
		}
	}
	return ex[0].out
}

// point is one metric line, held to the contract of sweepkv: a JSON object
// whose "step" is an integer and whose other fields are numbers.
type point struct {
	Step   int
	Values map[string]float64
}

func parsePoint(t *testing.T, body string) point {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("metric line %q is not a JSON object: %v", body, err)
	}
	s, isNum := m["step"].(float64)
	if !isNum || s != math.Trunc(s) || s < 0 {
		t.Fatalf("metric line %q: step %v is not a non-negative integer", body, m["step"])
	}
	p := point{Step: int(s), Values: map[string]float64{}}
	for k, v := range m {
		if k == "step" {
			continue
		}
		f, isNum := v.(float64)
		if !isNum {
			t.Fatalf("metric line %q: %s is %T, not a number", body, k, v)
		}
		p.Values[k] = f
	}
	return p
}

// metrics reads rank 0's metric lines, which must name exactly the keys
// given, and its result line, which must be the last line.
func metrics(t *testing.T, out string, keys ...string) ([]point, map[string]any) {
	t.Helper()
	var pts []point
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, l := range lines {
		body, isMetric := strings.CutPrefix(l, sweepkv.MetricLinePrefix)
		if !isMetric {
			continue
		}
		p := parsePoint(t, body)
		var got []string
		for k := range p.Values {
			got = append(got, k)
		}
		if len(got) != len(keys) {
			t.Fatalf("metric line %q: want the fields step, %v", l, keys)
		}
		for _, k := range keys {
			if _, has := p.Values[k]; !has {
				t.Fatalf("metric line %q has no %q", l, k)
			}
		}
		pts = append(pts, p)
	}
	last := lines[len(lines)-1]
	body, isResult := strings.CutPrefix(last, sweepkv.ResultLinePrefix)
	if !isResult {
		t.Fatalf("the last line is not the result line:\n%s", out)
	}
	var res map[string]any
	if err := json.Unmarshal([]byte(body), &res); err != nil {
		t.Fatalf("result line %q: %v", last, err)
	}
	return pts, res
}

func steps(pts []point) []int {
	var s []int
	for _, p := range pts {
		s = append(s, p.Step)
	}
	return s
}

func num(t *testing.T, res map[string]any, k string) float64 {
	t.Helper()
	f, isNum := res[k].(float64)
	if !isNum {
		t.Fatalf("result %v: %s is not a number", res, k)
	}
	return f
}

// TestSweepToyResume: a run of 20 steps on two gloo ranks, then one of 40 in
// one process on the same checkpoint directory, report the points of one
// 40-step run (up to float summation order): the second resumes at step 20
// and its steps continue from there. Only rank 0 reports.
func TestSweepToyResume(t *testing.T) {
	needTorch(t)
	t.Parallel()
	args := []string{"--report-every", "5", "--checkpoint-every", "5", "--log-every", "5"}
	dir := t.TempDir()
	first, res1 := metrics(t, ok(t, "sweep_toy.py", dir, 2, append(args, "--steps", "20")...), "score", "loss")
	out2 := ok(t, "sweep_toy.py", dir, 1, append(args, "--steps", "40")...)
	second, res2 := metrics(t, out2, "score", "loss")
	straight, _ := metrics(t, ok(t, "sweep_toy.py", t.TempDir(), 1, append(args, "--steps", "40")...), "score", "loss")

	if got, want := steps(first), []int{5, 10, 15, 20}; !reflect.DeepEqual(got, want) {
		t.Errorf("first run's steps %v, want %v", got, want)
	}
	if !strings.Contains(out2, "gpujob: resumed from checkpoint step=20 ") {
		t.Errorf("the second run did not resume at step 20:\n%s", out2)
	}
	if got, want := steps(second), []int{25, 30, 35, 40}; !reflect.DeepEqual(got, want) {
		t.Errorf("resumed run's steps %v, want %v", got, want)
	}
	got := append(first, second...)
	if !reflect.DeepEqual(steps(got), steps(straight)) {
		t.Fatalf("steps %v, want %v", steps(got), steps(straight))
	}
	for i, p := range straight {
		for k, v := range p.Values {
			if d := math.Abs(got[i].Values[k] - v); d > 1e-4 {
				t.Errorf("step %d %s: %v (2 ranks, then resumed in 1), %v in one run", p.Step, k, got[i].Values[k], v)
			}
		}
	}
	if num(t, res1, "steps") != 20 || num(t, res1, "world_size") != 2 || num(t, res2, "steps") != 40 ||
		num(t, res2, "resumed_from_step") != 20 || num(t, res2, "steps_this_run") != 20 {
		t.Errorf("results %v and %v", res1, res2)
	}
	if num(t, res2, "score") != second[len(second)-1].Values["score"] {
		t.Errorf("result score %v is not the last point's %v", res2["score"], second[len(second)-1])
	}
}

// TestSweepToyLandscape: the learning rates below and above the good region
// score clearly worse than one inside it, from the first points on (what
// early stopping needs), and a diverged run still reports valid JSON.
func TestSweepToyLandscape(t *testing.T) {
	needTorch(t)
	t.Parallel()
	lrs := []string{"1e-4", "0.03", "0.2", "1"}
	exits := make([]exit, len(lrs))
	for i, lr := range lrs {
		exits[i] = run(t, "sweep_toy.py", "", 1, nil, "--lr", lr, "--steps", "100", "--report-every", "20", "--log-every", "0")[0]
	}
	curves := make([][]point, len(lrs))
	results := make([]map[string]any, len(lrs))
	for i, e := range exits {
		if e.code != 0 {
			t.Fatalf("lr %s exited %d: %s", lrs[i], e.code, e.err)
		}
		curves[i], results[i] = metrics(t, e.out, "score", "loss")
	}
	at := func(i, step int) float64 {
		for _, p := range curves[i] {
			if p.Step == step {
				return p.Values["score"]
			}
		}
		t.Fatalf("lr %s: no point at step %d in %v", lrs[i], step, curves[i])
		return 0
	}
	final := make([]float64, len(lrs))
	for i := range lrs {
		final[i] = num(t, results[i], "score")
		t.Logf("lr %-5s score at 20/60/100: %.3f %.3f %.3f", lrs[i], at(i, 20), at(i, 60), final[i])
	}
	tiny, mid, good, huge := 0, 1, 2, 3
	if final[good] < 0.85 {
		t.Errorf("lr %s scores %.3f, want >= 0.85", lrs[good], final[good])
	}
	if final[tiny] > 0.05 || final[huge] != -1 || results[huge]["diverged"] != true {
		t.Errorf("the bad regions score %.3f (lr %s) and %.3f (lr %s, %v), want < 0.05 and -1 (diverged)",
			final[tiny], lrs[tiny], final[huge], lrs[huge], results[huge])
	}
	for _, step := range []int{20, 60, 100} {
		if !(at(huge, step) < at(tiny, step) && at(tiny, step)+0.1 < at(mid, step) && at(mid, step)+0.1 < at(good, step)) {
			t.Errorf("at step %d the scores of lr %v are %.3f %.3f %.3f %.3f, want clearly increasing from the largest through the smallest to %s",
				step, lrs, at(tiny, step), at(mid, step), at(good, step), at(huge, step), lrs[good])
		}
	}
}

// TestSweepToyFailHooks: --fail-if-lr-above fails at once; --fail-at-step
// with --fail-once fails after the step's point and checkpoint, and the
// restarted run resumes there and succeeds.
func TestSweepToyFailHooks(t *testing.T) {
	needTorch(t)
	t.Parallel()
	ex := run(t, "sweep_toy.py", "", 1, nil, "--lr", "0.5", "--fail-if-lr-above", "0.3")
	if ex[0].code != 4 || strings.Contains(ex[0].out, sweepkv.ResultLinePrefix) {
		t.Errorf("--fail-if-lr-above: exit %d, stdout:\n%s", ex[0].code, ex[0].out)
	}
	dir := t.TempDir()
	base := []string{"--steps", "20", "--report-every", "5", "--checkpoint-every", "5", "--log-every", "0"}
	args := append(base, "--fail-at-step", "10", "--fail-once")
	ex = run(t, "sweep_toy.py", dir, 1, nil, args...)
	if ex[0].code != 5 || !strings.Contains(ex[0].out, sweepkv.MetricLinePrefix+`{"step": 10,`) ||
		strings.Contains(ex[0].out, sweepkv.ResultLinePrefix) {
		t.Fatalf("--fail-at-step 10: exit %d, stdout:\n%s", ex[0].code, ex[0].out)
	}
	out := ok(t, "sweep_toy.py", dir, 1, args...)
	pts, res := metrics(t, out, "score", "loss")
	if !reflect.DeepEqual(steps(pts), []int{15, 20}) || num(t, res, "resumed_from_step") != 10 {
		t.Errorf("the restarted run reported steps %v, result %v", steps(pts), res)
	}
	// Same world size: the resumed trajectory is the uninterrupted one, bit for bit.
	straight, _ := metrics(t, ok(t, "sweep_toy.py", t.TempDir(), 1, base...), "score", "loss")
	if !reflect.DeepEqual(pts, straight[2:]) {
		t.Errorf("after the restart %v, without one %v", pts, straight[2:])
	}
}

// TestBertMetricLines: bert_finetune.py's rank 0 reports a held-out point at
// every --eval-every step and at the end (the result's own figures), and a
// run killed mid-way and resumed re-reports the same values at the same
// global steps.
func TestBertMetricLines(t *testing.T) {
	needTorch(t)
	if testing.Short() {
		t.Skip("-short: about 10 s of CPU")
	}
	t.Parallel()
	args := []string{"--train-size", "512", "--eval-size", "200", "--steps", "12", "--checkpoint-every", "4",
		"--log-every", "4", "--eval-metric-size", "64"}
	keys := []string{"accuracy", "f1", "loss"}
	straight, res := metrics(t, ok(t, "bert_finetune.py", t.TempDir(), 2, args...), keys...)
	if got, want := steps(straight), []int{4, 8, 12}; !reflect.DeepEqual(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
	last := straight[len(straight)-1]
	if last.Values["accuracy"] != num(t, res, "accuracy") || last.Values["f1"] != num(t, res, "f1") {
		t.Errorf("the final point %v is not the result's %v", last, res)
	}

	dir := t.TempDir()
	killed := run(t, "bert_finetune.py", dir, 2, func(l string) bool {
		return strings.HasPrefix(l, sweepkv.MetricLinePrefix+`{"step": 8,`)
	}, append(args, "--sleep-per-step", "0.3")...)
	if strings.Contains(killed[0].out, sweepkv.ResultLinePrefix) {
		t.Fatalf("the run to kill finished:\n%s", killed[0].out)
	}
	out := ok(t, "bert_finetune.py", dir, 2, args...)
	resumed, res := metrics(t, out, keys...)
	from := int(num(t, res, "resumed_from_step"))
	if from != 4 && from != 8 {
		t.Fatalf("resumed from step %d, want 4 or 8:\n%s", from, out)
	}
	if len(resumed) == 0 || resumed[0].Step <= from {
		t.Fatalf("after resuming at step %d the points are %v", from, resumed)
	}
	for _, p := range resumed {
		for _, q := range straight {
			if q.Step == p.Step && !reflect.DeepEqual(p, q) {
				t.Errorf("step %d: %v after the resume, %v without", p.Step, p.Values, q.Values)
			}
		}
	}
}
