package stop

import (
	"context"
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

// queue writes job id's record into the queue, as submit does.
func queue(t *testing.T, c *consul.Client, id string) *queues.Entry {
	t.Helper()
	job := fixture.TrainJob(id, 2, 1)
	job.Meta[contract.MetaQueue] = "team-a"
	e, err := queues.Records{Consul: c}.Enqueue(context.Background(), queues.EnqueueOptions{Job: job, Namespace: "default",
		Queue: "team-a", Kind: admit.KindTrain, SubmittedBy: "alice", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.KV().DeleteTree(contract.QueueJobsPrefix+"/", nil) })
	return e
}

// Stopping a job still in its queue withdraws its record and says so;
// nothing is deregistered in Nomad.
func TestStopAQueuedJob(t *testing.T) {
	c := shared.Client(t)
	queue(t, c, "waiting")
	f := nomadapi.NewFake()
	out, err := executeConsul(t, f, c, "waiting")
	if err != nil || !strings.Contains(out, "Job waiting withdrawn from queue team-a (it was waiting; nothing of it ran).") {
		t.Fatalf("%v\n%s", err, out)
	}
	if e, _ := (queues.Records{Consul: c}).Get(context.Background(), "default", "waiting"); e != nil {
		t.Errorf("the record stays")
	}
	if _, err := executeConsul(t, f, c, "waiting"); err == nil || !strings.Contains(err.Error(), `job "waiting" not found`) {
		t.Errorf("a second stop: %v", err)
	}
}

// Stopping an admitted job deletes its record too, so the controller does
// not requeue it, and stops it in Nomad as before.
func TestStopAnAdmittedJob(t *testing.T) {
	c := shared.Client(t)
	e := queue(t, c, "bert")
	at := time.Now()
	b, err := admit.EncodeStatus(&admit.Status{Format: admit.Format, State: admit.StateAdmitted, RecordIndex: e.RecordIndex, Admissions: 1, AdmittedAt: &at})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(&consul.KVPair{Key: contract.QueueStatusPrefix + "/default/bert", Value: b}, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = c.KV().DeleteTree(contract.QueueStatusPrefix+"/", nil) })
	f := running()
	out, err := executeConsul(t, f, c, "bert")
	if err != nil || !strings.Contains(out, "Job bert's record in queue team-a deleted: the queue does not start it again.") ||
		!strings.Contains(out, "Job bert stopped") {
		t.Fatalf("%v\n%s", err, out)
	}
	if e, _ := (queues.Records{Consul: c}).Get(context.Background(), "default", "bert"); e != nil {
		t.Errorf("the record stays")
	}
	if j, _ := f.Job("bert"); j == nil || j.Stop == nil || !*j.Stop {
		t.Errorf("not stopped in Nomad: %+v", j)
	}
}
