package render_test

import (
	"strings"
	"testing"
	"time"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
)

// checkpoint_grace is every task's kill_timeout: the time Nomad gives a
// stopping member (the driver's supervisor sends the ranks SIGTERM and
// kills them at the end of it, less what it keeps for leaving Consul). An
// image job's sidecar passes it on as container_kill_timeout.
func TestCheckpointGraceIsTheKillTimeout(t *testing.T) {
	for _, image := range []string{"", "\n  image = \"repo/train:1\""} {
		src := "train \"t\" {\n  command = \"/bin/true\"\n  checkpoint_grace = \"2m\"" + image + "\n}\n"
		tr, diags := spec.Parse([]byte(src), "g.hcl", spec.Options{})
		if diags.HasErrors() {
			t.Fatal(diags)
		}
		out, err := render.Jobspec(tr)
		if err != nil {
			t.Fatal(err)
		}
		n, want := strings.Count(string(out), `  kill_timeout = "2m"`), 1
		if image != "" {
			want = 2 // the sidecar and the member
		}
		if n != want || strings.Contains(string(out), `kill_timeout = "30s"`) {
			t.Errorf("image %q: %d kill_timeout = \"2m\", want %d:\n%s", image, n, want, out)
		}
		// The supervisor in an image job's container learns it from the
		// sidecar's config: docker, not the gpujob driver, stops it.
		if got := strings.Contains(string(out), `container_kill_timeout = "2m"`); got != (image != "") {
			t.Errorf("image %q: container_kill_timeout = \"2m\" written: %t:\n%s", image, got, out)
		}
	}
	// A Train built in code: 0 is the default, out of bounds an error.
	tr := &spec.Train{Name: "t", Command: "/bin/true", Workers: 1}
	if out, err := render.Jobspec(tr); err != nil || !strings.Contains(string(out), `kill_timeout = "30s"`) {
		t.Errorf("no grace: %v\n%s", err, out)
	}
	tr.CheckpointGrace = time.Hour
	if _, err := render.Jobspec(tr); err == nil || !strings.Contains(err.Error(), "checkpoint_grace") {
		t.Errorf("an hour's grace: %v", err)
	}
}
