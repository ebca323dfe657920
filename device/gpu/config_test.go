package gpu

import (
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	log "github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/device"

	"github.com/gpujob/gpujob/device/nvml"
	"github.com/gpujob/gpujob/internal/pluginconfig"
)

func xidSet(xs ...uint64) map[uint64]bool {
	m := map[uint64]bool{}
	for _, x := range xs {
		m[x] = true
	}
	return m
}

var defaultXidSet = xidSet(13, 31, 43, 45, 68, 109)

// TestSetConfigInvalid: each bad config fails SetConfig with a message that
// names the offending field.
func TestSetConfigInvalid(t *testing.T) {
	fake := func(f FakeConfig) *FakeConfig { return &f }
	cases := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"unknown backend", Config{Enabled: true, Backend: "cuda"}, []string{"backend", `"cuda"`, `"nvml"`, `"fake"`}},
		{"negative fake.count", Config{Enabled: true, Backend: BackendFake, Fake: fake(FakeConfig{Count: -1, Model: "T4", MemoryMiB: 1})},
			[]string{"fake.count", "-1"}},
		{"empty fake.model", Config{Enabled: true, Fake: fake(FakeConfig{Count: 1, MemoryMiB: 1})}, []string{"fake.model"}},
		{"zero fake.memory_mib", Config{Enabled: true, Fake: fake(FakeConfig{Count: 1, Model: "T4"})}, []string{"fake.memory_mib"}},
		{"negative fake.memory_mib", Config{Enabled: true, Fake: fake(FakeConfig{Count: 1, Model: "T4", MemoryMiB: -5})},
			[]string{"fake.memory_mib", "-5"}},
		{"period not a duration", Config{Enabled: true, FingerprintPeriod: "soon"}, []string{"fingerprint_period", `"soon"`}},
		{"period without unit", Config{Enabled: true, FingerprintPeriod: "30"}, []string{"fingerprint_period", `"30"`}},
		{"negative period", Config{Enabled: true, FingerprintPeriod: "-5s"}, []string{"fingerprint_period", "positive", "-5s"}},
		{"zero period", Config{Enabled: true, FingerprintPeriod: "0s"}, []string{"fingerprint_period", "positive"}},
		{"negative xid", Config{Enabled: true, Health: &HealthConfig{Enabled: true, IgnoredXids: []int64{13, -1}}},
			[]string{"health.ignored_xids", "-1"}},
		{"relative fake.control_file", Config{Enabled: true, Backend: BackendFake,
			Fake: fake(FakeConfig{Count: 1, Model: "T4", MemoryMiB: 1, ControlFile: "fake-gpus/a.json"})},
			[]string{"fake.control_file", `"fake-gpus/a.json"`, "absolute"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			called := false
			p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { called = true; return newFakeLib(1, "m") })
			err := p.SetConfig(encode(t, tc.cfg))
			if err == nil {
				t.Fatalf("SetConfig accepted %+v", tc.cfg)
			}
			for _, w := range append(tc.want, PluginName) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %s", err, w)
				}
			}
			if called {
				t.Errorf("the backend was loaded for an invalid config")
			}
		})
	}
}

func TestSetConfigUndecodable(t *testing.T) {
	p := New(log.NewNullLogger(), DefaultLibrary)
	err := p.SetConfig(&base.Config{PluginConfig: []byte{0xc1, 0x00}}) // 0xc1 is never valid msgpack
	if err == nil || !strings.Contains(err.Error(), "decoding") {
		t.Fatalf("SetConfig(garbage) = %v, want a decoding error", err)
	}
}

// TestValidateDefaults: what the agent's HCL defaults would fill in is filled
// in when a config arrives without it.
func TestValidateDefaults(t *testing.T) {
	s, err := Config{Enabled: true}.validate("host-1")
	if err != nil {
		t.Fatal(err)
	}
	want := settings{
		enabled:           true,
		backend:           BackendNVML,
		ignoredGPUs:       map[string]bool{},
		fingerprintPeriod: 60e9,
		healthEnabled:     true,
		ignoredXids:       defaultXidSet,
		fake:              FakeConfig{Count: 4, Model: "Tesla T4", MemoryMiB: 15360, IDSeed: "host-1"},
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("validate(empty) =\n %+v\nwant\n %+v", s, want)
	}
}

