package list

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/queues"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

// A queued job without a Nomad job gets a row of its own (queued or
// refused) and its sentence; a job in Nomad gets its queue fields; an
// admitted record whose job is gone from Nomad, and records of services,
// are left out.
func TestWithQueue(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	rec := func(id, kind string, at time.Time) *admit.JobRecord {
		return &admit.JobRecord{ID: id, Namespace: "default", Queue: "team-a", Kind: kind, Members: 4,
			PerMember: admit.Resources{GPUs: 2}, SubmittedAt: at, SubmittedBy: "alice"}
	}
	adm := now.Add(-time.Hour)
	entries := []*queues.Entry{
		{Record: rec("waiting", admit.KindTrain, now.Add(-time.Minute)), Status: &admit.Status{State: admit.StateQueued, Position: 1, Reason: "waiting for 8 GPUs"}},
		{Record: rec("refused", admit.KindTrain, now.Add(-2*time.Minute)), Status: &admit.Status{State: admit.StateRefused, Reason: `unknown queue "team-a"`}},
		{Record: rec("running", admit.KindTrain, now.Add(-3*time.Hour)), Status: &admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: &adm}},
		{Record: rec("ended", admit.KindTrain, now.Add(-4*time.Hour)), Status: &admit.Status{State: admit.StateAdmitted, Admissions: 1, AdmittedAt: &adm}},
		{Record: rec("serve", admit.KindService, now)},
	}
	jobs := []Job{{Name: "running", Namespace: "default", State: "running", Workers: 4, GPUsPerWorker: 2, Submitted: now.Add(-time.Hour)}}
	got, lines := WithQueue(jobs, entries, now)
	var names []string
	for _, j := range got {
		names = append(names, j.Name+":"+j.State)
	}
	if strings.Join(names, " ") != "waiting:queued refused:refused running:running" {
		t.Fatalf("rows %v", names)
	}
	if got[2].Queue == nil || got[2].Queue.State != "admitted" || lines["default/running"] != "" {
		t.Errorf("the running job's queue fields: %+v, line %q", got[2].Queue, lines["default/running"])
	}
	if lines["default/waiting"] != "queued in team-a (position 1): waiting for 8 GPUs, no estimated start yet (running jobs without a max_runtime hold what it needs)" {
		t.Errorf("line %q", lines["default/waiting"])
	}
	b, _ := json.Marshal(got[0])
	if !strings.Contains(string(b), `"state":"queued"`) || !strings.Contains(string(b), `"queue":{"queue":"team-a","state":"queued","position":1`) {
		t.Errorf("json %s", b)
	}
}
