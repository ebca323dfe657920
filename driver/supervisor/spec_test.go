package supervisor

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpujob/gpujob/driver/rendezvous"
)

// TestValidateRefusesWhatARankCouldNotBeGiven: the driver's spec is refused,
// naming the field, when a rank could not be started as written.
func TestValidateRefusesWhatARankCouldNotBeGiven(t *testing.T) {
	good := func() *Spec {
		return &Spec{Command: "/bin/true", Args: []string{"a"}, Env: map[string]string{"A": "1"}, NProcPerNode: 1,
			Min: 1, Max: 1, RunID: "r", Self: Member{ID: "a", Addr: "127.0.0.1:1"}}
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	for _, c := range []struct {
		name, want string
		edit       func(*Spec)
	}{
		{"too many processes", "nproc_per_node must be at most", func(s *Spec) { s.NProcPerNode = rendezvous.MaxLocalWorldSize + 1 }},
		{"NUL in the command", "command", func(s *Spec) { s.Command = "/bin/sh\x00-c" }},
		{"NUL in an argument", "args[0]", func(s *Spec) { s.Args[0] = "a\x00" }},
		{"invalid UTF-8 in the workdir", "workdir", func(s *Spec) { s.Workdir = "/tmp/\xff" }},
		{"'=' in an env name", "not a variable name", func(s *Spec) { s.Env["PATH=/tmp:/bin"] = "1" }},
		{"empty env name", "not a variable name", func(s *Spec) { s.Env[""] = "1" }},
		{"NUL in an env value", "value of A", func(s *Spec) { s.Env["A"] = "x\x00" }},
	} {
		s := good()
		c.edit(s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Validate() = %v, want an error about %q", c.name, err, c.want)
		}
	}
}

// A container member whose checkpoint directory is not mounted must not
// start: its ranks would checkpoint into the container and lose it all. A
// directory at the path that is not the host's (the image's own, or the
// mount one level up) is refused the same way.
func TestCheckMountedNamesTheMissingMount(t *testing.T) {
	dir := t.TempDir()
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	id := fmt.Sprintf("%d:%d", st.Dev, st.Ino)
	if err := checkMounted(dir, id); err != nil {
		t.Fatalf("the host's own directory: %v", err)
	}
	missing := filepath.Join(dir, "not-mounted")
	err := checkMounted(missing, id)
	if err == nil || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "bind-mounted at the same path") {
		t.Fatalf("err = %v; want one naming %s and the mount", err, missing)
	}
	other := t.TempDir()
	if err := checkMounted(other, id); err == nil || !strings.Contains(err.Error(), "is not the host's") {
		t.Fatalf("another directory at the path: err = %v; want it refused as not the host's", err)
	}
}
