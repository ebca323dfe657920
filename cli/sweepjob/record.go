package sweepjob

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"
	"unicode"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
	"github.com/gpujob/gpujob/internal/sweep/stopping"
	"github.com/gpujob/gpujob/internal/sweep/sweepkv"
)

// RecordVersion is the layout of Record; a controller refuses others.
const RecordVersion = 1

// Record is a submitted sweep, as gpujob sweep submit keeps it at
// sweepkv.SpecKey: everything the controller and the other commands need,
// so none of them reads the spec file again.
type Record struct {
	Version         int             `json:"version"`
	Namespace       string          `json:"namespace"`
	Sweep           string          `json:"sweep"`
	Params          search.Space    `json:"params"`
	Metric          string          `json:"metric"`
	Mode            stopping.Mode   `json:"mode"`
	Goal            *float64        `json:"goal,omitempty"`
	Algorithm       string          `json:"algorithm"`
	Seed            uint64          `json:"seed"`
	EarlyStop       *spec.EarlyStop `json:"early_stop,omitempty"`
	MaxTrials       int             `json:"max_trials"`
	Parallel        int             `json:"parallel"`
	MaxFailedTrials int             `json:"max_failed_trials"`
	Workers         int             `json:"workers"`
	GPUsPerWorker   int             `json:"gpus_per_worker"`
	Template        *api.Job        `json:"template"`
	SpecFile        string          `json:"spec_file"`
	Source          string          `json:"source"` // the spec file's text
	// Vars and VarFiles are the -var and -var-file arguments it was
	// submitted with (best --as-train names them).
	Vars      []string  `json:"vars,omitempty"`
	VarFiles  []string  `json:"var_files,omitempty"`
	Submitted time.Time `json:"submitted"`
	// ControllerUser is the user the controller job runs as (extend
	// registers it again as the same).
	ControllerUser string `json:"controller_user,omitempty"`
	// SubmittedBy is who submitted the sweep (Submitter): in queue mode
	// its trials' queue records name them.
	SubmittedBy string `json:"submitted_by,omitempty"`
}

// NewRecord makes the record of sw, whose trial template the agent parsed
// into template.
func NewRecord(sw *spec.Sweep, ns string, template *api.Job, specFile, source string, now time.Time) *Record {
	return &Record{
		Version: RecordVersion, Namespace: ns, Sweep: sw.Name, Params: sw.Params,
		Metric: sw.Objective.Metric, Mode: sw.Objective.Mode, Goal: sw.Objective.Goal,
		Algorithm: sw.Search.Algorithm, Seed: sw.Search.Seed, EarlyStop: sw.EarlyStop,
		MaxTrials: sw.MaxTrials, Parallel: sw.Parallel, MaxFailedTrials: sw.MaxFailedTrials,
		Workers: sw.Template.Workers, GPUsPerWorker: sw.Template.GPUsPerWorker,
		Template: template, SpecFile: specFile, Source: source, Submitted: now, SubmittedBy: Submitter(),
	}
}

// Submitter names who submits a sweep: $USER, else the system's user, at
// the host. It is stored, then printed by others: nothing a terminal
// would act on, and short.
func Submitter() string {
	name := os.Getenv("USER")
	if name == "" {
		if u, err := user.Current(); err == nil {
			name = u.Username
		}
	}
	if name == "" {
		name = "unknown"
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		name += "@" + h
	}
	name = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, strings.ToValidUTF8(name, "?"))
	if len(name) > 200 {
		name = strings.ToValidUTF8(name[:200], "")
	}
	return name
}

// Plan is the controller's plan of the sweep.
func (r *Record) Plan() (*controller.Plan, error) {
	if r.Version != RecordVersion {
		return nil, fmt.Errorf("sweep %s: record version %d, this gpujob reads %d", r.Sweep, r.Version, RecordVersion)
	}
	p := &controller.Plan{
		Namespace: r.Namespace, Sweep: r.Sweep, Metric: r.Metric, Mode: r.Mode, Goal: r.Goal,
		MaxTrials: r.MaxTrials, Parallel: r.Parallel, MaxFailedTrials: r.MaxFailedTrials, Space: r.Params,
		SubmittedBy: r.SubmittedBy,
	}
	var err error
	switch r.Algorithm {
	case spec.AlgorithmGrid:
		p.Sampler, err = search.NewGrid(r.Params)
	case spec.AlgorithmRandom, "":
		p.Sampler, err = search.NewRandom(r.Params, r.Seed)
	case spec.AlgorithmTPE:
		o := search.DefaultTPEOptions()
		o.Maximize = r.Mode != stopping.Min
		p.Sampler, err = search.NewTPE(r.Params, r.Seed, o)
	default:
		err = fmt.Errorf("unknown search algorithm %q", r.Algorithm)
	}
	if err != nil {
		return nil, fmt.Errorf("sweep %s: %w", r.Sweep, err)
	}
	if es := r.EarlyStop; es != nil {
		switch {
		case es.ASHA != nil:
			p.Rule, p.RuleName = *es.ASHA, controller.StoppedByASHA
		case es.Median != nil:
			p.Rule, p.RuleName = *es.Median, controller.StoppedByMedian
		}
	}
	return p, p.Validate()
}

// Run is the sweep's run stamp, which every trial job carries.
func (r *Record) Run() string { return strconv.FormatInt(r.Submitted.Unix(), 10) }

// Maximize says whether larger objective values are better.
func (r *Record) Maximize() bool { return r.Mode != stopping.Min }

// LoadRecord reads a sweep's record; nil when there is none.
func LoadRecord(ctx context.Context, c *consul.Client, prefix, ns, sweep string) (*Record, error) {
	r, _, err := ReadRecord(ctx, c, prefix, ns, sweep)
	return r, err
}

