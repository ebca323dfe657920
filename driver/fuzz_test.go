package driver

import (
	"encoding/json"
	"net"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/helper/pluginutils/hclspecutils"
	"github.com/hashicorp/nomad/helper/pluginutils/hclutils"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"

	"github.com/gpujob/gpujob/driver/rendezvous"
	"github.com/gpujob/gpujob/driver/supervisor"
)

// FuzzTaskConfig drives a task's config { … } the way a Nomad client
// hands it to the driver, without an agent: the job's config as JSON (the
// form the job API carries), decoded against the driver's schema by
// Nomad's own hclutils (as the client does before StartTask), encoded to
// msgpack and decoded into TaskConfig (the plugin RPC), then buildSpec.
// Whatever a job says, the driver must not crash, and a spec it accepts
// must be one the supervisor accepts and can run: bounded group and
// process counts, the members it expects named once each, no value exec
// would refuse.
func FuzzTaskConfig(f *testing.F) {
	for _, s := range []string{
		`{"command":"/usr/bin/python3","args":["train.py"],"rendezvous":[{"nnodes":"2:4","port":"rdzv","join_timeout":"90s"}]}`,
		`{"command":"x","nproc_per_node":4,"max_restarts":0,"log_prefix":false,"workdir":"/shared/w","env":[{"A":"1","B":"2"}]}`,
		`{"command":"x","nproc_per_node":-1}`,
		`{"command":"x","max_restarts":-5}`,
		`{"command":"x","rendezvous":[{"last_call":"-1s","join_timeout":"0"}]}`,
		`{"command":"x","workdir":"rel/dir"}`,
		`{"command":"x","env":[{"":"2"}]}`,
		`{"command":""}`,
		`{"command":"${NOMAD_TASK_DIR}/x"}`,
		`{"command":"x","rendezvous":[{},{}]}`,
		`{"command":"x","unknown":1}`,
		`{"command":"x","sweep":"bert-lr","trial":"t1"}`,
		`{"command":"x","sweep":"bert-lr"}`,
		`{}`,
	} {
		f.Add(s) // more in testdata/fuzz/FuzzTaskConfig: configs refused since
	}
	spec, err := (&Driver{}).TaskConfigSchema()
	if err != nil {
		f.Fatal(err)
	}
	dec, diags := hclspecutils.Convert(spec)
	if diags.HasErrors() {
		f.Fatal(diags)
	}
	f.Fuzz(func(t *testing.T, config string) {
		var raw map[string]any
		if json.Unmarshal([]byte(config), &raw) != nil {
			return
		}
		val, diags, errs := hclutils.ParseHclInterface(raw, dec, nil)
		if diags.HasErrors() || len(errs) > 0 {
			return // Nomad refuses the job before it reaches the driver
		}
		cfg := taskCfg()
		if err := cfg.EncodeDriverConfig(val); err != nil {
			t.Fatalf("Nomad could not encode a config its schema accepted: %v", err)
		}
		var tc TaskConfig
		if err := cfg.DecodeDriverConfig(&tc); err != nil {
			t.Fatalf("a config the schema accepted does not decode into TaskConfig: %v", err)
		}
		checkSpec(t, cfg, &tc)
	})
}

// FuzzDriverConfigMsgpack feeds the plugin's decoder arbitrary bytes: what
// reaches DecodeDriverConfig over the plugin RPC when the client is not
// the Nomad we expect.
func FuzzDriverConfigMsgpack(f *testing.F) {
	for _, tc := range []TaskConfig{
		{Command: "/usr/bin/python3", Args: []string{"a"}, Rendezvous: &RendezvousConfig{NNodes: "2", Port: "rdzv"}, Env: []map[string]string{{"A": "1"}}},
		{Command: "x", NProcPerNode: 3, MaxRestarts: 2},
	} {
		var b []byte
		if err := base.MsgPackEncode(&b, &tc); err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xdf, 0xff, 0xff, 0xff, 0xff})                                 // a map claiming 4G entries
	f.Add([]byte{0x81, 0xa4, 'a', 'r', 'g', 's', 0xdd, 0xff, 0xff, 0xff, 0xff}) // args: an array claiming 4G elements
	f.Fuzz(func(t *testing.T, data []byte) {
		var tc TaskConfig
		if base.MsgPackDecode(data, &tc) != nil {
			return
		}
		checkSpec(t, taskCfg(), &tc)
	})
}

