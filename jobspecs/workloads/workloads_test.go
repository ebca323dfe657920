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
	"net/http"
	"net/http/httptrace"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/testpriv"
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
		testpriv.Skip(t, "%s cannot import torch: %v (apt-get install python3-torch)", python, torchErr)
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

// ---------------------------------------------------------------- serve.py

// served is a running serve.py: its base URL, its stderr so far and, once it
// has exited, its exit code.
type served struct {
	url    string
	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	errb   strings.Builder
}

func (s *served) stderr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errb.String()
}

// startServe starts serve.py with the given extra environment and options
// (they must pick the port: PORT=0 or --port 0) and returns once its
// "serve: listening on" line is out, so the port is open. The process is
// killed when the test ends.
func startServe(t *testing.T, env []string, args ...string) *served {
	t.Helper()
	c := exec.Command(python, append([]string{script("serve.py")}, args...)...)
	c.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + os.TempDir(), "OMP_NUM_THREADS=1",
		"PYTHONDONTWRITEBYTECODE=1"}, env...)
	pipe, err := c.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	s := &served{cmd: c, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			l := sc.Text()
			s.mu.Lock()
			s.errb.WriteString(l + "\n")
			s.mu.Unlock()
			if rest, isListen := strings.CutPrefix(l, "serve: listening on "); isListen {
				addr <- strings.Fields(rest)[0]
			}
		}
		c.Wait()
		close(s.exited)
	}()
	t.Cleanup(func() {
		c.Process.Kill()
		<-s.exited
	})
	select {
	case a := <-addr:
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatalf("listening line address %q: %v", a, err)
		}
		s.url = "http://127.0.0.1:" + port
	case <-s.exited:
		t.Fatalf("serve.py %v exited %d before listening:\n%s", args, c.ProcessState.ExitCode(), s.stderr())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve.py %v did not listen within 30 s:\n%s", args, s.stderr())
	}
	return s
}

var serveClient = &http.Client{Timeout: 20 * time.Second}

// call sends one request and decodes the JSON object every response carries.
func call(t *testing.T, method, url, body string) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := serveClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	if resp.ContentLength != int64(len(raw)) {
		t.Errorf("%s %s: Content-Length %d, body of %d bytes", method, url, resp.ContentLength, len(raw))
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s %s: %d, body %q is not a JSON object: %v", method, url, resp.StatusCode, raw, err)
	}
	return resp.StatusCode, resp.Header, m
}

// waitHealthy polls /healthz until it answers 200; a refused connection or a
// status other than 503 before that fails the test.
func waitHealthy(t *testing.T, s *served, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, _, m := call(t, "GET", s.url+"/healthz", "")
		if code == 200 {
			if m["status"] != "ok" {
				t.Fatalf("/healthz 200 with %v", m)
			}
			return
		}
		if code != 503 || m["status"] != "loading" {
			t.Fatalf("/healthz before healthy: %d %v", code, m)
		}
		if time.Now().After(deadline) {
			t.Fatalf("not healthy within %v:\n%s", within, s.stderr())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type prediction struct {
	Label string
	Score float64
}

// predict POSTs {"text": text} and checks the response's shape.
func predict(t *testing.T, s *served, version, text string) prediction {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"text": text})
	code, hdr, m := call(t, "POST", s.url+"/predict", string(body))
	if code != 200 {
		t.Fatalf("/predict %q: %d %v\n%s", text, code, m, s.stderr())
	}
	label, _ := m["label"].(string)
	score, isNum := m["score"].(float64)
	if label != "positive" && label != "negative" || !isNum || score < 0 || score > 1 ||
		m["version"] != version || hdr.Get("X-Model-Version") != version {
		t.Fatalf("/predict %q: %v, X-Model-Version %q; want a label, a score in [0,1] and version %q",
			text, m, hdr.Get("X-Model-Version"), version)
	}
	if r, _ := m["replica"].(string); r == "" {
		t.Errorf("/predict %q: no replica in %v", text, m)
	}
	return prediction{label, score}
}

