package queuefile

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/gpujob/gpujob/internal/queue/policy"
)

func TestParseGoodFiles(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		want      []policy.QueueConfig
	}{
		{"empty: the default queue alone", "", nil},
		{"comments only", "# no queues yet\n", nil},
		{"defaults", `queue "default" {}`, []policy.QueueConfig{{Name: "default", Weight: 1, Priority: 50}}},
		{"every attribute", `
queue "team-a" {
  gpus     = 8
  weight   = 2.5
  borrow   = true
  priority = 60
  cohort   = "research"
}
queue "team_b" {
  gpus = 4
}
`, []policy.QueueConfig{
			{Name: "team-a", GPUs: 8, Weight: 2.5, Borrow: true, Priority: 60, Cohort: "research"},
			{Name: "team_b", GPUs: 4, Weight: 1, Priority: 50},
		}},
		{"bounds", fmt.Sprintf(`queue "Q1" {
  gpus = %d
  weight = 1e6
  priority = 100
}
queue "q2" {
  gpus = 0
  weight = 0.001
  priority = 1
}`, MaxGPUs), []policy.QueueConfig{
			{Name: "Q1", GPUs: MaxGPUs, Weight: 1e6, Priority: 100},
			{Name: "q2", Weight: 0.001, Priority: 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, diags := Parse([]byte(tc.src), "queues.hcl")
			if diags.HasErrors() {
				t.Fatal(diags)
			}
			if !reflect.DeepEqual(f.Config.Queues, tc.want) {
				t.Errorf("queues %+v\nwant %+v", f.Config.Queues, tc.want)
			}
			if len(f.SHA256) != 64 {
				t.Errorf("sha256 %q", f.SHA256)
			}
			for _, q := range tc.want {
				if _, ok := f.Blocks[q.Name]; !ok {
					t.Errorf("no block range for %s", q.Name)
				}
			}
		})
	}
}

// Each bad file is refused with the position of what is wrong and words
// that say what.
func TestParseErrorsHaveFileLine(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		at        string // file:line:col of the first error
		want      string
	}{
		{"syntax", "queue \"a\" {\n  gpus = \n}\n", "q.hcl:2:", "Invalid expression"},
		{"unknown attribute", "queue \"a\" {\n  gpu = 4\n}\n", "q.hcl:2:3", `Unsupported argument`},
		{"unknown block", "queues \"a\" {}\n", "q.hcl:1:1", "Unsupported block type"},
		{"top-level attribute", "checkpoint_grace = \"30s\"\n", "q.hcl:1:1", "Unsupported argument"},
		{"no label", "queue {}\n", "q.hcl:1:7", "Missing name for queue"},
		{"bad name", "queue \"team a\" {}\n", "q.hcl:1:7", `"team a" is not a queue name`},
		{"empty name", "queue \"\" {}\n", "q.hcl:1:7", `"" is not a queue name`},
		{"long name", "queue \"" + strings.Repeat("a", 64) + "\" {}\n", "q.hcl:1:7", "1 to 63 letters"},
		{"duplicate", "queue \"a\" {}\n\nqueue \"a\" {\n  gpus = 1\n}\n", "q.hcl:3:7", `Queue "a" is already declared at q.hcl:1,1-10`},
		{"negative gpus", "queue \"a\" {\n  gpus = -1\n}\n", "q.hcl:2:10", "gpus = -1; want 0 (no quota) to 1048576"},
		{"huge gpus", "queue \"a\" {\n  gpus = 1e12\n}\n", "q.hcl:2:10", "is too large"},
		{"fractional gpus", "queue \"a\" {\n  gpus = 1.5\n}\n", "q.hcl:2:10", "a whole number is required, got 1.5"},
		{"gpus as string", "queue \"a\" {\n  gpus = \"4\"\n}\n", "q.hcl:2:10", "a whole number is required"},
		{"zero weight", "queue \"a\" {\n  weight = 0\n}\n", "q.hcl:2:12", "weight = 0; want more than 0"},
		{"negative weight", "queue \"a\" {\n  weight = -2\n}\n", "q.hcl:2:12", "weight = -2"},
		{"huge weight", "queue \"a\" {\n  weight = 1e7\n}\n", "q.hcl:2:12", "at most 1e+06"},
		{"borrow as string", "queue \"a\" {\n  borrow = \"yes\"\n}\n", "q.hcl:2:12", "true or false is required"},
		{"priority 0", "queue \"a\" {\n  priority = 0\n}\n", "q.hcl:2:14", "priority = 0; want 1 to 100"},
		{"priority 101", "queue \"a\" {\n  priority = 101\n}\n", "q.hcl:2:14", "priority = 101"},
		{"bad cohort", "queue \"a\" {\n  cohort = \"x/y\"\n}\n", "q.hcl:2:12", `"x/y" is not a cohort name`},
		{"null", "queue \"a\" {\n  gpus = null\n}\n", "q.hcl:2:10", "a whole number is required"},
		{"variable", "queue \"a\" {\n  gpus = var.n\n}\n", "q.hcl:2:10", "Variables not allowed"},
		{"function", "queue \"a\" {\n  gpus = max(1, 2)\n}\n", "q.hcl:2:10", "Function calls not allowed"},
		{"number out of range", "queue \"a\" {\n  weight = 1e100000000\n}\n", "q.hcl:2:12", "Number out of range"},
		{"second error in a later block", "queue \"a\" {}\nqueue \"b\" {\n  gpus = -3\n}\n", "q.hcl:3:10", "gpus = -3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, _, diags := Parse([]byte(tc.src), "q.hcl")
			if !diags.HasErrors() || f != nil {
				t.Fatalf("parsed into %+v, want an error", f)
			}
			d := diags[0]
			if d.Subject == nil {
				t.Fatalf("error without a position: %v", d)
			}
			at := fmt.Sprintf("%s:%d:%d", d.Subject.Filename, d.Subject.Start.Line, d.Subject.Start.Column)
			if !strings.HasPrefix(at, tc.at) {
				t.Errorf("error at %s, want %s: %v", at, tc.at, diags)
			}
			if !strings.Contains(d.Summary+": "+d.Detail, tc.want) {
				t.Errorf("error %q, want it to say %q", d.Summary+": "+d.Detail, tc.want)
			}
		})
	}
}

