package driver

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
	"github.com/gpujob/gpujob/internal/taskevent"
)

// A sweep's trial through the driver: rank 0's metric lines reach the
// trial's record in Consul, held by the supervisor's session; the trial's
// stop request ends the task with 0 and a task event that says why, and
// leaves the record without a session and nothing of the run in Consul.
func TestSweepTrialReportsMetricsAndObeysItsStop(t *testing.T) {
	h := harness(t, Config{})
	out := t.TempDir()
	tc := TaskConfig{Command: "/bin/sh", Sweep: "sweep", Trial: "t1",
		Args: []string{"-c", `echo $$ > "$OUT/pid"; i=0
while :; do i=$((i+1)); echo "epoch $i"; echo "gpujob-metric: {\"step\": $i, \"loss\": 1, \"phase\": \"train\"}"; sleep 0.05; done`},
		Env: []map[string]string{{"OUT": out}}}
	cfg := member(t, h, "trialjob", 0, ports(t, 1)[0], tc)
	events, err := h.TaskEvents(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.StartTask(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.DestroyTask(cfg.ID, true) })
	exited, err := h.WaitTask(context.Background(), cfg.ID)
	if err != nil {
		t.Fatal(err)
	}
	c, err := consul.NewClient(&consul.Config{Address: consulAddr(t)})
	if err != nil {
		t.Fatal(err)
	}
	key := sweepkv.MetricsKey(sweepkv.DefaultPrefix, "default", "sweep", "t1")
	stopKey := sweepkv.StopKey(sweepkv.DefaultPrefix, "default", "sweep", "t1")
	t.Cleanup(func() { _, _ = c.KV().DeleteTree(sweepkv.SweepKey(sweepkv.DefaultPrefix, "default", "sweep"), nil) })
	record := func() (*consul.KVPair, sweepkv.Metrics) {
		pair, _, err := c.KV().Get(key, nil)
		if err != nil {
			t.Fatal(err)
		}
		var m sweepkv.Metrics
		if pair != nil {
			if err := json.Unmarshal(pair.Value, &m); err != nil {
				t.Fatalf("record %s: %v", pair.Value, err)
			}
		}
		return pair, m
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		pair, m := record()
		if pair != nil && pair.Session != "" && len(m.Points) >= 3 {
			if p := m.Points[0]; p.Step != 1 || p.Values["loss"] != 1 || len(p.Values) != 1 {
				t.Errorf("first point %+v, want step 1 with loss 1 alone", p)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record with points held by a session: %+v; stderr:\n%s", pair, stderr(t, cfg))
		}
		time.Sleep(50 * time.Millisecond)
	}
	req := sweepkv.StopRequest{Reason: "stopped by ASHA at step 3: 0.71 < rung cut 0.78", At: time.Now().UTC()}
	b, _ := json.Marshal(req)
	if _, err := c.KV().Put(&consul.KVPair{Key: stopKey, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	asked := time.Now()
	select {
	case r := <-exited:
		if !r.Successful() {
			t.Fatalf("the stopped trial exited %+v; stderr:\n%s", r, stderr(t, cfg))
		}
		t.Logf("exited %s after the request", time.Since(asked).Round(time.Millisecond))
		if d := time.Since(asked); d > 5*time.Second {
			t.Errorf("the trial took %s to stop", d)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("the trial did not stop; stderr:\n%s", stderr(t, cfg))
	}
	var found bool
	for timeout := time.After(5 * time.Second); !found; {
		select {
		case e := <-events:
			te, ok := taskevent.Decode(e.Annotations)
			if ok && te.Kind == taskevent.TrialStopped {
				found = true
				if e.Message != req.Reason || te.Stop.Reason != req.Reason || !te.Stop.At.Equal(req.At) {
					t.Errorf("event %q %+v, want the request's reason and time", e.Message, te.Stop)
				}
			}
		case <-timeout:
			t.Fatal("no trial_stopped task event")
		}
	}
	if pair, m := record(); pair == nil || pair.Session != "" || len(m.Points) < 3 {
		t.Errorf("after the exit the record is %+v with %d points; want it kept, without a session", pair, len(m.Points))
	}
	b, _ = os.ReadFile(filepath.Join(out, "pid"))
	if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid <= 0 || syscall.Kill(pid, 0) == nil {
		t.Errorf("rank %d outlived the trial's stop", pid)
	}
	// The rendezvous run is gone, and so are the run's sessions (the
	// reporter's is named after the run too).
	consulEmpty(t, "default/trialjob")
}