// checkSpec runs buildSpec and, when it accepts tc, checks the spec.
func checkSpec(t *testing.T, cfg *drivers.TaskConfig, tc *TaskConfig) {
	t.Helper()
	pc := &Config{CheckpointRoot: "/shared/ckpt"}
	if err := pc.validate(); err != nil {
		t.Fatal(err)
	}
	s, err := buildSpec(cfg, tc, pc, noEnv)
	if err != nil {
		return
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("buildSpec returned a spec the supervisor refuses: %v", err)
	}
	switch {
	case s.Command != tc.Command || s.Command == "":
		t.Fatalf("command %q became %q", tc.Command, s.Command)
	case !reflect.DeepEqual(s.Args, tc.Args):
		t.Fatalf("args %q became %q", tc.Args, s.Args)
	case s.Min < 1 || s.Max < s.Min || s.Max > rendezvous.MaxMembers:
		t.Fatalf("accepted nnodes %d:%d", s.Min, s.Max)
	case s.NProcPerNode < 1 || s.NProcPerNode > rendezvous.MaxLocalWorldSize:
		t.Fatalf("accepted nproc_per_node %d", s.NProcPerNode)
	case s.JoinTimeout <= 0 || s.LastCall <= 0 || s.MaxRestarts < 0:
		t.Fatalf("accepted join_timeout %v, last_call %v, max_restarts %d", s.JoinTimeout, s.LastCall, s.MaxRestarts)
	case s.Workdir != "" && !filepath.IsAbs(s.Workdir):
		t.Fatalf("accepted a relative workdir %q", s.Workdir)
	case len(s.Expected) != s.Max:
		t.Fatalf("%d expected members for nnodes max %d", len(s.Expected), s.Max)
	}
	seen := map[string]bool{}
	for _, name := range s.Expected {
		if seen[name] {
			t.Fatalf("expected member %q twice", name)
		}
		seen[name] = true
	}
	if _, _, err := net.SplitHostPort(s.Self.Addr); err != nil {
		t.Fatalf("member address %q: %v", s.Self.Addr, err)
	}
	// exec refuses a NUL anywhere in the command line or environment, and
	// a name with '=' would set another variable than the one written.
	for _, v := range append([]string{s.Command, s.Workdir}, s.Args...) {
		if strings.ContainsRune(v, 0) {
			t.Fatalf("accepted a NUL in %q", v)
		}
	}
	if want := tc.envMap(); !reflect.DeepEqual(s.Env, want) {
		t.Fatalf("env %v became %v", want, s.Env)
	}
	for k, v := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			t.Fatalf("accepted env %q=%q", k, v)
		}
	}
	// A trial's keys are in the sweeps' tree, in the job's namespace,
	// only with both names.
	switch r := s.Report; {
	case (tc.Sweep != "" && tc.Trial != "") != (r != nil):
		t.Fatalf("sweep %q trial %q gave report %+v", tc.Sweep, tc.Trial, r)
	case r != nil && (!strings.HasPrefix(r.MetricsKey, pc.SweepKeyPrefix+"/ml/") || !strings.HasPrefix(r.StopKey, pc.SweepKeyPrefix+"/ml/") ||
		strings.Count(r.MetricsKey, "/") != 6 || strings.Count(r.StopKey, "/") != 6):
		t.Fatalf("report keys %+v are not <prefix>/ml/<sweep>/trials/<trial>/…", r)
	}
	// The supervisor reads back exactly what the driver wrote.
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back supervisor.Spec
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, s) {
		t.Fatalf("the spec changes through its file:\n%+v\n%+v", s, &back)
	}
}
