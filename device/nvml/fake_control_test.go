package nvml

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// controlled returns a 2-GPU fake following a control file in a temp dir
// (not yet written) and the file's path.
func controlled(t *testing.T) (*FakeLibrary, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gpus.json")
	return NewFake(FakeSpec{Count: 2, Model: "m", MemoryMiB: 16384, Seed: "ctl", ControlFile: path}), path
}

// writeControl writes body with a modification time step seconds after a
// fixed epoch, so that two writes never share an mtime however fast they run.
func writeControl(t *testing.T, path, body string, step int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	mt := time.Unix(1700000000+int64(step), 0)
	if err := os.Chtimes(path, mt, mt); err != nil {
		t.Fatal(err)
	}
}

// fakeValues is what a sample and the health check read from a fake device.
type fakeValues struct {
	util, memUtil uint32
	memUsedMiB    uint64
	temp          uint32
	powerW        float64
	smClock       uint32
	unhealthy     string
}

func valuesOf(t *testing.T, d *FakeDevice) fakeValues {
	t.Helper()
	s := Read(d)
	return fakeValues{util: *s.GPUUtilPct, memUtil: *s.MemUtilPct, memUsedMiB: *s.MemUsedMiB, temp: *s.TemperatureC,
		powerW: *s.PowerW, smClock: *s.SMClockMHz, unhealthy: FakeHealth(d)}
}

// defaults are NewFakeDevice's values.
var defaults = fakeValues{util: 0, memUtil: 0, memUsedMiB: 0, temp: 34, powerW: 27.5, smClock: 300}

