// Package jobspecs holds no Go code: this test checks that every example
// spec, rendered by the library gpujob submit, sweep submit and service
// deploy use, gives a Nomad job the admission controller accepts in a
// queued job record: its allowlist (internal/queue/admit) must never
// refuse gpujob's own jobs.
package jobspecs

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/hashicorp/nomad/jobspec"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/queue/admit"
)

func TestRenderedJobsPassTheQueueRecordCheck(t *testing.T) {
	examples, err := filepath.Glob("examples/*.hcl")
	if err != nil {
		t.Fatal(err)
	}
	jobs := map[string][]byte{}
	for _, path := range examples {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case strings.Contains(string(src), "\ntrain \""):
			tr, _, diags := spec.Load(path, spec.Options{})
			if diags.HasErrors() {
				t.Fatalf("%s: %v", path, diags)
			}
			for _, root := range []string{"", "/data/ckpt"} {
				b, err := render.Options{CheckpointRoot: root}.Jobspec(tr)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				jobs[path+" root "+root] = b
			}
		case strings.Contains(string(src), "\nservice \""):
			s, _, diags := spec.LoadService(path, spec.Options{})
			if diags.HasErrors() {
				t.Fatalf("%s: %v", path, diags)
			}
			b, err := render.ServiceOptions{}.ServiceJobspec(s)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			jobs[path] = b
		}
	}
	// A sweep's trials, as sweep submit renders them (kept current by the
	// sweep command's tests).
	trials, _ := filepath.Glob("rendered/*.trial-*.nomad.hcl")
	if len(trials) == 0 {
		t.Fatal("no rendered sweep trial")
	}
	for _, path := range trials {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		jobs[path] = b
	}
	if len(jobs) < 8 {
		t.Fatalf("only %d jobs rendered from %v", len(jobs), examples)
	}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for name, hcl := range jobs {
		// Nomad's HCL2 parser (jobspec2) needs Nomad's fork of hcl/v2;
		// the HCL1 one reads what render writes.
		job, err := jobspec.Parse(bytes.NewReader(hcl))
		if err != nil {
			t.Fatalf("%s: parsing the rendered job: %v\n%s", name, err, hcl)
		}
		for _, canonical := range []bool{false, true} {
			j := job
			if canonical {
				// As Nomad's parse endpoint returns it with canonicalize.
				cp := *job
				b, _ := json.Marshal(job)
				_ = json.Unmarshal(b, &cp)
				cp.Canonicalize()
				j = &cp
			}
			rec := recordOf(t, j, now)
			_, err := rec.Check(now)
			pooled := j.NodePool != nil && *j.NodePool != "" && *j.NodePool != "default"
			switch {
			case pooled:
				// A spec naming a node pool is not queued: the queue runs
				// jobs in the default pool for now.
				if err == nil || !strings.Contains(err.Error(), "default node pool") {
					t.Errorf("%s (canonical %v): node pool %q: %v, want a refusal naming the default pool", name, canonical, *j.NodePool, err)
				}
			case err != nil:
				t.Errorf("%s (canonical %v): the controller refuses gpujob's own job: %v", name, canonical, err)
			}
		}
	}
}

// recordOf is the queue record submit writes for job.
func recordOf(t *testing.T, job *api.Job, now time.Time) *admit.JobRecord {
	t.Helper()
	kind := admit.KindTrain
	switch {
	case job.Meta[contract.MetaKind] == contract.KindService:
		kind = admit.KindService
	case job.Meta[contract.MetaSweep] != "":
		kind = admit.KindTrial
	}
	members, per, err := admit.Gang(job, kind == admit.KindService)
	if err != nil {
		t.Fatalf("job %s: %v", *job.ID, err)
	}
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	ns := "default"
	if job.Namespace != nil && *job.Namespace != "" {
		ns = *job.Namespace
	}
	return &admit.JobRecord{Format: admit.Format, ID: *job.ID, Namespace: ns, Queue: job.Meta[contract.MetaQueue],
		Kind: kind, Members: members, PerMember: per, SubmittedAt: now, SubmittedBy: "alice@desk", Job: b}
}