func TestValidateValues(t *testing.T) {
	cases := []struct {
		name  string
		cfg   Config
		check func(t *testing.T, s settings)
	}{
		{"fake block, seed from host", Config{Backend: BackendFake, Fake: &FakeConfig{Count: 0, Model: "A10", MemoryMiB: 24576}},
			func(t *testing.T, s settings) {
				if want := (FakeConfig{Count: 0, Model: "A10", MemoryMiB: 24576, IDSeed: "host-1"}); s.fake != want || s.backend != BackendFake {
					t.Errorf("fake = %+v backend %q", s.fake, s.backend)
				}
			}},
		{"explicit seed kept", Config{Fake: &FakeConfig{Count: 1, Model: "A10", MemoryMiB: 1, IDSeed: "n7"}},
			func(t *testing.T, s settings) {
				if s.fake.IDSeed != "n7" {
					t.Errorf("IDSeed = %q", s.fake.IDSeed)
				}
			}},
		{"period", Config{FingerprintPeriod: "1500ms"}, func(t *testing.T, s settings) {
			if s.fingerprintPeriod != 1500e6 {
				t.Errorf("period = %v", s.fingerprintPeriod)
			}
		}},
		{"ignored GPUs", Config{IgnoredGPUIDs: []string{"GPU-a", "GPU-b"}}, func(t *testing.T, s settings) {
			if !reflect.DeepEqual(s.ignoredGPUs, map[string]bool{"GPU-a": true, "GPU-b": true}) {
				t.Errorf("ignoredGPUs = %v", s.ignoredGPUs)
			}
		}},
		{"own xid list replaces the default", Config{Health: &HealthConfig{Enabled: true, IgnoredXids: []int64{79}}},
			func(t *testing.T, s settings) {
				if !reflect.DeepEqual(s.ignoredXids, xidSet(79)) || !s.healthEnabled {
					t.Errorf("ignoredXids = %v, health %v", s.ignoredXids, s.healthEnabled)
				}
			}},
		{"empty xid list ignores none", Config{Health: &HealthConfig{Enabled: true, IgnoredXids: []int64{}}},
			func(t *testing.T, s settings) {
				if len(s.ignoredXids) != 0 {
					t.Errorf("ignoredXids = %v, want none", s.ignoredXids)
				}
			}},
		{"health block without list keeps defaults", Config{Health: &HealthConfig{Enabled: true}},
			func(t *testing.T, s settings) {
				if !reflect.DeepEqual(s.ignoredXids, defaultXidSet) {
					t.Errorf("ignoredXids = %v", s.ignoredXids)
				}
			}},
		{"health off", Config{Health: &HealthConfig{Enabled: false}}, func(t *testing.T, s settings) {
			if s.healthEnabled {
				t.Errorf("health enabled")
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.cfg.validate("host-1")
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, s)
		})
	}
}

// TestSetConfigBackend: the factory gets the backend and fake spec the config
// asked for; an empty PluginConfig means enabled with the defaults.
func TestSetConfigBackend(t *testing.T) {
	host, _ := os.Hostname()
	cases := []struct {
		name        string
		cfg         *base.Config
		wantBackend string
		wantSpec    nvml.FakeSpec
	}{
		{"empty config", &base.Config{}, BackendNVML, nvml.FakeSpec{Count: 4, Model: "Tesla T4", MemoryMiB: 15360, Seed: host}},
		{"fake block", encode(t, Config{Enabled: true, Backend: BackendFake,
			Fake: &FakeConfig{Count: 3, Model: "NVIDIA A10", MemoryMiB: 24576, IDSeed: "n1"}}),
			BackendFake, nvml.FakeSpec{Count: 3, Model: "NVIDIA A10", MemoryMiB: 24576, Seed: "n1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var gotBackend string
			var gotSpec nvml.FakeSpec
			p := New(log.NewNullLogger(), func(b string, s nvml.FakeSpec) nvml.Library {
				gotBackend, gotSpec = b, s
				return newFakeLib(1, "m")
			})
			if err := p.SetConfig(tc.cfg); err != nil {
				t.Fatal(err)
			}
			if gotBackend != tc.wantBackend || gotSpec != tc.wantSpec {
				t.Errorf("factory(%q, %+v), want (%q, %+v)", gotBackend, gotSpec, tc.wantBackend, tc.wantSpec)
			}
		})
	}
}

func TestDisabled(t *testing.T) {
	called := false
	p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { called = true; return newFakeLib(1, "m") })
	if err := p.SetConfig(encode(t, Config{Enabled: false})); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Errorf("a disabled plugin loaded its backend")
	}
	if _, err := p.Fingerprint(t.Context()); !errors.Is(err, device.ErrPluginDisabled) {
		t.Errorf("Fingerprint = %v, want ErrPluginDisabled", err)
	}
	if _, err := p.Stats(t.Context(), 0); !errors.Is(err, device.ErrPluginDisabled) {
		t.Errorf("Stats = %v, want ErrPluginDisabled", err)
	}
}

