package sweepjob

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	consul "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/spec"
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
		Template: template, SpecFile: specFile, Source: source, Submitted: now,
	}
}

// Plan is the controller's plan of the sweep.
func (r *Record) Plan() (*controller.Plan, error) {
	if r.Version != RecordVersion {
		return nil, fmt.Errorf("sweep %s: record version %d, this gpujob reads %d", r.Sweep, r.Version, RecordVersion)
	}
	p := &controller.Plan{
		Namespace: r.Namespace, Sweep: r.Sweep, Metric: r.Metric, Mode: r.Mode, Goal: r.Goal,
		MaxTrials: r.MaxTrials, Parallel: r.Parallel, MaxFailedTrials: r.MaxFailedTrials,
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
	key := sweepkv.SpecKey(prefix, ns, sweep)
	pair, _, err := c.KV().Get(key, (&consul.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	if pair == nil {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal(pair.Value, &r); err != nil {
		return nil, fmt.Errorf("reading %s: %w", key, err)
	}
	return &r, nil
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
