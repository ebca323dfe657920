package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// gpujob runs the CLI built by `make build` against the dev cluster and
// returns its stdout, stderr and exit code.
func (c *cluster) gpujob(t *testing.T, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	return c.gpujobEnv(t, append(os.Environ(), "NOMAD_ADDR="+c.env["NOMAD_ADDR"], "CONSUL_HTTP_ADDR="+c.env["CONSUL_HTTP_ADDR"]),
		timeout, args...)
}

// gpujobEnv is gpujob with the CLI's whole environment given.
func (c *cluster) gpujobEnv(t *testing.T, env []string, timeout time.Duration, args ...string) (string, string, int) {
	t.Helper()
	bin := filepath.Join(c.repo, "bin", "gpujob")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s missing: run make build", bin)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("gpujob %s did not finish in %s; stdout:\n%s\nstderr:\n%s", strings.Join(args, " "), timeout, out.String(), errOut.String())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func (c *cluster) workloadVar() string {
	return "workload=" + c.workload()
}

func TestCLISubmitStatusLogs(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	spec := filepath.Join(c.repo, "e2e", "testdata", "tiny-train.hcl")
	t.Cleanup(func() { c.purge("e2e-cli-train") })

	out, errOut, code := c.gpujob(t, 4*time.Minute, "submit", "-var", c.workloadVar(), spec)
	if code != 0 {
		t.Fatalf("submit exited %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"submitted e2e-cli-train", "rendezvous round 1 complete: 2 member(s), world size 2", "complete in", "result: accuracy"} {
		if !strings.Contains(out, want) {
			t.Errorf("submit's progress lacks %q:\n%s", want, out)
		}
	}

	// status -json agrees with the run.
	out, errOut, code = c.gpujob(t, time.Minute, "status", "-json", "e2e-cli-train")
	if code != 0 {
		t.Fatalf("status exited %d: %s", code, errOut)
	}
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status -json is not JSON: %v\n%s", err, out)
	}
	members, _ := st["members"].([]any)
	if len(members) != 2 {
		t.Fatalf("status lists %d members, want 2:\n%s", len(members), out)
	}
	ranks := map[float64]bool{}
	for _, m := range members {
		mm := m.(map[string]any)
		if mm["state"] != "complete" {
			t.Errorf("member state %v, want complete", mm["state"])
		}
		if r, ok := mm["node_rank"].(float64); ok {
			ranks[r] = true
		}
		if gpus, _ := mm["gpus"].([]any); len(gpus) != 1 {
			t.Errorf("member holds %d GPUs in status, want 1", len(gpus))
		}
	}
	if !ranks[0] || !ranks[1] {
		t.Errorf("node ranks %v, want 0 and 1", ranks)
	}

	// logs --rank 1 shows rank 1 alone.
	out, errOut, code = c.gpujob(t, time.Minute, "logs", "--rank", "1", "e2e-cli-train")
	if code != 0 {
		t.Fatalf("logs exited %d: %s", code, errOut)
	}
	lossLines := regexp.MustCompile(`gpujob: step=\d+ .*rank=(\d+) `).FindAllStringSubmatch(out, -1)
	if len(lossLines) == 0 {
		t.Fatalf("logs --rank 1 has no loss line:\n%s", out)
	}
	for _, m := range lossLines {
		if m[1] != "1" {
			t.Fatalf("logs --rank 1 shows a line of rank %s:\n%s", m[1], out)
		}
	}
}

