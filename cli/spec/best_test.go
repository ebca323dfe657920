package spec

import (
	"strings"
	"testing"

	"github.com/gpujob/gpujob/internal/sweep/search"
)

func TestBestTrainParsesAsTheBestTrial(t *testing.T) {
	src := `variable "workload" {
  type    = string
  default = "/w/toy.py"
}

sweep "toy" {
  train {
    workers = 1
    command = "/usr/bin/python3"
    args    = [var.workload, "--lr", param.lr, "--width=${param.width}"]
    env = {
      MODE = param.mode
    }
  }
  param "lr" {
    loguniform = [1e-4, 1]
  }
  param "width" {
    choice = [8, 16]
  }
  param "mode" {
    choice = ["a \"quoted\" one", "b"]
  }
  objective {
    metric = "score"
  }
  max_trials = 4
}
`
	a := search.Assignment{"lr": search.FloatValue(0.0125), "width": search.IntValue(16), "mode": search.StringValue(`a "quoted" one`)}
	out, err := BestTrain([]byte(src), "toy.hcl", "toy-best", a)
	if err != nil {
		t.Fatal(err)
	}
	tr, diags := Parse(out, "best.hcl", Options{})
	if diags.HasErrors() {
		t.Fatalf("the train spec does not parse: %s\n%s", diags.Error(), out)
	}
	if tr.Name != "toy-best" {
		t.Errorf("name %q", tr.Name)
	}
	want := []string{"/w/toy.py", "--lr", "0.0125", "--width=16"}
	if strings.Join(tr.Args, "|") != strings.Join(want, "|") {
		t.Errorf("args %q, want %q\n%s", tr.Args, want, out)
	}
	if tr.Env["MODE"] != `a "quoted" one` {
		t.Errorf("env MODE %q", tr.Env["MODE"])
	}
	// It must hold the same values the sweep's own trial would run with.
	sw, diags := ParseSweep([]byte(src), "toy.hcl", Options{})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	trial, err := sw.Train(a)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(trial.Args, "|") != strings.Join(tr.Args, "|") {
		t.Errorf("best spec args %q differ from the trial's %q", tr.Args, trial.Args)
	}
}

func TestBestTrainNeedsASweep(t *testing.T) {
	if _, err := BestTrain([]byte(`train "x" { command = "a" }`), "x.hcl", "x-best", nil); err == nil {
		t.Fatal("want an error for a file without a sweep")
	}
}
