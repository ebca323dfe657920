// Package render turns a training spec into the Nomad jobspec (HCL2) that
// runs it with the gpujob task driver. It writes with hclwrite, never
// string templates, and its output is deterministic: the same spec gives
// the same bytes.
package render

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/zclconf/go-cty/cty"

	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/ctyval"
	"github.com/gpujob/gpujob/internal/safename"
)

// Names shared with the rest of the CLI.
const (
	// Driver is the task driver's name (PluginInfo.Name).
	Driver = "gpujob"
	// KillTimeout is the training task's kill_timeout: Nomad clients'
	// default max_kill_timeout, so no client shortens it.
	KillTimeout = 30 * time.Second
	// Group and Task name the one group and task of every rendered job.
	Group = "train"
	Task  = "train"
	// Port is the label of the group's rendezvous port (MASTER_PORT).
	Port = "rdzv"
	// Device is the device every GPU job asks for.
	Device = "nvidia/gpu"

	// MetaKind marks the job as gpujob's (`gpujob list` filters on it);
	// MetaWorkers and MetaGPUsPerWorker record the spec's shape.
	MetaKind          = "gpujob"
	MetaKindTrain     = "train"
	MetaWorkers       = "gpujob_workers"
	MetaGPUsPerWorker = "gpujob_gpus_per_worker"
)

const header = "# Rendered by `gpujob render` from a train spec: edit the spec, not this file.\n"