// Sentences from bert_finetune.py's templates: clearly positive, clearly
// negative, negated, contrasted, and with a name the vocabulary lacks.
var serveTexts = []string{
	"the movie was great",
	"honestly , the acting was really wonderful !",
	"the plot was terrible",
	"this film felt extremely boring . would watch again",
	"the ending was not good",
	"the cast was dull , but the score was superb .",
	"the lead by kasar77 seemed brilliant",
}

// TestServeCheckpoint: serve.py serves the checkpoint of a short
// bert_finetune.py run: the labels, scores, version and replica are there,
// an input scores the same every time (also alone vs. in a batch, and under
// concurrent requests), two servers of the checkpoint agree exactly, and a
// freshly initialised server with the training's options (its step-0 weights)
// does not.
func TestServeCheckpoint(t *testing.T) {
	needTorch(t)
	t.Parallel()
	dir := t.TempDir()
	ok(t, "bert_finetune.py", dir, 1, "--train-size", "256", "--eval-size", "50", "--steps", "8",
		"--checkpoint-every", "0", "--eval-every", "0", "--log-every", "8")
	a := startServe(t, []string{"PORT=0", "NOMAD_ALLOC_ID=alloc-a"}, "--checkpoint", dir, "--version", "v-test")
	b := startServe(t, []string{"PORT=0", "GPUJOB_SERVICE_VERSION=v-test"}, "--checkpoint", dir)
	fresh := startServe(t, []string{"GPUJOB_SERVICE_VERSION=v-fresh"}, "--port", "0", "--no-checkpoint",
		"--train-args", "--train-size 256")
	for _, s := range []*served{a, b, fresh} {
		waitHealthy(t, s, 60*time.Second)
	}
	if !strings.Contains(a.stderr(), "serve: model loaded from "+filepath.Join(dir, "ckpt-000000008.pt")+" (step 8)") {
		t.Errorf("no model-loaded line for the step-8 checkpoint:\n%s", a.stderr())
	}
	code, hdr, info := call(t, "GET", a.url+"/", "")
	if code != 200 || info["loaded"] != true || info["step"] != 8.0 || info["replica"] != "alloc-a" ||
		info["version"] != "v-test" || hdr.Get("X-Model-Version") != "v-test" {
		t.Errorf("GET /: %d %v", code, info)
	}

	want := make([]prediction, len(serveTexts))
	differs := false
	for i, text := range serveTexts {
		want[i] = predict(t, a, "v-test", text)
		if again := predict(t, a, "v-test", text); again != want[i] {
			t.Errorf("%q: %v, then %v", text, want[i], again)
		}
		if other := predict(t, b, "v-test", text); other != want[i] {
			t.Errorf("%q: %v from one server of the checkpoint, %v from another", text, want[i], other)
		}
		f := predict(t, fresh, "v-fresh", text)
		differs = differs || math.Abs(f.Score-want[i].Score) > 1e-4
		t.Logf("%-50q %s %.4f (fresh: %s %.4f)", text, want[i].Label, want[i].Score, f.Label, f.Score)
	}
	if !differs {
		t.Errorf("the freshly initialised model scores like the trained checkpoint")
	}

	// A batch scores like the texts one by one.
	body, _ := json.Marshal(map[string][]string{"texts": serveTexts})
	code, _, m := call(t, "POST", a.url+"/predict", string(body))
	preds, _ := m["predictions"].([]any)
	if code != 200 || len(preds) != len(serveTexts) || m["version"] != "v-test" || m["replica"] != "alloc-a" {
		t.Fatalf("batch /predict: %d %v", code, m)
	}
	for i, p := range preds {
		p, _ := p.(map[string]any)
		if p["label"] != want[i].Label || math.Abs(p["score"].(float64)-want[i].Score) > 1e-5 {
			t.Errorf("%q in a batch: %v, alone %v", serveTexts[i], p, want[i])
		}
	}

	// Concurrent requests (one thread each on the server) get the same answers.
	var wg sync.WaitGroup
	got := make([][]prediction, 8)
	for g := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2 * len(serveTexts) {
				text := serveTexts[(g+i)%len(serveTexts)]
				body, _ := json.Marshal(map[string]string{"text": text})
				resp, err := serveClient.Post(a.url+"/predict", "application/json", strings.NewReader(string(body)))
				if err != nil {
					t.Error(err)
					return
				}
				var p prediction
				err = json.NewDecoder(resp.Body).Decode(&p)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					t.Errorf("concurrent /predict: %d %v", resp.StatusCode, err)
					return
				}
				if p != want[(g+i)%len(serveTexts)] {
					t.Errorf("concurrent /predict %q: %v, want %v", text, p, want[(g+i)%len(serveTexts)])
				}
			}
		}()
	}
	wg.Wait()
}

