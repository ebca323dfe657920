package top

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/observe"
	"github.com/gpujob/gpujob/internal/servekv"
)

// fixedSource is an Opener of src, already answered.
func fixedSource(src observe.Source) Opener {
	return func(context.Context, *factory.Factory, *Options) (observe.Source, string, <-chan struct{}, error) {
		ready := make(chan struct{})
		close(ready)
		return src, "http://nomad.test:4646", ready, nil
	}
}

func gateway(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/-/stats" {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(servekv.GatewayStats{Gateway: "gw-1", Services: map[string]servekv.Stats{
			"default/clf": {RPS: 7.5, P99Ms: 31.5, Errors: 1},
		}})
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// execute runs the command with args, reading src: through the runF
// seam, which hands the parsed Options to run with src as their Opener.
func execute(t *testing.T, src observe.Source, tty bool, args ...string) (string, string, error) {
	t.Helper()
	io, _, out, errOut := iostreams.Test()
	io.IsTTY = tty
	f := &factory.Factory{IO: io}
	cmd := NewCmdWith(f, func(ctx context.Context, o *Options) error {
		o.Open = fixedSource(src)
		return run(ctx, f, o)
	})
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	err := cmd.Execute()
	return out.String(), errOut.String(), err
}

func checkPlainFrame(t *testing.T, out string) {
	t.Helper()
	if strings.Contains(out, "\x1b") {
		t.Errorf("escape sequences in plain output: %q", out)
	}
	if strings.Contains(out, "q quits") || strings.Contains(out, "reading the cluster") {
		t.Errorf("plain output is not one finished frame:\n%s", out)
	}
	for _, want := range []string{"gpujob top  http://nomad.test:4646", "GPUS  2 nodes, 8 GPUs", "UNHEALTHY: XID 79",
		"default/bert.train[1] (<80% util)", "LOW UTIL: 1/4 GPUs <80%", "default/gpt-big", "default/lr-search",
		"default/clf", "7.5 req/s", "p99    31.5 ms"} {
		if !strings.Contains(out, want) {
			t.Errorf("plain output lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "GPUS  "); n != 1 {
		t.Errorf("%d frames printed, want 1", n)
	}
	if !strings.HasSuffix(out, "\n") {
		t.Errorf("output does not end with a newline")
	}
}

func TestPlainTextWithoutTTY(t *testing.T) {
	src := newFakeSource(fixture(1, 2))
	out, errOut, err := execute(t, src, false, "--gateway-admin", gateway(t))
	if err != nil {
		t.Fatalf("exit: %v (stderr %q)", err, errOut)
	}
	checkPlainFrame(t, out)
	if src.calls != 1 {
		t.Errorf("%d snapshots read, want 1", src.calls)
	}
}

func TestOnceOnATTY(t *testing.T) {
	out, _, err := execute(t, newFakeSource(fixture(1, 2)), true, "--once", "--gateway-admin", gateway(t))
	if err != nil {
		t.Fatal(err)
	}
	checkPlainFrame(t, out)
}

func TestJSON(t *testing.T) {
	out, _, err := execute(t, newFakeSource(fixture(1, 2)), true, "--json")
	if err != nil {
		t.Fatal(err)
	}
	var s observe.Snapshot
	if err := json.NewDecoder(bytes.NewBufferString(out)).Decode(&s); err != nil {
		t.Fatalf("not a snapshot: %v\n%s", err, out)
	}
	if len(s.Nodes) != 2 || len(s.Nodes[0].GPUs) != 4 || len(s.Jobs) != 1 || s.Jobs[0].Losses[3].Rank != 3 {
		t.Errorf("snapshot: %+v", s)
	}
}

func TestBadInterval(t *testing.T) {
	if _, _, err := execute(t, newFakeSource(fixture(1, 2)), false, "--interval", "0s"); err == nil || !strings.Contains(err.Error(), "--interval") {
		t.Errorf("--interval 0s: %v", err)
	}
}

func TestSnapshotErrorFails(t *testing.T) {
	src := newFakeSource(nil)
	src.err = context.DeadlineExceeded
	if _, _, err := execute(t, src, false); err == nil {
		t.Error("no error when the snapshot could not be read")
	}
}
