package top

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	nomadfix "github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/servekv"
	"github.com/gpujob/gpujob/internal/testpriv"
)

// fakeCluster serves a nomadapi.Fake over Nomad's HTTP API (the endpoints
// the watcher reads, blocking queries included, their wait cut to 300 ms),
// Consul's KV (no sweeps) and the gateway's /-/stats.
func fakeCluster(t *testing.T) *httptest.Server {
	t.Helper()
	f := nomadapi.NewFake()
	gpus := func(p string) []nomadfix.GPU {
		var out []nomadfix.GPU
		for i := range 4 {
			out = append(out, nomadfix.GPU{ID: p + strconv.Itoa(i), Healthy: i != 3, HealthMsg: map[bool]string{true: "XID 79"}[i == 3]})
		}
		return out
	}
	a := nomadfix.Node("node-a-id", "node-a", "Tesla T4", 16384, true, gpus("GPU-a")...)
	b := nomadfix.Node("node-b-id", "node-b", "Tesla T4", 16384, true, gpus("GPU-b")...)
	f.SetNode(a)
	f.SetNode(b)
	sample := func(util int64) nomadfix.Sample {
		return nomadfix.Sample{UtilPct: nomadfix.Int(util), MemUsedMiB: nomadfix.Int(util * 100), MemTotal: nomadfix.Int(16384),
			TempC: nomadfix.Int(55), PowerW: nomadfix.Float(40), PowerLimitW: nomadfix.Float(70)}
	}
	f.SetNodeStats(a.ID, nomadfix.Stats("Tesla T4", map[string]nomadfix.Sample{"GPU-a0": sample(97), "GPU-a1": sample(42),
		"GPU-a2": sample(0), "GPU-a3": sample(0)}))
	f.SetNodeStats(b.ID, nomadfix.Stats("Tesla T4", map[string]nomadfix.Sample{"GPU-b0": sample(60), "GPU-b1": sample(5),
		"GPU-b2": sample(0), "GPU-b3": sample(0)}))
	job := nomadfix.TrainJob("bert", 2, 1)
	f.SetJob(job)
	f.SetAlloc(nomadfix.Alloc(job, "11111111-1111-1111-1111-111111111111", 0, a, "running", []string{"GPU-a0"}))
	f.SetAlloc(nomadfix.Alloc(job, "22222222-2222-2222-2222-222222222222", 1, b, "running", []string{"GPU-b0"}))

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		if strings.HasPrefix(r.URL.Path, "/v1/kv/") { // Consul: no sweeps
			if v.Get("index") != "" {
				select {
				case <-time.After(300 * time.Millisecond):
				case <-r.Context().Done():
				}
			}
			w.Header().Set("X-Consul-Index", "5")
			_, _ = w.Write([]byte("[]"))
			return
		}
		if r.URL.Path == "/-/stats" {
			_ = json.NewEncoder(w).Encode(servekv.GatewayStats{Services: map[string]servekv.Stats{"default/clf": {RPS: 3}}})
			return
		}
		q := &api.QueryOptions{Params: map[string]string{}}
		if s := v.Get("index"); s != "" {
			q.WaitIndex, _ = strconv.ParseUint(s, 10, 64)
			q.WaitTime = 300 * time.Millisecond
		}
		for _, k := range []string{"resources", "task_states", "meta"} {
			if v.Get(k) != "" {
				q.Params[k] = v.Get(k)
			}
		}
		var out any
		var err error
		switch p := r.URL.Path; {
		case p == "/v1/nodes":
			out, _, err = f.Nodes(q)
		case p == "/v1/allocations":
			out, _, err = f.Allocations(q)
		case p == "/v1/jobs":
			out, _, err = f.Jobs(q)
		case p == "/v1/client/stats":
			out, err = f.NodeStats(v.Get("node_id"))
		case strings.HasPrefix(p, "/v1/allocation/"):
			out, err = f.Allocation(strings.TrimPrefix(p, "/v1/allocation/"))
		default:
			http.NotFound(w, r)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		_, meta, _ := f.Nodes(nil)
		w.Header().Set("X-Nomad-Index", strconv.FormatUint(meta.LastIndex, 10))
		w.Header().Set("X-Nomad-KnownLeader", "true")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv
}

// TestTmux runs the gpujob binary's `top` in a detached tmux session of
// 120x40 against the fake cluster: the GPU rows appear, q quits with
// status 0, and the pane is back on the shell's screen (alternate screen
// off, cursor shown).
func TestTmux(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	tmux := testpriv.NeedCommand(t, "tmux", "apt-get install tmux")
	start := time.Now()
	dir, err := os.MkdirTemp("", "top") // short: the tmux socket's path is limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "gpujob")
	build := exec.Command("go", "build", "-o", bin, "github.com/gpujob/gpujob/cli/cmd/gpujob")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	t.Logf("built in %s", time.Since(start).Round(time.Millisecond))
	srv := fakeCluster(t)

	sock := filepath.Join(dir, "sock")
	run := func(args ...string) (string, error) {
		c := exec.Command(tmux, append([]string{"-S", sock, "-u", "-f", "/dev/null"}, args...)...)
		c.Env = append(os.Environ(), "LANG=C.UTF-8", "LC_ALL=C.UTF-8")
		out, err := c.CombinedOutput()
		return string(out), err
	}
	shell := "env -i PATH=/usr/bin:/bin HOME=" + dir + " TERM=screen-256color LANG=C.UTF-8 LC_ALL=C.UTF-8 PS1='$ ' sh"
	if out, err := run("new-session", "-d", "-s", "top", "-x", "120", "-y", "40", shell); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = run("kill-server") })
	capture := func() string {
		out, _ := run("capture-pane", "-p", "-t", "top")
		return out
	}
	waitFor := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			pane := capture()
			if ok(pane) {
				return pane
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s within 10s; the pane:\n%s", what, pane)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	cmdline := "NOMAD_ADDR=" + srv.URL + " CONSUL_HTTP_ADDR=" + strings.TrimPrefix(srv.URL, "http://") +
		" GPUJOB_GATEWAY_ADMIN_ADDR=" + srv.URL + " " + bin + " top --interval 1s; echo EXIT=$?"
	waitFor("the shell's prompt", func(p string) bool { return strings.Contains(p, "$") })
	if out, err := run("send-keys", "-t", "top", cmdline, "Enter"); err != nil {
		t.Fatalf("send-keys: %v\n%s", err, out)
	}
	// The sections come from separate watches (GPUs, jobs, services), so
	// a frame may show some before the others on a loaded machine: wait
	// for one that has them all.
	wants := []string{"GPUS  2 nodes, 8 GPUs", "default/bert.train[1]", " 97%", "node-a  ready  4 GPUs, 1 held, 1 UNHEALTHY",
		"UNHEALTHY: XID 79", "default/bert.train[0]", "(<80% util)", "default/clf", "(q quits)"}
	pane := waitFor("a frame with every section", func(p string) bool {
		for _, want := range wants {
			if !strings.Contains(p, want) {
				return false
			}
		}
		return true
	})
	t.Logf("frame after %s:\n%s", time.Since(start).Round(time.Millisecond), pane)
	for _, l := range strings.Split(pane, "\n") {
		if n := width.StringWidth(l); n > 120 {
			t.Errorf("line of %d cells: %q", n, l)
		}
	}
	if alt, _ := run("display-message", "-p", "-t", "top", "#{alternate_on}"); strings.TrimSpace(alt) != "1" {
		t.Errorf("top is not on the alternate screen: %q", alt)
	}

	if out, err := run("send-keys", "-t", "top", "q"); err != nil {
		t.Fatalf("send-keys q: %v\n%s", err, out)
	}
	exited := regexp.MustCompile(`EXIT=(\d+)`) // not the typed "echo EXIT=$?"
	pane = waitFor("exit", exited.MatchString)
	if exited.FindStringSubmatch(pane)[1] != "0" {
		t.Errorf("gpujob top did not exit 0:\n%s", pane)
	}
	if strings.Contains(pane, "GPUS") {
		t.Errorf("the frame is still on the screen after q:\n%s", pane)
	}
	if !strings.Contains(pane, "$ ") {
		t.Errorf("no shell prompt after q:\n%s", pane)
	}
	state, _ := run("display-message", "-p", "-t", "top", "#{alternate_on} #{cursor_flag} #{pane_current_command}")
	if f := strings.Fields(state); len(f) < 2 || f[0] != "0" || f[1] != "1" {
		t.Errorf("terminal not restored (alternate screen, cursor shown): %q", state)
	}
	if _, err := os.Stat(bin); errors.Is(err, os.ErrNotExist) {
		t.Error("binary gone")
	}
	t.Logf("whole test %s", time.Since(start).Round(time.Millisecond))
}
