package submit

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
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

// realParse makes the fake Nomad parse a rendered jobspec with Nomad's own
// parser (`nomad job run -output`, local): a queued job's record holds
// the job as rendered, and the controller checks it.
func realParse(t *testing.T, f *nomadapi.Fake) {
	f.ParseHCLFunc = func(src, _ string) (*api.Job, error) {
		p := filepath.Join(t.TempDir(), "job.nomad.hcl")
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			return nil, err
		}
		cmd := exec.Command(nomadBin(), "job", "run", "-output", p)
		cmd.Env = append(os.Environ(), "NOMAD_ADDR=http://127.0.0.1:1")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s job run -output (make deps builds it): %v", nomadBin(), err)
		}
		var wrapped struct{ Job *api.Job }
		return wrapped.Job, json.Unmarshal(out, &wrapped)
	}
}

// nomadBin finds the Nomad binary the way scripts/lib.sh does.
func nomadBin() string {
	if b := os.Getenv("NOMAD_BIN"); b != "" {
		return b
	}
	cache := os.Getenv("GPUJOB_CACHE_DIR")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, _ := os.UserHomeDir()
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "gpujob")
	}
	return filepath.Join(cache, "nomad-1.6.3", "nomad")
}

// clearQueuedJobs removes the queued jobs' records and statuses a test
// wrote.
func clearQueuedJobs(t *testing.T) {
	c := shared.Client(t)
	t.Cleanup(func() {
		_, _ = c.KV().DeleteTree(contract.QueueJobsPrefix+"/", nil)
		_, _ = c.KV().DeleteTree(contract.QueueStatusPrefix+"/", nil)
	})
}

// In queue mode (a configuration exists) submit registers nothing: it
// writes the rendered job into its queue as a record the admission
// controller accepts — --queue over the spec's queue, in the job's meta
// too — and a second submission of the name is refused.
func TestSubmitIntoAQueue(t *testing.T) {
	applyQueues(t, teamQueues)
	clearQueuedJobs(t)
	f := cluster(t)
	realParse(t, f)
	spec := strings.Replace(goodSpec, "command", "queue = \"team-a\"\n  command", 1)
	// The spec's team-a (quota 1, no borrowing) could never hold 2 GPUs;
	// --queue team-b overrides it.
	out, errOut, err := runCmd(t, f, "--detach", "--queue", "team-b", writeSpec(t, spec))
	if err != nil || len(f.Registered) != 0 {
		t.Fatalf("err %v, registered %d\n%s%s", err, len(f.Registered), out, errOut)
	}
	if !strings.Contains(out, "queued bert in team-b: 2 worker(s) × 1 GPU(s)") || !strings.Contains(out, "follow it: gpujob status bert") {
		t.Errorf("output:\n%s", out)
	}
	kv, _, err := shared.Client(t).KV().Get(contract.QueueJobsPrefix+"/default/bert", nil)
	if err != nil || kv == nil {
		t.Fatalf("no record: %v", err)
	}
	rec, job, err := admit.DecodeJobRecord(kv.Value, time.Now())
	if err != nil {
		t.Fatalf("the controller would refuse the record: %v", err)
	}
	if rec.Queue != "team-b" || rec.Kind != admit.KindTrain || rec.Members != 2 || rec.PerMember.GPUs != 1 || rec.Priority != 0 ||
		job.Meta[contract.MetaQueue] != "team-b" || job.Meta[contract.MetaRun] == "" || rec.SubmittedBy == "" {
		t.Errorf("record %+v, meta %v", rec, job.Meta)
	}
	_, _, err = runCmd(t, f, "--detach", "--queue", "team-b", writeSpec(t, spec))
	if err == nil || !strings.Contains(err.Error(), "job bert is already in queue team-b (waiting") || len(f.Registered) != 0 {
		t.Fatalf("second submission: %v", err)
	}
	// -json: the outcome with the queue fields on stdout, progress on stderr.
	out, errOut, err = runCmd(t, f, "--detach", "--json", writeSpec(t, strings.Replace(goodSpec, `train "bert"`, `train "bert2"`, 1)))
	var res Result
	if err != nil || json.Unmarshal([]byte(out), &res) != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res.Job != "bert2" || !res.Queued || res.Outcome != "queued" || res.Queue == nil || res.Queue.Queue != "default" ||
		res.Queue.State != "waiting" || res.Queue.GPUs != 2 || !strings.Contains(errOut, "queued bert2 in default") {
		t.Errorf("result %+v %+v, stderr:\n%s", res, res.Queue, errOut)
	}
}

// Without --detach submit follows the job's place in the queue until the
// controller admits it, then the job as a direct submit does.
func TestSubmitFollowsTheQueueThenTheJob(t *testing.T) {
	applyQueues(t, teamQueues)
	clearQueuedJobs(t)
	f := cluster(t)
	realParse(t, f)
	c := shared.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	controller := make(chan error, 1)
	go func() { controller <- fakeController(ctx, c, f) }()
	out, errOut, err := runCmd(t, f, "--queue", "team-b", writeSpec(t, goodSpec))
	if err != nil {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
	if err := <-controller; err != nil {
		t.Fatal(err)
	}
	// (Each step of the queue in its own line: cli/queues' TestAwaitAdmission.)
	for _, want := range []string{"queued bert in team-b", "admitted by queue team-b",
		"placed bert.train[0] on node gpu-1", "complete in"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// fakeController answers the first record that appears as the admission
// controller would: queued at position 1, then admitted, registering the
// job in the fake Nomad, whose two members then complete.
func fakeController(ctx context.Context, c *consul.Client, f *nomadapi.Fake) error {
	var index uint64
	for {
		pairs, meta, err := c.KV().List(contract.QueueJobsPrefix+"/", (&consul.QueryOptions{WaitIndex: index}).WithContext(ctx))
		if err != nil {
			return err
		}
		index = meta.LastIndex
		if len(pairs) == 0 {
			continue
		}
		p := pairs[0]
		rec, job, err := admit.DecodeJobRecord(p.Value, time.Now())
		if err != nil {
			return err
		}
		key := contract.QueueStatusPrefix + "/" + rec.Namespace + "/" + rec.ID
		put := func(st admit.Status) error {
			st.Format, st.RecordIndex = admit.Format, p.CreateIndex
			b, err := admit.EncodeStatus(&st)
			if err == nil {
				_, err = c.KV().Put(&consul.KVPair{Key: key, Value: b}, nil)
			}
			return err
		}
		if err := put(admit.Status{State: admit.StateQueued, Position: 1, Reason: "1 job ahead"}); err != nil {
			return err
		}
		job.Meta[contract.MetaAdmission] = admit.Marker(p.CreateIndex, 1)
		if _, err := f.Register(job); err != nil {
			return err
		}
		for i := range 2 {
			f.SetAlloc(alloc(i, "complete"))
		}
		at := time.Now()
		return put(admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: &at})
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
