package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/internal/safename"
)

// Issue 8: a job name must never reach a path or a Consul key raw.

func TestCLIRefusesAJobNameThatLeavesTheCheckpointRoot(t *testing.T) {
	c := needCluster(t)
	spec := filepath.Join(c.repo, "e2e", "testdata", "bad-name.hcl")
	for _, cmd := range []string{"validate", "submit"} {
		_, errOut, code := c.gpujob(t, time.Minute, cmd, spec)
		if code != 1 {
			t.Errorf("%s of a spec named ../../… exited %d, want 1", cmd, code)
		}
		for _, want := range []string{"bad-name.hcl:4:7: error: Invalid job name", "starts with '.'", "letters, digits"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("%s's errors lack %q:\n%s", cmd, want, errOut)
			}
		}
	}
	jobs, _, err := c.nomad.Jobs().List(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Its own name: TestHandWrittenJobIDStaysUnderTheCheckpointRoot
	// registers e2e-names-escaped on purpose, maybe on this same cluster
	// before this test, and that job cannot be purged (see there).
	for _, j := range jobs {
		if strings.Contains(j.ID, "e2e-refused-escape") {
			t.Errorf("a refused spec registered %q", j.ID)
		}
	}
}

// TestHandWrittenJobIDStaysUnderTheCheckpointRoot runs a job written for
// Nomad directly, which the CLI would refuse, whose ID climbs out of the
// checkpoint root: the driver must put its checkpoints under the root, in
// the ID's encoding, and its rendezvous must work (keys with no "..").
func TestHandWrittenJobIDStaysUnderTheCheckpointRoot(t *testing.T) {
	c := needCluster(t)
	c.nodeGPUs(t, fakeGPUsPerClient)
	// Raw, <root>/default/<id> is <dev dir>/e2e-names-escaped: out of the
	// root, yet inside this test's cluster directory.
	const id = "e2e-names/../../../e2e-names-escaped"
	const seg = "e2e-names~2F..~2F..~2F..~2Fe2e-names-escaped"
	if got := safename.Encode(id); got != seg {
		t.Fatalf("Encode(%q) = %q, want %q", id, got, seg)
	}
	root := filepath.Join(c.dir, "checkpoints")
	raw := filepath.Join(root, "default", id)
	if filepath.Dir(raw) != c.dir {
		t.Fatalf("the raw path %s should lie in %s", raw, c.dir)
	}
	want := filepath.Join(root, "default", seg)
	t.Cleanup(func() { os.RemoveAll(want) })

	// trainJob's cleanup removes the checkpoints of the placeholder ID.
	job := c.trainJob(t, "e2e-names", 2, 1, []string{"--steps", "40", "--checkpoint-every", "20"}, `join_timeout = "2m"`, "max_restarts = 0")
	job.ID, job.Name = strp(id), strp(id)
	if _, _, err := c.nomad.Jobs().Register(job, nil); err != nil {
		t.Fatalf("registering %q: %v", id, err)
	}
	// Nomad's own HTTP router cleans the ".." out of /v1/job/<id>/…, so
	// this job cannot be deregistered or listed by its path: stop it by
	// registering it stopped, and find its allocations with a filter.
	t.Cleanup(func() {
		job.Stop = boolp(true)
		_, _, _ = c.nomad.Jobs().Register(job, nil)
		_ = waitFor(30*time.Second, func() bool {
			as, err := c.allocsOf(id)
			return err == nil && allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed)(as)
		})
	})

	var allocs []*api.AllocationListStub
	if err := waitFor(3*time.Minute, func() bool {
		as, err := c.allocsOf(id)
		allocs = as
		return err == nil && len(as) == 2 && allIn(api.AllocClientStatusComplete, api.AllocClientStatusFailed)(as)
	}); err != nil {
		t.Fatalf("job %q did not end: %v; allocations: %s", id, err, describeAllocs(allocs))
	}
	res := c.finalResult(t, allocs)
	if res.WorldSize != 2 || res.Steps != 40 {
		t.Errorf("result %+v, want 40 steps on 2 ranks: the rendezvous did not work", res)
	}
	if ckpts, _ := filepath.Glob(filepath.Join(want, "ckpt-*.pt")); len(ckpts) == 0 {
		entries, _ := os.ReadDir(filepath.Join(root, "default"))
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("no checkpoint in %s; %s/default holds %v", want, root, names)
	}
	for _, p := range []string{raw, filepath.Join(root, "default", "e2e-names")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s exists (%v): the raw job ID reached the file system", p, err)
		}
	}
	c.assertNoLeaks(t, seg, allocIDs(allocs)...)
}

// allocsOf lists the allocations of the job id through a filter, not the
// job's path.
func (c *cluster) allocsOf(id string) ([]*api.AllocationListStub, error) {
	as, _, err := c.nomad.Allocations().List(&api.QueryOptions{Filter: fmt.Sprintf("JobID == %q", id)})
	return as, err
}