// TestServeLoadDelay: with --load-delay 2 the port is open at once; /healthz
// answers 503 loading and /predict 503 until the model is loaded, then 200.
func TestServeLoadDelay(t *testing.T) {
	needTorch(t)
	t.Parallel()
	s := startServe(t, []string{"PORT=0"}, "--no-checkpoint", "--load-delay", "2", "--version", "v2")
	listening := time.Now()
	code, hdr, m := call(t, "GET", s.url+"/healthz", "")
	if code != 503 || m["status"] != "loading" || hdr.Get("X-Model-Version") != "v2" {
		t.Fatalf("/healthz right after listening: %d %v", code, m)
	}
	if code, _, m := call(t, "POST", s.url+"/predict", `{"text": "the movie was great"}`); code != 503 || m["error"] == nil {
		t.Errorf("/predict while loading: %d %v", code, m)
	}
	if code, _, m := call(t, "GET", s.url+"/", ""); code != 200 || m["loaded"] != false {
		t.Errorf("GET / while loading: %d %v", code, m)
	}
	waitHealthy(t, s, 60*time.Second)
	if d := time.Since(listening); d < 1900*time.Millisecond {
		t.Errorf("healthy %v after listening, before the 2 s load delay", d)
	}
	predict(t, s, "v2", "the plot was terrible")
	if !strings.Contains(s.stderr(), "serve: model loaded from a fresh initialisation") {
		t.Errorf("no model-loaded line:\n%s", s.stderr())
	}
}

// TestServeBadInput: malformed requests get a JSON error (400, 404, 405)
// on a connection that stays open; no port is exit 2.
func TestServeBadInput(t *testing.T) {
	needTorch(t)
	t.Parallel()
	c := exec.Command(python, script("serve.py"), "--no-checkpoint")
	c.Env = []string{"PATH=/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE=1"}
	if out, err := c.CombinedOutput(); c.ProcessState.ExitCode() != 2 || !strings.Contains(string(out), "PORT") {
		t.Errorf("without $PORT or --port: %v\n%s", err, out)
	}

	s := startServe(t, []string{"PORT=0"}, "--no-checkpoint")
	waitHealthy(t, s, 60*time.Second)
	cl := &http.Client{Transport: &http.Transport{}, Timeout: 20 * time.Second} // its own connection pool
	defer cl.CloseIdleConnections()
	var conns int
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
		if !i.Reused {
			conns++
		}
	}}
	for _, tc := range []struct {
		method, path, body string
		code               int
	}{
		{"POST", "/predict", `{"text": "the movie`, 400},
		{"POST", "/predict", `not json`, 400},
		{"POST", "/predict", `{}`, 400},
		{"POST", "/predict", `{"txt": "the movie was great"}`, 400},
		{"POST", "/predict", `{"text": 7}`, 400},
		{"POST", "/predict", `{"texts": []}`, 400},
		{"POST", "/predict", `{"texts": ["good", 1]}`, 400},
		{"POST", "/predict", `["the movie was great"]`, 400},
		{"POST", "/predict", `{"text": "the movie was great", "texts": ["good"]}`, 400},
		{"GET", "/nope", "", 404},
		{"POST", "/healthz/x", `{"text": "good"}`, 404},
		{"GET", "/predict", "", 405},
		{"POST", "/predict", `{"text": "the movie was great"}`, 200},
	} {
		var rd io.Reader
		if tc.body != "" {
			rd = strings.NewReader(tc.body)
		}
		req, _ := http.NewRequest(tc.method, s.url+tc.path, rd)
		req = req.WithContext(httptrace.WithClientTrace(context.Background(), trace))
		resp, err := cl.Do(req)
		if err != nil {
			t.Fatalf("%s %s %s: %v", tc.method, tc.path, tc.body, err)
		}
		var m map[string]any
		err = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if err != nil || resp.StatusCode != tc.code || (tc.code != 200) != (m["error"] != nil) ||
			resp.Header.Get("X-Model-Version") != "v0" {
			t.Errorf("%s %s %s: %d %v (%v), want %d", tc.method, tc.path, tc.body, resp.StatusCode, m, err, tc.code)
		}
	}
	if conns != 1 {
		t.Errorf("%d connections for the requests, want 1 kept alive", conns)
	}
}

