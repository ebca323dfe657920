package status

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs/fixture"
	"github.com/gpujob/gpujob/cli/iostreams"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
	"github.com/gpujob/gpujob/internal/testagent"
)

var shared testagent.Lazy

func TestMain(m *testing.M) { os.Exit(shared.Main(m)) }

func executeConsul(t *testing.T, f *nomadapi.Fake, c *consul.Client, args ...string) (string, error) {
	t.Helper()
	ios, _, out, errOut := iostreams.Test()
	fac := &factory.Factory{IO: ios, Now: func() time.Time { return fixture.Epoch },
		Nomad:  func() (nomadapi.API, error) { return f, nil },
		Consul: func() (*consul.Client, error) { return c, nil }}
	cmd := NewCmd(fac)
	cmd.SetArgs(args)
	cmd.SetOut(out)
	cmd.SetErr(errOut)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.Execute()
	return out.String() + errOut.String(), err
}

// queued writes job id's record and the controller's status of it.
func queued(t *testing.T, c *consul.Client, id string, st admit.Status) {
	t.Helper()
	job := fixture.TrainJob(id, 2, 1)
	job.Meta[contract.MetaQueue] = "team-a"
	e, err := queues.Records{Consul: c}.Enqueue(context.Background(), queues.EnqueueOptions{Job: job, Namespace: "default",
		Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "alice", Now: fixture.Epoch})
	if err != nil {
		t.Fatal(err)
	}
	st.Format, st.RecordIndex = admit.Format, e.RecordIndex
	b, err := admit.EncodeStatus(&st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(&consul.KVPair{Key: contract.QueueStatusPrefix + "/default/" + id, Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = c.KV().DeleteTree(contract.QueueJobsPrefix+"/", nil)
		_, _ = c.KV().DeleteTree(contract.QueueStatusPrefix+"/", nil)
	})
}

// A job still in its queue has no Nomad job: status shows it as queued,
// with its place, reason and estimate, in words and in -json.
func TestStatusOfAQueuedJob(t *testing.T) {
	c := shared.Client(t)
	est := fixture.Epoch.Add(5 * time.Minute)
	queued(t, c, "waiting", admit.Status{State: admit.StateQueued, Position: 2, Reason: "1 job ahead; team-a uses 8 of its 8 GPUs; borrowing off", EstimatedStart: &est})
	f := nomadapi.NewFake()
	out, err := executeConsul(t, f, c, "waiting")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"Job waiting: 2 worker(s) × 1 GPU(s), submitted by alice",
		"Queue: queued in team-a (position 2): 1 job ahead; team-a uses 8 of its 8 GPUs; borrowing off, estimated start",
		"(in 5m0s)", "gpujob stop waiting withdraws it"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, err = executeConsul(t, f, c, "waiting", "--json")
	var st Status
	if err != nil || json.Unmarshal([]byte(out), &st) != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if st.State != "queued" || st.NomadStatus != "" || st.Queue == nil || st.Queue.Position != 2 || st.Queue.Queue != "team-a" ||
		st.Queue.EstimatedStart == nil || st.Workers != 2 {
		t.Errorf("json %+v %+v", st, st.Queue)
	}
}

// A preempted job says who preempted it and why, beside its members.
func TestStatusOfAPreemptedJob(t *testing.T) {
	c := shared.Client(t)
	at := fixture.Epoch
	queued(t, c, "bert", admit.Status{State: admit.StatePreempted, Admissions: 1, AdmittedAt: &at, PreemptedBy: "default/big",
		PreemptedWhy: "priority 90 over 50", PreemptedAt: &at, Preemptions: 1})
	f := nomadapi.NewFake()
	job := fixture.TrainJob("bert", 2, 1)
	f.SetJob(job)
	n := fixture.Node("n1", "node-1", "Tesla T4", 15360, true)
	f.SetAlloc(fixture.Alloc(job, "a0000000", 0, n, "running", nil))
	out, err := executeConsul(t, f, c, "bert")
	if err != nil || !strings.Contains(out, "Queue: preempted by default/big: priority 90 over 50; it stops and is queued again in team-a at its old place") {
		t.Fatalf("%v\n%s", err, out)
	}
	out, _ = executeConsul(t, f, c, "bert", "--json")
	if !strings.Contains(out, `"preempted_by": "default/big"`) {
		t.Errorf("json:\n%s", out)
	}
}
