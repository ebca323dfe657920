// Package sweepjob turns a sweep spec into what its controller needs: the
// record kept in Consul (Record), the trial jobs made from one rendered
// template (TrialJob), and the Nomad side of the controller (Launcher).
//
// Trials are one Nomad job each, not dispatches of a parameterized job: a
// trial is a train spec rendered by the same pure function as any other,
// so every train feature (group restarts from its own checkpoint directory,
// images, artifacts) applies unchanged; its job ID is fixed by its index,
// so registering it with Nomad's enforce-index 0 is create-only and no
// trial can ever run twice; and each trial can be stopped on its own.
package sweepjob

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

// The template's stand-ins for a trial's values. They survive HCL and the
// agent's parser as plain text (no NUL, no "${" or "%{"), and a spec that
// holds the marker itself is refused, so only our stand-ins are replaced.
const (
	tokenMark  = "@@gpujob-"
	trialToken = tokenMark + "trial@@"
)

func paramToken(name string) string { return tokenMark + "param:" + name + "@@" }

// TemplateHCL renders the jobspec every trial of sw is made from: the
// train template with each param reference as a stand-in, its gpujob task
// marked as a trial of sw.
func TemplateHCL(sw *spec.Sweep, ro render.Options) ([]byte, error) {
	t := *sw.Template
	pairs := make([]string, 0, 2*len(sw.Params))
	for _, p := range sw.Params {
		pairs = append(pairs, spec.Placeholder(p.Name), paramToken(p.Name))
	}
	r := strings.NewReplacer(pairs...)
	check := func(field, v string) (string, error) {
		if strings.Contains(v, tokenMark) {
			return "", fmt.Errorf("sweep %q: %s holds %q, which gpujob reserves for its trial templates", sw.Name, field, tokenMark)
		}
		return r.Replace(v), nil
	}
	var err error
	if t.Command, err = check("command", t.Command); err != nil {
		return nil, err
	}
	t.Args = append([]string(nil), t.Args...)
	for i := range t.Args {
		if t.Args[i], err = check(fmt.Sprintf("args[%d]", i), t.Args[i]); err != nil {
			return nil, err
		}
	}
	if t.Env != nil {
		env := make(map[string]string, len(t.Env))
		for k, v := range t.Env {
			if env[k], err = check("env."+k, v); err != nil {
				return nil, err
			}
		}
		t.Env = env
	}
	ro.Sweep, ro.Trial = sw.Name, trialToken
	return ro.Jobspec(&t)
}

// TrialHCL renders the jobspec of one trial with its actual values, as
// `gpujob sweep render` shows it.
func TrialHCL(sw *spec.Sweep, ro render.Options, index int, a search.Assignment) ([]byte, error) {
	t, err := sw.Train(a)
	if err != nil {
		return nil, err
	}
	t.Name = controller.TrialJobID(sw.Name, index)
	ro.Sweep, ro.Trial = sw.Name, controller.TrialID(index)
	return ro.Jobspec(t)
}

// TrialJob makes trial's job from the parsed template: every stand-in
// replaced by the trial's value, the job named after the trial, stamped
// with the sweep's run (contract.MetaRun) so that its checkpoint directory
// is this submission's: a purged sweep submitted again under the same
// name starts its trials afresh, while a trial whose allocation is
// replaced resumes from its own checkpoints.
func TrialJob(template *api.Job, trial controller.Trial, run string) (*api.Job, error) {
	b, err := json.Marshal(template)
	if err != nil {
		return nil, fmt.Errorf("trial %s: encoding the template: %w", trial.ID, err)
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, fmt.Errorf("trial %s: decoding the template: %w", trial.ID, err)
	}
	pairs := []string{trialToken, trial.ID}
	for name, v := range trial.Params {
		pairs = append(pairs, paramToken(name), v.String())
	}
	r := strings.NewReplacer(pairs...)
	tree = replaceStrings(tree, r)
	b, err = json.Marshal(tree)
	if err != nil {
		return nil, fmt.Errorf("trial %s: encoding its job: %w", trial.ID, err)
	}
	var job api.Job
	if err := json.Unmarshal(b, &job); err != nil {
		return nil, fmt.Errorf("trial %s: decoding its job: %w", trial.ID, err)
	}
	if s := string(b); strings.Contains(s, tokenMark) {
		i := strings.Index(s, tokenMark)
		return nil, fmt.Errorf("trial %s: its job still holds a stand-in near %q: the sweep's params changed since it was submitted",
			trial.ID, s[i:min(len(s), i+40)])
	}
	id := trial.JobID
	job.ID, job.Name = &id, &id
	if job.Meta == nil {
		job.Meta = map[string]string{}
	}
	job.Meta[contract.MetaRun] = run
	return &job, nil
}

// replaceStrings applies r to every string in a decoded JSON tree, keys
// included (env names may not hold params, but nothing depends on that).
func replaceStrings(v any, r *strings.Replacer) any {
	switch x := v.(type) {
	case string:
		return r.Replace(x)
	case []any:
		for i := range x {
			x[i] = replaceStrings(x[i], r)
		}
		return x
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[r.Replace(k)] = replaceStrings(e, r)
		}
		return out
	}
	return v
}