// TestServeSIGTERM: SIGTERM during a slow request (--service-time 1) stops
// the listener, lets the request finish with 200, and exits 0.
func TestServeSIGTERM(t *testing.T) {
	needTorch(t)
	t.Parallel()
	s := startServe(t, []string{"PORT=0"}, "--no-checkpoint", "--service-time", "1", "--version", "v9")
	waitHealthy(t, s, 60*time.Second)
	type result struct {
		code int
		m    map[string]any
		err  error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		resp, err := serveClient.Post(s.url+"/predict", "application/json", strings.NewReader(`{"text": "the movie was great"}`))
		if err != nil {
			done <- result{err: err}
			return
		}
		defer resp.Body.Close()
		var m map[string]any
		err = json.NewDecoder(resp.Body).Decode(&m)
		done <- result{resp.StatusCode, m, err}
	}()
	for {
		if _, _, info := call(t, "GET", s.url+"/", ""); info["in_flight"] == 1.0 {
			break
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the slow request is not in flight after 10 s:\n%s", s.stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The listener closes while the request is still being served.
	var r result
	for refused := false; !refused; {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(s.url, "http://"), time.Second)
		if refused = err != nil; !refused {
			c.Close()
		}
		select {
		case r = <-done:
			t.Fatalf("the in-flight request finished (%d %v %v) before the listener closed", r.code, r.m, r.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	r = <-done
	if r.err != nil || r.code != 200 || r.m["version"] != "v9" {
		t.Fatalf("the in-flight request: %d %v %v\n%s", r.code, r.m, r.err, s.stderr())
	}
	if d := time.Since(start); d < time.Second {
		t.Errorf("the request took %v, less than its 1 s service time", d)
	}
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10 s after SIGTERM:\n%s", s.stderr())
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0:\n%s", code, s.stderr())
	}
	if e := s.stderr(); !strings.Contains(e, "serve: SIGTERM: draining (") || !strings.Contains(e, "serve: stopped\n") {
		t.Errorf("stderr:\n%s", e)
	}
}

// TestServeFailHealth: --fail-health loads the model but /healthz never
// answers 200.
func TestServeFailHealth(t *testing.T) {
	needTorch(t)
	t.Parallel()
	s := startServe(t, []string{"PORT=0"}, "--no-checkpoint", "--fail-health")
	deadline := time.Now().Add(60 * time.Second)
	loadedPolls := 0
	for loadedPolls < 5 {
		code, _, m := call(t, "GET", s.url+"/healthz", "")
		if code != 503 || m["status"] != "failing" {
			t.Fatalf("/healthz with --fail-health: %d %v", code, m)
		}
		if _, _, info := call(t, "GET", s.url+"/", ""); info["loaded"] == true {
			loadedPolls++
		}
		if time.Now().After(deadline) {
			t.Fatalf("the model did not load within 60 s:\n%s", s.stderr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	predict(t, s, "v0", "the movie was great")
}
