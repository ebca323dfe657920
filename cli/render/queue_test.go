package render_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
)

// A job's queue is in its meta, where queue status and the admission
// controller read it; a job without one has no such key (the default
// queue), and a Train or Service built in code with a bad name is refused.
func TestQueueMeta(t *testing.T) {
	queueMeta := regexp.MustCompile(contract.MetaQueue + `\s+= "([^"]*)"`)
	tr, diags := spec.Parse([]byte("train \"t\" {\n  command = \"/bin/true\"\n  queue = \"team-a\"\n}\n"), "t.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	out, err := render.Jobspec(tr)
	if m := queueMeta.FindStringSubmatch(string(out)); err != nil || m == nil || m[1] != "team-a" {
		t.Fatalf("train: %v\n%s", err, out)
	}
	tr.Queue = ""
	if out, _ := render.Jobspec(tr); strings.Contains(string(out), contract.MetaQueue) {
		t.Errorf("no queue, but the meta names one:\n%s", out)
	}
	tr.Queue = "a\"b"
	if _, err := render.Jobspec(tr); err == nil || !strings.Contains(err.Error(), "not a queue name") {
		t.Errorf("bad queue: %v", err)
	}

	svc, _, diags := spec.LoadServiceSource([]byte("service \"s\" {\n  command = \"/bin/true\"\n  queue = \"serving\"\n}\n"), "s.hcl", spec.Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	out, err = render.ServiceOptions{}.ServiceJobspec(svc)
	if m := queueMeta.FindStringSubmatch(string(out)); err != nil || m == nil || m[1] != "serving" {
		t.Fatalf("service: %v\n%s", err, out)
	}
	svc.Queue = "${node.unique.id}"
	if _, err := (render.ServiceOptions{}).ServiceJobspec(svc); err == nil {
		t.Error("a queue Nomad would interpolate was rendered")
	}
}