// ReadRecord reads a sweep's record and its Digest (of the bytes in
// Consul); nil and "" when there is none.
func ReadRecord(ctx context.Context, c *consul.Client, prefix, ns, sweep string) (*Record, string, error) {
	key := sweepkv.SpecKey(prefix, ns, sweep)
	pair, _, err := c.KV().Get(key, (&consul.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", key, err)
	}
	if pair == nil {
		return nil, "", nil
	}
	var r Record
	if err := json.Unmarshal(pair.Value, &r); err != nil {
		return nil, "", fmt.Errorf("reading %s: %w", key, err)
	}
	return &r, digest(pair.Value), nil
}

// Digest is the SHA-256 of the record as Create writes it: submit keeps it
// where only the controller and ACL administrators can read it (with ACLs,
// the controller's Nomad variable), and the controller registers nothing
// from a record whose digest differs. Anyone who may write the sweep's keys
// (a user of its namespace; the task driver's token, which writes every
// trial's metrics) could otherwise change the template that the controller
// registers with its own Nomad token.
func (r *Record) Digest() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encoding the record of sweep %s: %w", r.Sweep, err)
	}
	return digest(b), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Verify reports why the controller of sweep in namespace ns must not run
// the record: it is another sweep's or namespace's, its trial template is
// not a trial template of this sweep (job meta gpujob = train, gpujob_sweep
// = the sweep, gpujob_trial the trial stand-in; every gpujob task reporting
// to this sweep; no other namespace), or, when want is set, its digest is
// not want (it changed since it was submitted).
func (r *Record) Verify(ns, sweep, got, want string) error {
	switch {
	case r.Namespace != ns || r.Sweep != sweep:
		return fmt.Errorf("the record is sweep %q's of namespace %q, not %q's of %q", r.Sweep, r.Namespace, sweep, ns)
	case want != "" && got != want:
		return fmt.Errorf("the record changed since gpujob sweep submit wrote it (its SHA-256 is %s, submit recorded %s): "+
			"someone who may write the sweep's keys in Consul rewrote it", short(got), short(want))
	}
	return VerifyTemplate(r.Template, ns, sweep)
}

func short(digest string) string { return digest[:min(12, len(digest))] }

// VerifyTemplate reports why template is not a trial template of sweep in
// namespace ns, as TemplateHCL renders them.
func VerifyTemplate(template *api.Job, ns, sweep string) error {
	if template == nil {
		return fmt.Errorf("the record has no trial template")
	}
	meta := template.Meta
	for _, m := range []struct{ key, want string }{
		{contract.MetaKind, contract.KindTrain}, {contract.MetaSweep, sweep}, {contract.MetaTrial, trialToken},
	} {
		if got, ok := meta[m.key]; !ok || got != m.want {
			return fmt.Errorf("the trial template is not sweep %s's: its job meta %s is %q, want %q", sweep, m.key, got, m.want)
		}
	}
	if tns := template.Namespace; tns != nil && *tns != "" && *tns != ns {
		return fmt.Errorf("the trial template is for namespace %q, the sweep is in %q", *tns, ns)
	}
	if t := template.Type; t != nil && *t != "batch" {
		return fmt.Errorf("the trial template is a %s job; trials are batch jobs", *t)
	}
	reporters := 0
	for _, g := range template.TaskGroups {
		for _, task := range g.Tasks {
			if task == nil || task.Driver != render.Driver {
				continue
			}
			sw, hasSweep := task.Config["sweep"]
			tr, hasTrial := task.Config["trial"]
			if !hasSweep && !hasTrial {
				continue
			}
			if sw != sweep || tr != trialToken {
				return fmt.Errorf("the trial template's task %s reports to sweep %v as trial %v, not to sweep %s", task.Name, sw, tr, sweep)
			}
			reporters++
		}
	}
	if reporters == 0 {
		return fmt.Errorf("no task of the trial template reports to sweep %s (a %s task with sweep and trial in its config)", sweep, render.Driver)
	}
	return nil
}

// SaveRecord writes the record.
func SaveRecord(ctx context.Context, c *consul.Client, prefix string, r *Record) error {
	key := sweepkv.SpecKey(prefix, r.Namespace, r.Sweep)
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding the record of sweep %s: %w", r.Sweep, err)
	}
	if _, err := c.KV().Put(&consul.KVPair{Key: key, Value: b}, (&consul.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("writing %s: %w", key, err)
	}
	return nil
}

// Create writes a new sweep's record and first state in one transaction,
// each only if absent: two submissions of a name cannot mix, and a failure
// leaves neither.
func Create(ctx context.Context, c *consul.Client, prefix string, r *Record, st *controller.State) error {
	rb, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding the record of sweep %s: %w", r.Sweep, err)
	}
	sb, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encoding the state of sweep %s: %w", r.Sweep, err)
	}
	ops := consul.TxnOps{
		{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: sweepkv.SpecKey(prefix, r.Namespace, r.Sweep), Value: rb, Index: 0}},
		{KV: &consul.KVTxnOp{Verb: consul.KVCAS, Key: sweepkv.StateKey(prefix, r.Namespace, r.Sweep), Value: sb, Index: 0}},
	}
	ok, resp, _, err := c.Txn().Txn(ops, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("recording sweep %s in Consul: %w", r.Sweep, err)
	}
	if !ok {
		why := ""
		if resp != nil && len(resp.Errors) > 0 {
			why = ": " + resp.Errors[0].What
		}
		return fmt.Errorf("sweep %s was recorded by another submission at the same time%s", r.Sweep, why)
	}
	return nil
}
