package contract_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gpujob/gpujob/internal/contract"
)

// jobspecs is the folder of the workloads and example jobs, which use the
// contract without importing it.
const jobspecs = "../../jobspecs"

// declared reads contract.go's constants whose names start with prefix, so
// a constant added there is checked here without a second list to keep.
func declared(t *testing.T, prefix string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "contract.go", nil, 0)
	if err != nil {
		t.Fatalf("parse contract.go: %v", err)
	}
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, prefix) || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatalf("%s: %v", name.Name, err)
				}
				out[v] = name.Name
			}
		}
	}
	if len(out) == 0 {
		t.Fatalf("contract.go declares no %s... constants", prefix)
	}
	return out
}

// files returns the files under jobspecs whose names end in ext, read.
func files(t *testing.T, ext string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(jobspecs, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ext) {
			return err
		}
		b, err := os.ReadFile(path)
		out[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("read %s: %v", jobspecs, err)
	}
	if len(out) == 0 {
		t.Fatalf("no %s files under %s", ext, jobspecs)
	}
	return out
}

// The workloads read only the variables the supervisor sets (or the
// renderer puts into the task), by the names the contract gives them.
func TestWorkloadsReadContractEnv(t *testing.T) {
	env := declared(t, "Env")
	read := 0
	envVar := regexp.MustCompile(`GPUJOB_[A-Z_]+`)
	for path, src := range files(t, ".py") {
		for _, name := range envVar.FindAllString(src, -1) {
			read++
			if _, ok := env[name]; !ok {
				t.Errorf("%s uses %s, which internal/contract does not declare (a renamed variable or a typo)", path, name)
			}
		}
	}
	if read == 0 {
		t.Fatal("no workload reads a GPUJOB_ variable: the check checked nothing")
	}
}

// The metric and result lines the workloads print carry the prefixes the
// sweep reporter reads, and the progress lines `gpujob status`, `top` and
// the exporter read carry theirs.
func TestWorkloadsPrintContractLines(t *testing.T) {
	printed := regexp.MustCompile(`print\(f?"(gpujob[-a-z]*: )`)
	want := []string{contract.MetricLinePrefix, contract.ResultLinePrefix, contract.ProgressLinePrefix}
	seen := map[string]bool{}
	for path, src := range files(t, ".py") {
		for _, m := range printed.FindAllStringSubmatch(src, -1) {
			if !slices.Contains(want, m[1]) {
				t.Errorf("%s prints lines starting %q, which no gpujob reader knows (want one of %q)", path, m[1], want)
			}
			seen[m[1]] = true
		}
	}
	for _, p := range want {
		if !seen[p] {
			t.Errorf("no workload prints a %q line: the contract is untested or the workloads drifted", p)
		}
	}
}

// The example and rendered jobs under jobspecs/ use the contract's meta
// keys, driver name and GPU device.
func TestJobspecsUseContractNames(t *testing.T) {
	meta := declared(t, "Meta")
	metaBlock := regexp.MustCompile(`(?s)\bmeta\s*\{([^}]*)\}`)
	key := regexp.MustCompile(`(?m)^\s*"?([A-Za-z0-9_]+)"?\s*=`)
	device := regexp.MustCompile(`\bdevice\s+"([^"]+)"`)
	driver := regexp.MustCompile(`\bdriver\s*=\s*"([^"]+)"`)
	keys, devices, drivers := 0, 0, 0
	for path, src := range files(t, ".hcl") {
		for _, b := range metaBlock.FindAllStringSubmatch(src, -1) {
			for _, k := range key.FindAllStringSubmatch(b[1], -1) {
				if !strings.HasPrefix(k[1], "gpujob") {
					continue
				}
				keys++
				if _, ok := meta[k[1]]; !ok {
					t.Errorf("%s: meta key %q is not one of internal/contract's Meta keys", path, k[1])
				}
			}
		}
		for _, d := range device.FindAllStringSubmatch(src, -1) {
			devices++
			if d[1] != contract.GPUDevice {
				t.Errorf("%s: device %q, want %q", path, d[1], contract.GPUDevice)
			}
		}
		for _, d := range driver.FindAllStringSubmatch(src, -1) {
			if d[1] == contract.DriverName {
				drivers++
			}
		}
	}
	if keys == 0 || devices == 0 || drivers == 0 {
		t.Fatalf("checked %d meta keys, %d devices, %d gpujob drivers: the jobspecs moved and the check checked nothing", keys, devices, drivers)
	}
}

// ReservedMeta are meta keys (a spec's meta may not set them).
func TestReservedMetaAreMetaKeys(t *testing.T) {
	meta := declared(t, "Meta")
	for _, k := range contract.ReservedMeta {
		if _, ok := meta[k]; !ok {
			t.Errorf("ReservedMeta holds %q, not a Meta key", k)
		}
	}
}
