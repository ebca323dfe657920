package gpu

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/nomad/plugins/shared/hclspec"
)

// Backends the plugin can read GPUs from. There is no silent fallback: a
// machine without NVML runs "fake" only when the operator says so.
const (
	BackendNVML = "nvml"
	BackendFake = "fake"
)

// defaultIgnoredXids are Xids an application causes (bad kernels, page faults,
// its own timeouts): they say nothing about the card, so by default they do not
// mark it unhealthy. The same list the Kubernetes device plugin skips.
var defaultIgnoredXids = []int64{13, 31, 43, 45, 68, 109}

// configSpec is the agent's plugin "nomad-device-gpujob" { config { ... } } block.
var configSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"enabled": hclspec.NewDefault(hclspec.NewAttr("enabled", "bool", false), hclspec.NewLiteral("true")),
	"backend": hclspec.NewDefault(hclspec.NewAttr("backend", "string", false), hclspec.NewLiteral(`"nvml"`)),
	"ignored_gpu_ids": hclspec.NewDefault(hclspec.NewAttr("ignored_gpu_ids", "list(string)", false),
		hclspec.NewLiteral("[]")),
	"fingerprint_period": hclspec.NewDefault(hclspec.NewAttr("fingerprint_period", "string", false),
		hclspec.NewLiteral(`"1m"`)),
	"health": hclspec.NewBlock("health", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"enabled":      hclspec.NewDefault(hclspec.NewAttr("enabled", "bool", false), hclspec.NewLiteral("true")),
		"ignored_xids": hclspec.NewAttr("ignored_xids", "list(number)", false),
	})),
	"fake": hclspec.NewBlock("fake", false, hclspec.NewObject(map[string]*hclspec.Spec{
		"count":        hclspec.NewDefault(hclspec.NewAttr("count", "number", false), hclspec.NewLiteral("4")),
		"model":        hclspec.NewDefault(hclspec.NewAttr("model", "string", false), hclspec.NewLiteral(`"Tesla T4"`)),
		"memory_mib":   hclspec.NewDefault(hclspec.NewAttr("memory_mib", "number", false), hclspec.NewLiteral("15360")),
		"id_seed":      hclspec.NewAttr("id_seed", "string", false),
		"dev_root":     hclspec.NewAttr("dev_root", "string", false),
		"control_file": hclspec.NewAttr("control_file", "string", false),
	})),
})

// Config is the decoded plugin configuration.
type Config struct {
	Enabled           bool          `codec:"enabled"`
	Backend           string        `codec:"backend"`
	IgnoredGPUIDs     []string      `codec:"ignored_gpu_ids"`
	FingerprintPeriod string        `codec:"fingerprint_period"`
	Health            *HealthConfig `codec:"health"`
	Fake              *FakeConfig   `codec:"fake"`
}

// HealthConfig tunes health checking.
type HealthConfig struct {
	Enabled bool `codec:"enabled"`
	// IgnoredXids are Xid events that do not make a GPU unhealthy. Nil means
	// the defaults; an empty list ignores none.
	IgnoredXids []int64 `codec:"ignored_xids"`
}

// FakeConfig describes the GPUs of the fake backend.
type FakeConfig struct {
	Count     int64  `codec:"count"`
	Model     string `codec:"model"`
	MemoryMiB int64  `codec:"memory_mib"`
	// IDSeed makes fake UUIDs differ between nodes on one machine; defaults to
	// the host name.
	IDSeed string `codec:"id_seed"`
	// DevRoot is where the fake GPUs' device nodes are (DEV_ROOT/dev/nvidiaN):
	// look-alike nodes a test made, so that reservations carry them and the
	// task driver's device isolation can be tried without NVIDIA hardware.
	// Empty: none, as on a machine without GPUs.
	DevRoot string `codec:"dev_root"`
	// ControlFile is a JSON file that drives the fake GPUs' utilisation,
	// memory, temperature, power, clock and health while the plugin runs
	// (format: nvml.FakeControl). It is checked before every stats sample and
	// fingerprint pass and read again when its mtime or size changed; missing
	// means the fake's defaults. Empty: constant fake values.
	ControlFile string `codec:"control_file"`
}

// settings is a validated Config in the types the plugin works with.
type settings struct {
	enabled           bool
	backend           string
	ignoredGPUs       map[string]bool
	fingerprintPeriod time.Duration
	healthEnabled     bool
	ignoredXids       map[uint64]bool
	fake              FakeConfig
}

// validate checks c and fills in what the agent's HCL defaults would have, so
// a config sent without them (tests, older agents) behaves the same.
func (c Config) validate(hostname string) (settings, error) {
	s := settings{enabled: c.Enabled, backend: c.Backend, ignoredGPUs: map[string]bool{}, ignoredXids: map[uint64]bool{}}
	if s.backend == "" {
		s.backend = BackendNVML
	}
	if s.backend != BackendNVML && s.backend != BackendFake {
		return s, fmt.Errorf("backend: must be %q or %q, got %q", BackendNVML, BackendFake, c.Backend)
	}
	for _, id := range c.IgnoredGPUIDs {
		s.ignoredGPUs[id] = true
	}
	period := c.FingerprintPeriod
	if period == "" {
		period = "1m"
	}
	d, err := time.ParseDuration(period)
	if err != nil {
		return s, fmt.Errorf("fingerprint_period: %q is not a duration (try \"30s\" or \"1m\"): %w", period, err)
	}
	if d <= 0 {
		return s, fmt.Errorf("fingerprint_period: must be positive, got %q", period)
	}
	s.fingerprintPeriod = d

	s.healthEnabled = true
	xids := defaultIgnoredXids
	if c.Health != nil {
		s.healthEnabled = c.Health.Enabled
		if c.Health.IgnoredXids != nil {
			xids = c.Health.IgnoredXids
		}
	}
	for _, x := range xids {
		if x < 0 {
			return s, fmt.Errorf("health.ignored_xids: Xids are positive, got %d", x)
		}
		s.ignoredXids[uint64(x)] = true
	}

	s.fake = FakeConfig{Count: 4, Model: "Tesla T4", MemoryMiB: 15360, IDSeed: hostname}
	if c.Fake != nil {
		s.fake = *c.Fake
		if s.fake.IDSeed == "" {
			s.fake.IDSeed = hostname
		}
		if s.fake.Model == "" {
			return s, fmt.Errorf("fake.model: must not be empty")
		}
	}
	if s.fake.Count < 0 {
		return s, fmt.Errorf("fake.count: must be 0 or more, got %d", s.fake.Count)
	}
	if s.fake.MemoryMiB <= 0 {
		return s, fmt.Errorf("fake.memory_mib: must be positive, got %d", s.fake.MemoryMiB)
	}
	if s.fake.DevRoot != "" && !strings.HasPrefix(s.fake.DevRoot, "/") {
		return s, fmt.Errorf("fake.dev_root: %q must be an absolute path", s.fake.DevRoot)
	}
	if s.fake.ControlFile != "" && !strings.HasPrefix(s.fake.ControlFile, "/") {
		return s, fmt.Errorf("fake.control_file: %q must be an absolute path", s.fake.ControlFile)
	}
	return s, nil
}