// agentConfig turns the body of an agent's plugin config block into the
// msgpack the agent sends, as Nomad's plugin loader does: HCL1 into a map,
// then the plugin's hclspec (with its defaults), then cty msgpack.
func agentConfig(t *testing.T, body string) (*base.Config, error) {
	t.Helper()
	data, err := pluginconfig.Encode(configSpec, body)
	if errors.Is(err, pluginconfig.ErrInput) {
		t.Fatal(err)
	}
	if err != nil {
		return nil, err
	}
	return &base.Config{PluginConfig: data}, nil
}

// TestAgentConfig decodes real agent configuration through the plugin's
// schema: the spec's defaults, names and types must agree with Config.
func TestAgentConfig(t *testing.T) {
	host, _ := os.Hostname()
	cases := []struct {
		name    string
		body    string
		want    func(s *settings)
		wantErr string
	}{
		{"empty block: all defaults", ``, func(*settings) {}, ""},
		{"fake backend", `
backend = "fake"
fake {
  count = 2
}`, func(s *settings) { s.backend = BackendFake; s.fake.Count = 2 }, ""},
		{"full fake block", `
backend = "fake"
fake {
  count      = 8
  model      = "NVIDIA H100 80GB HBM3"
  memory_mib = 81920
  id_seed    = "node-3"
}`, func(s *settings) {
			s.backend = BackendFake
			s.fake = FakeConfig{Count: 8, Model: "NVIDIA H100 80GB HBM3", MemoryMiB: 81920, IDSeed: "node-3"}
		}, ""},
		{"fake device nodes", `
backend = "fake"
fake {
  dev_root = "/tmp/fakedev"
}`, func(s *settings) { s.backend = BackendFake; s.fake.DevRoot = "/tmp/fakedev" }, ""},
		{"relative fake dev_root", "backend = \"fake\"\nfake {\n dev_root = \"dev\"\n}", nil, "fake.dev_root"},
		{"fake control file", `
backend = "fake"
fake {
  control_file = "/tmp/fake-gpus/a.json"
}`, func(s *settings) { s.backend = BackendFake; s.fake.ControlFile = "/tmp/fake-gpus/a.json" }, ""},
		{"relative fake control_file", "backend = \"fake\"\nfake {\n control_file = \"gpus.json\"\n}", nil,
			"fake.control_file"},
		{"ignored GPUs and period", `
ignored_gpu_ids    = ["GPU-1", "GPU-2"]
fingerprint_period = "5s"
`, func(s *settings) {
			s.ignoredGPUs = map[string]bool{"GPU-1": true, "GPU-2": true}
			s.fingerprintPeriod = 5e9
		}, ""},
		{"own ignored Xids", `
health {
  ignored_xids = [79, 48]
}`, func(s *settings) { s.ignoredXids = xidSet(79, 48) }, ""},
		{"health block without list keeps the defaults", `
health {
  enabled = true
}`, func(*settings) {}, ""},
		{"health off", `
health {
  enabled = false
}`, func(s *settings) { s.healthEnabled = false }, ""},
		{"disabled", `enabled = false`, func(s *settings) { s.enabled = false }, ""},
		{"unknown backend", `backend = "cuda"`, nil, "backend"},
		{"negative count", "backend = \"fake\"\nfake {\n count = -2\n}", nil, "fake.count"},
		{"bad period", `fingerprint_period = "often"`, nil, "fingerprint_period"},
		{"negative xid", "health {\n ignored_xids = [-3]\n}", nil, "health.ignored_xids"},
		{"unknown attribute", `colour = "green"`, nil, "colour"},
		{"wrong type", `fingerprint_period = ["1m"]`, nil, "fingerprint_period"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := New(log.NewNullLogger(), func(string, nvml.FakeSpec) nvml.Library { return newFakeLib(1, "m") })
			cfg, err := agentConfig(t, tc.body)
			if err == nil {
				err = p.SetConfig(cfg)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := settings{
				enabled: true, backend: BackendNVML, ignoredGPUs: map[string]bool{}, fingerprintPeriod: 60e9,
				healthEnabled: true, ignoredXids: defaultXidSet,
				fake: FakeConfig{Count: 4, Model: "Tesla T4", MemoryMiB: 15360, IDSeed: host},
			}
			tc.want(&want)
			if !reflect.DeepEqual(p.cfg, want) {
				t.Errorf("settings =\n %+v\nwant\n %+v", p.cfg, want)
			}
		})
	}
}
