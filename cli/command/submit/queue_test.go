package submit

import (
	"context"
	"errors"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/queuefile"
	"github.com/gpujob/gpujob/internal/queue/queuekv"
	"github.com/gpujob/gpujob/internal/testagent"
)

// shared is the Consul the queue check reads (the queue configuration).
var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

// applyQueues stores the queue file src as the configuration for the test
// and removes it after.
func applyQueues(t *testing.T, src string) {
	t.Helper()
	c := shared.Client(t)
	f, _, diags := queuefile.Parse([]byte(src), "queues.hcl")
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	store := queuekv.New(c, "")
	_, idx, _ := store.Read(context.Background())
	rec := &queuekv.Record{Format: queuekv.Format, Queues: queuekv.Queues(f.Config), File: "queues.hcl", SHA256: f.SHA256,
		AppliedBy: "ops@test", AppliedAt: time.Unix(1764490000, 0).UTC()}
	if _, err := store.Write(context.Background(), rec, idx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.KV().Delete(store.Key(), nil) })
}

const teamQueues = `
queue "default" {}
queue "team-a" {
  gpus   = 1
  borrow = false
}
queue "team-b" {
  gpus   = 4
}
`

func TestSubmitIntoAQueue(t *testing.T) {
	applyQueues(t, teamQueues)
	f := cluster(t)
	var rendered []string
	parse := f.ParseHCLFunc
	f.ParseHCLFunc = func(src, vars string) (*api.Job, error) {
		rendered = append(rendered, src)
		return parse(src, vars)
	}
	spec := strings.Replace(goodSpec, "command", "queue = \"team-a\"\n  command", 1)
	// The spec's team-a (quota 1, no borrowing) could never hold 2 GPUs;
	// --queue team-b overrides it, and its meta says so.
	out, errOut, err := runCmd(t, f, "--detach", "--queue", "team-b", writeSpec(t, spec))
	if err != nil || len(f.Registered) != 1 {
		t.Fatalf("err %v, registered %d\n%s%s", err, len(f.Registered), out, errOut)
	}
	if len(rendered) != 1 || !regexp.MustCompile(contract.MetaQueue+`\s+= "team-b"`).MatchString(rendered[0]) {
		t.Errorf("rendered job's meta lacks the queue:\n%s", rendered)
	}
}

// Each refusal says why with the numbers or the queues, and nothing is
// planned or registered.
func TestSubmitRefusedByTheQueues(t *testing.T) {
	applyQueues(t, teamQueues)
	for _, tc := range []struct {
		name string
		args []string
		spec string
		want string
	}{
		{"unknown queue", []string{"--queue", "team-c"}, goodSpec, `unknown queue "team-c" (queues: default, team-a, team-b)`},
		{"unknown queue in the spec", nil, strings.Replace(goodSpec, "command", "queue = \"nope\"\n  command", 1), `unknown queue "nope"`},
		{"over the quota, borrowing off", []string{"--queue", "team-a"}, goodSpec,
			"job bert needs 2 GPUs; queue team-a's quota is 1 GPUs and borrowing is off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := cluster(t)
			planned := false
			f.PlanFunc = func(*api.Job) (*api.JobPlanResponse, error) { planned = true; return &api.JobPlanResponse{}, nil }
			_, _, err := runCmd(t, f, append(append([]string{"--detach"}, tc.args...), writeSpec(t, tc.spec))...)
			var exit *ExitError
			if !errors.As(err, &exit) || exit.Code != 1 || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "nothing was submitted") {
				t.Fatalf("error %v, want exit 1 saying %q", err, tc.want)
			}
			if len(f.Registered) != 0 || planned {
				t.Errorf("refused, but registered %d, planned %v", len(f.Registered), planned)
			}
		})
	}
}

// A configuration without a default queue refuses a job that names none,
// listing the queues it could name.
func TestSubmitWithoutQueueNeedsADefaultQueue(t *testing.T) {
	applyQueues(t, `queue "team-b" {}`)
	f := cluster(t)
	_, _, err := runCmd(t, f, "--detach", writeSpec(t, goodSpec))
	if err == nil || !strings.Contains(err.Error(), `names no queue, and the queue configuration has no queue "default"`) ||
		!strings.Contains(err.Error(), ": team-b") || len(f.Registered) != 0 {
		t.Fatalf("err %v, registered %d", err, len(f.Registered))
	}
}

// Without a configuration, --queue default is today's submit, and any
// other queue is unknown.
func TestSubmitWithoutConfiguration(t *testing.T) {
	f := cluster(t)
	if _, _, err := runCmd(t, f, "--detach", "--queue", "default", writeSpec(t, goodSpec)); err != nil || len(f.Registered) != 1 {
		t.Fatalf("err %v, registered %d", err, len(f.Registered))
	}
	f = cluster(t)
	if _, _, err := runCmd(t, f, "--detach", "--queue", "team-a", writeSpec(t, goodSpec)); err == nil ||
		!strings.Contains(err.Error(), `unknown queue "team-a" (queues: default)`) || len(f.Registered) != 0 {
		t.Fatalf("err %v, registered %d", err, len(f.Registered))
	}
}

// With no Consul to read the configuration from, a job that names no
// queue is submitted with a warning; one that names a queue is refused.
func TestSubmitWithoutConsul(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	unreachable := func() (*consul.Client, error) { return consul.NewClient(&consul.Config{Address: addr}) }
	f := cluster(t)
	_, errOut, err := runCmdConsul(t, f, unreachable, "--detach", writeSpec(t, goodSpec))
	if err != nil || len(f.Registered) != 1 || !strings.Contains(errOut, "warning: the queue configuration could not be read") {
		t.Fatalf("err %v, registered %d, stderr:\n%s", err, len(f.Registered), errOut)
	}
	f = cluster(t)
	_, _, err = runCmdConsul(t, f, unreachable, "--detach", "--queue", "team-a", writeSpec(t, goodSpec))
	if err == nil || !strings.Contains(err.Error(), "queue team-a cannot be checked") || len(f.Registered) != 0 {
		t.Fatalf("err %v, registered %d", err, len(f.Registered))
	}
}

// A configuration someone wrote behind gpujob's back refuses every
// submission rather than being believed.
func TestSubmitRefusesATamperedConfiguration(t *testing.T) {
	c := shared.Client(t)
	if _, err := c.KV().Put(&consul.KVPair{Key: contract.QueueConfigKey, Value: []byte(`{"format":1,"queues":[{"name":"default","gpus":-1}]}`)}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.KV().Delete(contract.QueueConfigKey, nil) })
	f := cluster(t)
	_, _, err := runCmd(t, f, "--detach", writeSpec(t, goodSpec))
	if err == nil || !strings.Contains(err.Error(), "is invalid") || len(f.Registered) != 0 {
		t.Fatalf("err %v, registered %d", err, len(f.Registered))
	}
}