func TestCLIUnplaceableSpecIsExplainedAndNotRegistered(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	// Another job holds two of the node's four GPUs.
	holder := gpuJob("e2e-holder", 2, `echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; exec sleep 600`)
	c.register(t, holder)
	allocs := c.waitAllocs(t, ctx(t, time.Minute), "e2e-holder", "running", allIn("running"))
	c.waitStdout(t, ctx(t, 30*time.Second), allocs[0].ID, "CUDA_VISIBLE_DEVICES=GPU-")

	// gpus shows who holds what.
	out, errOut, code := c.gpujob(t, time.Minute, "gpus", "-json")
	if code != 0 {
		t.Fatalf("gpus exited %d: %s", code, errOut)
	}
	if got := strings.Count(out, `"e2e-holder"`); got < 2 {
		t.Errorf("gpus -json names e2e-holder %d times, want once for each of its 2 GPUs:\n%s", got, out)
	}
	human, _, _ := c.gpujob(t, time.Minute, "gpus")
	if !strings.Contains(human, "Tesla T4") || !strings.Contains(human, "e2e-holder") {
		t.Errorf("gpus table lacks the model or the holder:\n%s", human)
	}

	spec := filepath.Join(c.repo, "e2e", "testdata", "too-big.hcl")
	out, errOut, code = c.gpujob(t, time.Minute, "submit", "--no-queue", spec)
	if code != 2 {
		t.Fatalf("submit --no-queue of an unplaceable spec exited %d, want 2\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"cannot be placed now", "needs 2 × 2 nvidia/gpu", "held by job e2e-holder"} {
		if !strings.Contains(out+errOut, want) {
			t.Errorf("explanation lacks %q:\n%s%s", want, out, errOut)
		}
	}
	if _, _, err := c.nomad.Jobs().Info("e2e-cli-too-big", nil); err == nil {
		t.Errorf("--no-queue registered the job")
	}
}

// TestCLIGroupLargerThanTheEmptyClusterIsRefused: a group the cluster could
// not hold even with nothing else running is refused at its workers line,
// naming the largest size that could fit, and nothing is registered; validate,
// which does not know the cluster, accepts the spec.
func TestCLIGroupLargerThanTheEmptyClusterIsRefused(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	spec := filepath.Join(c.repo, "e2e", "testdata", "too-many.hcl")
	t.Cleanup(func() { c.purge("e2e-cli-too-many") })
	if _, errOut, code := c.gpujob(t, time.Minute, "validate", spec); code != 0 {
		t.Fatalf("validate exited %d: %s", code, errOut)
	}
	out, errOut, code := c.gpujob(t, time.Minute, "submit", "--detach", spec)
	if code != 1 {
		t.Fatalf("submit of 5000 workers on a 4-GPU cluster exited %d, want 1\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	m := regexp.MustCompile(`too-many\.hcl:4:21: error: Spec cannot fit the cluster: train "e2e-cli-too-many": workers = 5000 cannot fit: ` +
		`the cluster could hold at most (\d+) workers of this size \(1 GPU\(s\), 1000 MHz CPU, 2048 MiB memory\) even when empty \(1 ready node\(s\): \S+ \d+ \((GPUs|CPU|memory)\)\)`).
		FindStringSubmatch(errOut)
	if m == nil {
		t.Fatalf("the refusal does not say why at the workers line:\n%s", errOut)
	}
	if most, _ := strconv.Atoi(m[1]); most < 1 || most > fakeGPUsPerClient || !strings.Contains(errOut, "nothing was submitted") {
		t.Errorf("at most %s workers on one node of %d GPUs, or no word that nothing was submitted:\n%s", m[1], fakeGPUsPerClient, errOut)
	}
	if _, _, err := c.nomad.Jobs().Info("e2e-cli-too-many", nil); err == nil {
		t.Errorf("a refused group was registered")
	}
}

func TestCLIBadSpecNamesFileAndLine(t *testing.T) {
	c := needCluster(t)
	spec := filepath.Join(c.repo, "e2e", "testdata", "bad.hcl")
	for _, cmd := range []string{"validate", "submit"} {
		_, errOut, code := c.gpujob(t, time.Minute, cmd, spec)
		if code != 1 {
			t.Errorf("%s of a bad spec exited %d, want 1", cmd, code)
		}
		for _, want := range []string{"bad.hcl:2:", "bad.hcl:4:"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s's errors lack %q:\n%s", cmd, want, errOut)
			}
		}
	}
	if _, _, err := c.nomad.Jobs().Info("e2e-cli-bad", nil); err == nil {
		t.Errorf("a bad spec registered a job")
	}
}