func TestFakeControl(t *testing.T) {
	type step struct {
		body        string // "" removes the file; "-" leaves it as it is
		wantChanged bool
		wantErr     string // substring of the error; "" for none
		want        [2]func(v *fakeValues)
	}
	same := func(*fakeValues) {}
	util := func(u uint32) func(v *fakeValues) { return func(v *fakeValues) { v.util = u } }
	uuid0 := fakeUUID("ctl", 0)
	cases := []struct {
		name  string
		steps []step
	}{
		{"missing file: the defaults", []step{{body: "", want: [2]func(*fakeValues){same, same}}}},
		{"all fields applied to every GPU", []step{{
			body: `{"all": {"util_pct": 95, "mem_util_pct": 40, "mem_used_mib": 9000, "temp_c": 71,
				"power_w": 60.5, "sm_clock_mhz": 1500, "healthy": true, "health_description": "ignored"}}`,
			wantChanged: true,
			want: [2]func(*fakeValues){
				func(v *fakeValues) { *v = fakeValues{95, 40, 9000, 71, 60.5, 1500, ""} },
				func(v *fakeValues) { *v = fakeValues{95, 40, 9000, 71, 60.5, 1500, ""} },
			},
		}}},
		{"per-GPU entry overrides all, field by field", []step{{
			body: `{"all": {"util_pct": 95, "temp_c": 70},
				"gpus": {"` + uuid0 + `": {"util_pct": 12, "healthy": false, "health_description": "fan failed"}}}`,
			wantChanged: true,
			want: [2]func(*fakeValues){
				func(v *fakeValues) { v.util, v.temp, v.unhealthy = 12, 70, "fan failed" },
				func(v *fakeValues) { v.util, v.temp = 95, 70 },
			},
		}}},
		{"unhealthy without a description names the file", []step{{
			body:        `{"all": {"healthy": false}}`,
			wantChanged: true,
			want: [2]func(*fakeValues){
				func(v *fakeValues) { v.unhealthy = "marked unhealthy by the fake GPU control file <path>" },
				func(v *fakeValues) { v.unhealthy = "marked unhealthy by the fake GPU control file <path>" },
			},
		}}},
		{"a changed file is read again; an unchanged one is not", []step{
			{body: `{"all": {"util_pct": 12}}`, wantChanged: true, want: [2]func(*fakeValues){util(12), util(12)}},
			{body: "-", want: [2]func(*fakeValues){util(12), util(12)}},
			{body: `{"all": {"util_pct": 97}}`, wantChanged: true, want: [2]func(*fakeValues){util(97), util(97)}},
			{body: `{"all": {"util_pct": 97}} `, want: [2]func(*fakeValues){util(97), util(97)}}, // new mtime, same values
		}},
		{"malformed file keeps the last good values, reported once", []step{
			{body: `{"all": {"util_pct": 12}}`, wantChanged: true, want: [2]func(*fakeValues){util(12), util(12)}},
			{body: `{"all": {"util_pct": 1`, wantErr: "not valid control JSON", want: [2]func(*fakeValues){util(12), util(12)}},
			{body: "-", want: [2]func(*fakeValues){util(12), util(12)}},
			{body: `{"all": {"util_pct": 50}}`, wantChanged: true, want: [2]func(*fakeValues){util(50), util(50)}},
		}},
		{"unknown field is malformed", []step{
			{body: `{"all": {"util_pct": 12}}`, wantChanged: true, want: [2]func(*fakeValues){util(12), util(12)}},
			{body: `{"all": {"utilization": 3}}`, wantErr: `unknown field "utilization"`,
				want: [2]func(*fakeValues){util(12), util(12)}},
		}},
		{"out of range values are malformed", []step{
			{body: `{"all": {"util_pct": 101}}`, wantErr: "all.util_pct: 101 is not a percentage",
				want: [2]func(*fakeValues){same, same}},
			{body: `{"all": {"util_pct": -1}}`, wantErr: "not valid control JSON", want: [2]func(*fakeValues){same, same}},
			{body: `{"all": {"mem_used_mib": 20000}}`, wantErr: "more than the GPU's 16384 MiB",
				want: [2]func(*fakeValues){same, same}},
			{body: `{"all": {"power_w": -3}}`, wantErr: "power_w", want: [2]func(*fakeValues){same, same}},
		}},
		{"removing the file restores the defaults", []step{
			{body: `{"all": {"util_pct": 12, "healthy": false, "health_description": "x"}}`, wantChanged: true,
				want: [2]func(*fakeValues){
					func(v *fakeValues) { v.util, v.unhealthy = 12, "x" },
					func(v *fakeValues) { v.util, v.unhealthy = 12, "x" },
				}},
			{body: "", wantChanged: true, want: [2]func(*fakeValues){same, same}},
		}},
		{"a key naming no GPU is reported and skipped", []step{{
			body:        `{"all": {"util_pct": 30}, "gpus": {"GPU-elsewhere": {"util_pct": 1}}}`,
			wantChanged: true, wantErr: "GPU-elsewhere name(s) no GPU of this node",
			want: [2]func(*fakeValues){util(30), util(30)},
		}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lib, path := controlled(t)
			if lib.ControlFile() != path {
				t.Fatalf("ControlFile() = %q", lib.ControlFile())
			}
			devs := lib.Devices()
			for i, st := range tc.steps {
				switch st.body {
				case "":
					if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
						t.Fatal(err)
					}
				case "-":
				default:
					writeControl(t, path, st.body, i)
				}
				changed, err := lib.ApplyControl()
				if changed != st.wantChanged {
					t.Errorf("step %d: changed = %v, want %v", i, changed, st.wantChanged)
				}
				switch {
				case st.wantErr == "" && err != nil:
					t.Errorf("step %d: unexpected error %v", i, err)
				case st.wantErr != "" && (err == nil || !strings.Contains(err.Error(), st.wantErr)):
					t.Errorf("step %d: error %v, want one containing %q", i, err, st.wantErr)
				case st.wantErr != "" && !strings.Contains(err.Error(), path):
					t.Errorf("step %d: error %v does not name the file", i, err)
				}
				for j, d := range devs {
					want := defaults
					st.want[j](&want)
					want.unhealthy = strings.ReplaceAll(want.unhealthy, "<path>", path)
					if got := valuesOf(t, d); got != want {
						t.Errorf("step %d: GPU %d = %+v, want %+v", i, j, got, want)
					}
				}
				// Every problem is reported once: asking again without a
				// change of the file is silent and changes nothing.
				if changed, err := lib.ApplyControl(); changed || err != nil {
					t.Errorf("step %d: second ApplyControl = %v, %v; want false, nil", i, changed, err)
				}
			}
		})
	}
}

// TestFakeControlOff: without a control file the fake is what tests make it.
func TestFakeControlOff(t *testing.T) {
	lib := NewFake(FakeSpec{Count: 1, Model: "m", MemoryMiB: 1})
	lib.Devices()[0].Update(func(d *FakeDevice) { d.Util.GPU = 77 })
	if changed, err := lib.ApplyControl(); changed || err != nil {
		t.Errorf("ApplyControl = %v, %v; want false, nil", changed, err)
	}
	if lib.ControlFile() != "" {
		t.Errorf("ControlFile() = %q", lib.ControlFile())
	}
	if v := valuesOf(t, lib.Devices()[0]); v.util != 77 || v.unhealthy != "" {
		t.Errorf("values %+v", v)
	}
	if FakeHealth(nil) != "" {
		t.Errorf("FakeHealth(nil) not empty")
	}
}

// TestFakeControlNotAFile: a directory where the file should be is reported
// once and changes nothing.
func TestFakeControlNotAFile(t *testing.T) {
	lib, path := controlled(t)
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatal(err)
	}
	changed, err := lib.ApplyControl()
	if changed || err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("ApplyControl = %v, %v; want false and a 'not a regular file' error", changed, err)
	}
	if changed, err := lib.ApplyControl(); changed || err != nil {
		t.Errorf("again: %v, %v; want false, nil", changed, err)
	}
}