// An unknown attribute does not hide the bad values beside it.
func TestEveryErrorIsReported(t *testing.T) {
	_, _, diags := Parse([]byte("queue \"a\" {\n  bogus = 1\n  gpus = -2\n}\nqueue \"b\" {\n  weight = 0\n}\n"), "q.hcl")
	var at []string
	for _, d := range diags {
		at = append(at, fmt.Sprintf("%d:%d %s", d.Subject.Start.Line, d.Subject.Start.Column, d.Summary))
	}
	if want := "2:3 Unsupported argument, 3:10 Invalid gpus, 6:12 Invalid weight"; strings.Join(at, ", ") != want {
		t.Errorf("errors %q, want %q", strings.Join(at, ", "), want)
	}
}

func TestTooManyQueues(t *testing.T) {
	var b strings.Builder
	for i := 0; i <= MaxQueues; i++ {
		fmt.Fprintf(&b, "queue \"q%d\" {}\n", i)
	}
	_, _, diags := Parse([]byte(b.String()), "q.hcl")
	if !diags.HasErrors() || !strings.Contains(diags.Error(), "at most 1000 queues") ||
		diags[0].Subject.Start.Line != MaxQueues+1 {
		t.Fatalf("%v", diags)
	}
}

func TestParseFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "queues.hcl")
	src := []byte("queue \"a\" {\n  gpus = 2\n}\n")
	if err := os.WriteFile(p, src, 0o644); err != nil {
		t.Fatal(err)
	}
	f, files, diags := ParseFile(p)
	if diags.HasErrors() || f.Config.Queues[0].GPUs != 2 || files[p] == nil {
		t.Fatalf("%+v %v", f, diags)
	}
	// The SHA-256 of the bytes, as sha256sum prints it.
	if sum := sha256.Sum256(src); f.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("sha256 %q", f.SHA256)
	}
	if _, _, diags := ParseFile(filepath.Join(t.TempDir(), "missing.hcl")); !diags.HasErrors() ||
		!strings.Contains(diags.Error(), "no such file") {
		t.Errorf("missing file: %v", diags)
	}
}

// Validate holds a configuration that came from elsewhere (Consul) to the
// file's rules.
func TestValidate(t *testing.T) {
	good := policy.QueueConfig{Name: "a", GPUs: 2, Weight: 1, Priority: 50}
	if err := Validate(policy.Config{Queues: []policy.QueueConfig{good}}); err != nil {
		t.Fatal(err)
	}
	if err := Validate(policy.Config{}); err != nil {
		t.Fatalf("no queues: %v", err)
	}
	with := func(f func(q *policy.QueueConfig)) policy.Config {
		q := good
		f(&q)
		return policy.Config{Queues: []policy.QueueConfig{q}}
	}
	for _, tc := range []struct {
		cfg  policy.Config
		want string
	}{
		{with(func(q *policy.QueueConfig) { q.Name = "../x" }), `queue: "../x" is not a queue name`},
		{with(func(q *policy.QueueConfig) { q.Name = "a\x1b[2J" }), "is not a queue name"},
		{with(func(q *policy.QueueConfig) { q.GPUs = -1 }), `queue "a": gpus = -1`},
		{with(func(q *policy.QueueConfig) { q.Weight = 0 }), `queue "a": weight = 0`},
		{with(func(q *policy.QueueConfig) { q.Weight = math.NaN() }), `weight = NaN`},
		{with(func(q *policy.QueueConfig) { q.Weight = math.Inf(1) }), `weight = +Inf`},
		{with(func(q *policy.QueueConfig) { q.Priority = 0 }), `priority = 0`},
		{with(func(q *policy.QueueConfig) { q.Cohort = "a b" }), `"a b" is not a cohort name`},
		{policy.Config{Queues: []policy.QueueConfig{good, good}}, `queue "a" is declared twice`},
		{policy.Config{Queues: make([]policy.QueueConfig, MaxQueues+1)}, "1001 queues; at most 1000"},
	} {
		if err := Validate(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

func TestCheckText(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  int
		want string // "" is accepted
	}{
		{"alice applied it", 64, ""},
		{"", 64, ""},
		{"naïve", 64, ""},
		{"abc", 2, "3 bytes; at most 2"},
		{"a\x1b[2Jb", 64, "control character"},
		{"a\nb", 64, "control character"},
		{"\xff\xfe", 64, "not UTF-8"},
	} {
		err := CheckText(c.in, c.max)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("CheckText(%q): %v", c.in, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("CheckText(%q) = %v, want %q", c.in, err, c.want)
		}
	}
	if got := Clip(strings.Repeat("é", 60)); !utf8.ValidString(got) || !strings.HasSuffix(got, "…") {
		t.Errorf("Clip cut a rune or added no ellipsis: %q", got)
	}
}
