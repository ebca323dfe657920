package spec_test

import (
	"strings"
	"testing"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

// A train, sweep (its train block: every trial) or service spec names its
// queue; unset is "" (the default queue).
func TestQueue(t *testing.T) {
	tr, diags := spec.Parse([]byte("train \"t\" {\n  command = \"/bin/true\"\n  queue = \"team-a\"\n}\n"), "t.hcl", spec.Options{})
	if diags.HasErrors() || tr.Queue != "team-a" || tr.Ranges.Of("queue").Start.Line != 3 {
		t.Fatalf("train: %+v %v", tr, diags)
	}
	if tr, _ := spec.Parse([]byte("train \"t\" {\n  command = \"/bin/true\"\n}\n"), "t.hcl", spec.Options{}); tr.Queue != "" {
		t.Errorf("unset: %q", tr.Queue)
	}
	sw, diags := spec.ParseSweep([]byte(`sweep "s" {
  train {
    command = "/bin/true"
    queue   = var.q
  }
  param "lr" { uniform = [0, 1] }
  objective {
    metric = "loss"
  }
  max_trials = 2
}
variable "q" {
  default = "team-b"
}
`), "s.hcl", spec.Options{})
	if diags.HasErrors() || sw.Template.Queue != "team-b" {
		t.Fatalf("sweep: %v", diags)
	}
	trial, err := sw.Train(search.Assignment{"lr": search.FloatValue(0.5)})
	if err != nil || trial.Queue != "team-b" {
		t.Fatalf("trial: %+v %v", trial, err)
	}
	svc, _, diags := spec.LoadServiceSource([]byte("service \"s\" {\n  command = \"/bin/true\"\n  queue = \"serving\"\n}\n"), "s.hcl", spec.Options{})
	if diags.HasErrors() || svc.Queue != "serving" {
		t.Fatalf("service: %v", diags)
	}
}

func TestQueueErrors(t *testing.T) {
	train := func(q string) string { return "train \"t\" {\n  command = \"/bin/true\"\n  queue = " + q + "\n}\n" }
	service := func(q string) string { return "service \"s\" {\n  command = \"/bin/true\"\n  queue = " + q + "\n}\n" }
	for _, c := range []struct {
		name, src, want string
		service         bool
	}{
		{"train: a space", train(`"team a"`), `t.hcl:3:11: error: Invalid queue: "team a" is not a queue name`, false},
		{"train: a slash", train(`"../x"`), `t.hcl:3:11: error: Invalid queue`, false},
		{"train: empty", train(`""`), `t.hcl:3:11: error: Invalid queue`, false},
		{"train: a number", train(`[1]`), `t.hcl:3:11: error: Incorrect attribute value type`, false},
		{"service: a template", service(`"$${x}"`), `t.hcl:3:11: error: Invalid queue`, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got string
			if c.service {
				_, files, diags := spec.LoadServiceSource([]byte(c.src), "t.hcl", spec.Options{})
				got = spec.Format(diags, files)
			} else {
				_, files, diags := spec.LoadSource([]byte(c.src), "t.hcl", spec.Options{})
				got = spec.Format(diags, files)
			}
			if !strings.Contains(got, c.want) {
				t.Errorf("errors lack %q:\n%s", c.want, got)
			}
		})
	}
}