// Jobspec renders the Nomad jobspec for t.
func Jobspec(t *spec.Train) ([]byte, error) {
	if t == nil {
		return nil, fmt.Errorf("render: no spec")
	}
	if t.Name == "" || t.Command == "" || t.Workers < 1 || t.GPUsPerWorker < 0 {
		return nil, fmt.Errorf("render: spec %q is incomplete (name, command, workers >= 1 and gpus_per_worker >= 0 are required)", t.Name)
	}
	// spec refuses such names with their position; a Train built in code
	// gets the same rule here.
	if err := safename.Validate(t.Name); err != nil {
		return nil, fmt.Errorf("render: job name %q %v: it must be %s", t.Name, err, safename.Allowed)
	}
	f := hclwrite.NewEmptyFile()
	root := f.Body()
	root.AppendUnstructuredTokens(hclwrite.Tokens{{Type: hclsyntax.TokenComment, Bytes: []byte(header)}})
	root.AppendNewline()

	job := root.AppendNewBlock("job", []string{t.Name}).Body()
	job.SetAttributeValue("type", cty.StringVal("batch"))
	job.SetAttributeValue("datacenters", ctyval.Strings(t.Datacenters))
	if t.Namespace != "" {
		job.SetAttributeValue("namespace", cty.StringVal(t.Namespace))
	}
	if t.NodePool != "" {
		job.SetAttributeValue("node_pool", cty.StringVal(t.NodePool))
	}
	if t.Priority != 0 && t.Priority != spec.DefaultPriority {
		job.SetAttributeValue("priority", cty.NumberIntVal(int64(t.Priority)))
	}
	meta := map[string]string{}
	for k, v := range t.Meta {
		meta[k] = v
	}
	meta[MetaKind] = MetaKindTrain
	meta[MetaWorkers] = strconv.Itoa(t.Workers)
	meta[MetaGPUsPerWorker] = strconv.Itoa(t.GPUsPerWorker)
	job.SetAttributeValue("meta", ctyval.StringMap(meta))
	job.AppendNewline()

	group := job.AppendNewBlock("group", []string{Group}).Body()
	group.SetAttributeValue("count", cty.NumberIntVal(int64(t.Workers)))
	group.AppendNewline()
	// MASTER_PORT: rank 0's allocated port; every member offers its own.
	group.AppendNewBlock("network", nil).Body().AppendNewBlock("port", []string{Port})
	group.AppendNewline()
	// The driver restarts the whole group (max_restarts); Nomad restarting
	// one member alone would only make it rejoin.
	restart := group.AppendNewBlock("restart", nil).Body()
	restart.SetAttributeValue("attempts", cty.Zero)
	restart.SetAttributeValue("mode", cty.StringVal("fail"))
	group.AppendNewline()
	reschedule := group.AppendNewBlock("reschedule", nil).Body()
	reschedule.SetAttributeValue("attempts", cty.Zero)
	reschedule.SetAttributeValue("unlimited", cty.False)
	group.AppendNewline()

	task := group.AppendNewBlock("task", []string{Task}).Body()
	task.SetAttributeValue("driver", cty.StringVal(Driver))
	// Nomad's default 5s is too short for a stop's cleanup: the supervisor
	// gives most of kill_timeout to the ranks (to save a checkpoint on
	// SIGTERM) and the rest to leaving the rendezvous in Consul.
	task.SetAttributeValue("kill_timeout", cty.StringVal(Duration(KillTimeout)))
	task.AppendNewline()

	config := task.AppendNewBlock("config", nil).Body()
	config.SetAttributeValue("command", cty.StringVal(t.Command))
	if len(t.Args) > 0 {
		config.SetAttributeValue("args", ctyval.Strings(t.Args))
	}
	if t.Workdir != "" {
		config.SetAttributeValue("workdir", cty.StringVal(t.Workdir))
	}
	if len(t.Preload) > 0 {
		config.SetAttributeValue("preload", ctyval.Strings(t.Preload))
	}
	config.SetAttributeValue("max_restarts", cty.NumberIntVal(int64(t.MaxFailures)))
	env := map[string]string{}
	for k, v := range t.Env {
		env[k] = v
	}
	if t.CheckpointEvery > 0 {
		env[spec.EnvCheckpointEvery] = strconv.Itoa(t.CheckpointEvery)
	}
	if len(env) > 0 {
		config.SetAttributeValue("env", ctyval.StringMap(env))
	}
	config.AppendNewline()
	rdzv := config.AppendNewBlock("rendezvous", nil).Body()
	rdzv.SetAttributeValue("nnodes", cty.StringVal(strconv.Itoa(t.Workers)))
	rdzv.SetAttributeValue("port", cty.StringVal(Port))
	timeout := t.RendezvousTimeout
	if timeout <= 0 {
		timeout = spec.DefaultRendezvousTimeout
	}
	rdzv.SetAttributeValue("join_timeout", cty.StringVal(Duration(timeout)))

	for _, a := range t.Artifacts {
		task.AppendNewline()
		art := task.AppendNewBlock("artifact", nil).Body()
		art.SetAttributeValue("source", cty.StringVal(a.Source))
		if a.Destination != "" {
			art.SetAttributeValue("destination", cty.StringVal(a.Destination))
		}
		if len(a.Options) > 0 {
			// Nomad reads artifact options as a block only.
			opts := art.AppendNewBlock("options", nil).Body()
			for _, k := range sortedKeys(a.Options) {
				opts.SetAttributeValue(k, cty.StringVal(a.Options[k]))
			}
		}
	}

	task.AppendNewline()
	res := task.AppendNewBlock("resources", nil).Body()
	res.SetAttributeValue("cpu", cty.NumberIntVal(int64(t.Resources.CPU)))
	// /dev/shm pages are charged to the task's memory: reserve both.
	res.SetAttributeValue("memory", cty.NumberIntVal(int64(t.Resources.TaskMemoryMiB())))
	if t.GPUsPerWorker > 0 {
		res.AppendNewline()
		dev := res.AppendNewBlock("device", []string{Device}).Body()
		dev.SetAttributeValue("count", cty.NumberIntVal(int64(t.GPUsPerWorker)))
		if t.GPU != nil && t.GPU.Model != "" {
			dev.AppendNewline()
			c := dev.AppendNewBlock("constraint", nil).Body()
			c.SetAttributeRaw("attribute", interpolation("device", "model"))
			c.SetAttributeValue("value", cty.StringVal(t.GPU.Model))
		}
		if t.GPU != nil && t.GPU.MinMemoryMiB > 0 {
			dev.AppendNewline()
			c := dev.AppendNewBlock("constraint", nil).Body()
			c.SetAttributeRaw("attribute", interpolation("device", "attr", "memory"))
			c.SetAttributeValue("operator", cty.StringVal(">="))
			c.SetAttributeValue("value", cty.StringVal(Memory(t.GPU.MinMemoryMiB)))
		}
	}
	return f.Bytes(), nil
}

// interpolation is the tokens of "${a.b.c}": a Nomad runtime attribute
// (the jobspec parser leaves ${device.*}, ${attr.*}, … to the scheduler).
func interpolation(parts ...string) hclwrite.Tokens {
	toks := hclwrite.Tokens{
		{Type: hclsyntax.TokenOQuote, Bytes: []byte(`"`)},
		{Type: hclsyntax.TokenTemplateInterp, Bytes: []byte(`${`)},
	}
	for i, p := range parts {
		if i > 0 {
			toks = append(toks, &hclwrite.Token{Type: hclsyntax.TokenDot, Bytes: []byte(".")})
		}
		toks = append(toks, &hclwrite.Token{Type: hclsyntax.TokenIdent, Bytes: []byte(p)})
	}
	return append(toks,
		&hclwrite.Token{Type: hclsyntax.TokenTemplateSeqEnd, Bytes: []byte("}")},
		&hclwrite.Token{Type: hclsyntax.TokenCQuote, Bytes: []byte(`"`)},
	)
}

// Duration writes d the short way: "5m", "1h30m", "90s" → "1m30s".
func Duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// Memory writes a MiB count with Nomad's units: "16 GiB" when whole, else
// "1536 MiB".
func Memory(mib int) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%d GiB", mib/1024)
	}
	return fmt.Sprintf("%d MiB", mib)
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
