package sweep

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/spf13/cobra"

	"github.com/gpujob/gpujob/cli/cmdutil"
	"github.com/gpujob/gpujob/cli/factory"
	"github.com/gpujob/gpujob/cli/gpujobs"
	"github.com/gpujob/gpujob/cli/nomadapi"
	"github.com/gpujob/gpujob/cli/render"
	"github.com/gpujob/gpujob/cli/spec"
	"github.com/gpujob/gpujob/cli/sweepcreds"
	"github.com/gpujob/gpujob/cli/sweepjob"
	"github.com/gpujob/gpujob/cli/sweepops"
	"github.com/gpujob/gpujob/internal/contract"
	"github.com/gpujob/gpujob/internal/sweep/controller"
	"github.com/gpujob/gpujob/internal/sweep/search"
)

// EnvControllerBinary names the gpujob binary the controller job runs on
// the clients, when --controller-binary does not.
const EnvControllerBinary = "GPUJOB_CONTROLLER_BINARY"

// SubmitOptions is what the command's arguments and flags ask for.
type SubmitOptions struct {
	// Path is the spec file (the argument).
	Path             string
	Vars, VarFiles   []string
	CheckpointRoot   string
	ControllerBinary string
	ControllerUser   string
	Detach           bool
	JSON             bool
}

func newSubmitCmd(f *factory.Factory) *cobra.Command { return NewSubmitCmd(f, nil) }

// NewSubmitCmd is the command running runF instead when runF is not nil: a
// test checks the Options the arguments parse into without running.
func NewSubmitCmd(f *factory.Factory, runF func(context.Context, *SubmitOptions) error) *cobra.Command {
	o := &SubmitOptions{}
	cmd := &cobra.Command{
		Use:   "submit SPEC",
		Short: "Submit a sweep spec: register its controller and watch the trials",
		Long: `Submit checks the sweep spec, records it in Consul, and registers the
sweep's controller job (<sweep>-controller), which runs the trials as jobs
<sweep>-trial-001, -002, … Then it shows a live progress line (trials running,
done, stopped early, failed, and the best so far) until the sweep ends; the
exit code is 0 when it completed, 1 when it failed or was stopped.

Ctrl-C or --detach leave the sweep running: it needs no CLI.

The controller runs on each client as the gpujob binary at
--controller-binary (default $` + EnvControllerBinary + `, else this binary's
own path), through raw_exec as the user nobody (--controller-user).

With ACLs on, the controller acts with tokens of its own, limited to the
sweep, which submit creates and keeps in the Nomad variable
nomad/jobs/<sweep>-controller; creating them takes a Nomad management token
(NOMAD_TOKEN) and, with Consul's ACLs, a Consul token with acl = "write"
(CONSUL_HTTP_TOKEN). stop --purge removes them. The controller then runs as
the user ` + sweepcreds.ControllerUser + `, which every client must have: no workload may run
as the user that holds the tokens.`,
		Example: `  gpujob sweep submit jobspecs/examples/sweep-toy.hcl
  gpujob sweep submit --detach -var workload=$PWD/jobspecs/workloads/sweep_toy.py sweep.hcl`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return cmdutil.Run(cmd.Context(), o, runF, func(ctx context.Context) error { return runSubmit(ctx, f, o, o.Path) })
		},
	}
	gpujobs.AddSpecFlags(cmd, &o.Vars, &o.VarFiles)
	gpujobs.AddRenderFlags(cmd, &o.CheckpointRoot)
	cmd.Flags().StringVar(&o.ControllerBinary, "controller-binary", "", "absolute `path` of the gpujob binary on the Nomad clients")
	cmd.Flags().StringVar(&o.ControllerUser, "controller-user", "", "`user` the controller runs as (default nobody; with ACLs "+sweepcreds.ControllerUser+")")
	cmd.Flags().BoolVar(&o.Detach, "detach", false, "return once the controller is registered")
	cmd.Flags().BoolVar(&o.JSON, "json", false, "with --detach: print the submission as JSON")
	return cmd
}

func runSubmit(ctx context.Context, f *factory.Factory, o *SubmitOptions, path string) error {
	ro, err := gpujobs.RenderOptions(o.CheckpointRoot)
	if err != nil {
		return err
	}
	sw, files, diags := spec.LoadSweep(path, spec.Options{Vars: o.Vars, VarFiles: o.VarFiles})
	if diags.HasErrors() {
		fmt.Fprint(f.IO.ErrOut, spec.Format(diags, files))
		return fmt.Errorf("%s: the spec has errors; nothing was submitted", path)
	}
	source, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	binary, err := controllerBinary(o.ControllerBinary)
	if err != nil {
		return err
	}
	e, err := newEnv(f, true)
	if err != nil {
		return err
	}
	if err := e.detectACL(); err != nil {
		return err
	}
	if sw.Template.Namespace != "" && sw.Template.Namespace != e.ns {
		return fmt.Errorf("%s: the train block's namespace %q differs from the namespace the CLI uses (%s): set --namespace %s",
			path, sw.Template.Namespace, e.ns, sw.Template.Namespace)
	}

	// The template, parsed by the agent, and one concrete trial validated
	// by it, so that a bad spec fails here and not in every trial.
	tmplHCL, err := sweepjob.TemplateHCL(sw, ro)
	if err != nil {
		return err
	}
	tmpl, err := e.nomad.ParseHCL(string(tmplHCL), "")
	if err != nil {
		return fmt.Errorf("parsing the trial template: %w", err)
	}
	first, err := firstAssignment(sw)
	if err != nil {
		return err
	}
	if _, err := sw.Train(first); err != nil {
		return err
	}
	trial := controller.Trial{ID: controller.TrialID(0), JobID: controller.TrialJobID(sw.Name, 0), Params: first}
	job, err := sweepjob.TrialJob(tmpl, trial, strconv.FormatInt(f.Now().Unix(), 10))
	if err != nil {
		return err
	}
	if err := validate(e.nomad, job, "trial "+trial.ID); err != nil {
		return err
	}
	user := controllerUser(o.ControllerUser, e)
	ctlHCL, err := render.ControllerJobspec(controllerSpec(sw, e, binary, user))
	if err != nil {
		return err
	}
	ctl, err := e.nomad.ParseHCL(string(ctlHCL), "")
	if err != nil {
		return fmt.Errorf("parsing the controller job: %w", err)
	}
	if err := validate(e.nomad, ctl, "the controller job"); err != nil {
		return err
	}

	// One sweep of a name at a time: an old one must be purged first.
	_, old, _, err := e.load(ctx, sw.Name)
	switch {
	case err == nil:
		return fmt.Errorf("sweep %s already exists (%s): gpujob sweep status %s, or remove it with gpujob sweep stop --purge %s",
			sw.Name, old.Status, sw.Name, sw.Name)
	case !errors.Is(err, sweepops.ErrNoSweep):
		return err
	}
	if err := checkControllerFree(e, *ctl.ID, sw.Name); err != nil {
		return err
	}
	// On a cluster with ACLs the controller acts with tokens of its own.
	// A token that cannot make them is refused before anything is written;
	// they are made after the record, whose creation is create-only, so a
	// concurrent submission of the name never touches the winner's.
	creds, err := e.issuer(sw.Name)
	if err != nil {
		return err
	}
	if err := creds.Check(); err != nil {
		return err
	}
	rec := sweepjob.NewRecord(sw, e.ns, tmpl, path, string(source), f.Now())
	rec.Vars, rec.VarFiles, rec.ControllerUser = o.Vars, o.VarFiles, user
	st := sweepjob.InitialState(rec, sw.MaxTrials, f.Now())
	if creds.RecordDigest, err = rec.Digest(); err != nil {
		return err
	}
	if err := sweepjob.Submit(ctx, e.consul, e.prefix, rec, st, creds.Issue); err != nil {
		return err
	}
	if err := registerController(e, ctl); err != nil {
		return fmt.Errorf("%w; the sweep is recorded but has no controller: gpujob sweep stop --purge %s, then submit again", err, sw.Name)
	}
	out := f.IO.Out
	if o.Detach {
		if o.JSON {
			return gpujobs.PrintJSON(out, map[string]any{"sweep": sw.Name, "namespace": e.ns, "controller_job": *ctl.ID,
				"max_trials": sw.MaxTrials, "parallel": sw.Parallel})
		}
		fmt.Fprintf(out, "submitted sweep %s: up to %d trials, %d at a time; controller job %s\n", sw.Name, sw.MaxTrials, sw.Parallel, *ctl.ID)
		fmt.Fprintf(out, "follow it: gpujob sweep status %s\n", sw.Name)
		return nil
	}
	fmt.Fprintf(out, "submitted sweep %s: up to %d trials, %d at a time; controller job %s\n", sw.Name, sw.MaxTrials, sw.Parallel, *ctl.ID)
	return watch(ctx, e, sw.Name)
}

// firstAssignment is a point of the space to validate a trial with: what
// the sweep's own first trial will be when nothing ran yet.
func firstAssignment(sw *spec.Sweep) (search.Assignment, error) {
	rec := &sweepjob.Record{Version: sweepjob.RecordVersion, Sweep: sw.Name, Params: sw.Params, Metric: sw.Objective.Metric,
		Mode: sw.Objective.Mode, Algorithm: sw.Search.Algorithm, Seed: sw.Search.Seed, MaxTrials: sw.MaxTrials,
		Parallel: sw.Parallel, MaxFailedTrials: sw.MaxFailedTrials}
	p, err := rec.Plan()
	if err != nil {
		return nil, err
	}
	return p.Sampler.Next(nil)
}

func validate(nomad nomadapi.API, job *api.Job, what string) error {
	v, err := nomad.Validate(job)
	if err != nil {
		return fmt.Errorf("validating %s: %w", what, err)
	}
	if v.Error != "" || len(v.ValidationErrors) > 0 {
		return fmt.Errorf("the Nomad agent refuses %s: %s", what, v.Error)
	}
	return nil
}

// checkControllerFree refuses a live job of the controller's ID, and one
// that is not a sweep controller of this name (never purge a stranger's).
func checkControllerFree(e *env, jobID, sweep string) error {
	old, err := e.nomad.Job(jobID)
	if err != nil {
		if gpujobs.IsNotFound(err) {
			return nil
		}
		return err
	}
	if old.Meta[contract.MetaKind] != contract.KindSweepController || old.Meta[contract.MetaSweep] != sweep {
		return fmt.Errorf("a job %s that is not sweep %s's controller exists: rename the sweep or remove that job", jobID, sweep)
	}
	if old.Status != nil && *old.Status != "dead" && (old.Stop == nil || !*old.Stop) {
		return fmt.Errorf("the controller job %s of an earlier sweep %s is still %s: gpujob sweep stop --purge %s", jobID, sweep, *old.Status, sweep)
	}
	return nil
}

// registerController registers the controller job, replacing a finished
// one of the same ID (Nomad would not run an unchanged dead batch job).
func registerController(e *env, job *api.Job) error {
	if old, err := e.nomad.Job(*job.ID); err == nil {
		if old.Status != nil && *old.Status == "dead" {
			if _, err := e.nomad.Deregister(*job.ID, true); err != nil {
				return err
			}
		}
	} else if !gpujobs.IsNotFound(err) {
		return err
	}
	// A live one is updated: its meta carries the time, so Nomad replaces
	// its allocation, and the new controller takes the lock from the old.
	if job.Meta == nil {
		job.Meta = map[string]string{}
	}
	job.Meta[contract.MetaRegistered] = strconv.FormatInt(time.Now().UnixNano(), 10)
	_, err := e.nomad.Register(job)
	return err
}

func controllerBinary(flag string) (string, error) {
	b, from := flag, "--controller-binary"
	if b == "" {
		b, from = os.Getenv(EnvControllerBinary), EnvControllerBinary
	}
	if b == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("finding this gpujob binary for the controller (set --controller-binary): %w", err)
		}
		if exe, err = filepath.EvalSymlinks(exe); err != nil {
			return "", err
		}
		return exe, nil
	}
	if !filepath.IsAbs(b) {
		return "", fmt.Errorf("%s: %q is not an absolute path", from, b)
	}
	return b, nil
}

// controllerSpec is the controller job of sw: how it reaches Nomad and
// Consul is how this CLI does (addresses and TLS files, no token).
func controllerSpec(sw *spec.Sweep, e *env, binary, user string) render.Controller {
	c := controllerEnv(e, sw.Name)
	c.JobID, c.Sweep, c.Namespace, c.Binary, c.User = controller.ControllerJobID(sw.Name), sw.Name, e.ns, binary, user
	c.Datacenters, c.NodePool = sw.Template.Datacenters, sw.Template.NodePool
	return c
}

// controllerUser is the user the controller runs as: flag, else, with
// ACLs, a user no workload runs as (the controller holds tokens), else
// nobody.
func controllerUser(flag string, e *env) string {
	switch {
	case flag != "":
		return flag
	case e.acl.Any():
		return sweepcreds.ControllerUser
	}
	return render.ControllerUser
}

// controllerEnv is how the controller reaches Nomad and Consul: as this
// CLI does (addresses; TLS files without ACLs), never with a token of the
// CLI's. With ACLs it reads tokens of its own (and the Consul TLS
// material) with its workload identity, and reaches Nomad through its Task
// API socket, which needs no TLS of it.
func controllerEnv(e *env, sweep string) render.Controller {
	// raw_exec hands a task the client agent's environment: blank every
	// token variable so the controller never acts with an agent's token,
	// and name the key prefix so it reads the tree this CLI wrote.
	envv := map[string]string{"NOMAD_ADDR": e.nomad.Address(), "CONSUL_HTTP_ADDR": sweepops.ConsulAddr(),
		"NOMAD_TOKEN": "", "CONSUL_HTTP_TOKEN": "", "CONSUL_HTTP_TOKEN_FILE": "", "CONSUL_HTTP_AUTH": "",
		EnvKeyPrefix: e.prefix}
	copied := []string{"CONSUL_HTTP_SSL", "CONSUL_TLS_SERVER_NAME", "NOMAD_REGION"}
	files := []string{"CONSUL_CACERT", "CONSUL_CAPATH", "CONSUL_CLIENT_CERT", "CONSUL_CLIENT_KEY",
		"NOMAD_CACERT", "NOMAD_CAPATH", "NOMAD_CLIENT_CERT", "NOMAD_CLIENT_KEY", "NOMAD_TLS_SERVER_NAME"}
	c := render.Controller{Env: envv}
	if e.acl.Any() {
		// The files are the CLI's (the user nobody may not read them):
		// blank any the agent's environment has too.
		for _, k := range files {
			envv[k] = ""
		}
		envv[sweepcreds.EnvVariable] = sweepcreds.VariablePath(controller.ControllerJobID(sweep))
		c.Identity = true
	} else {
		copied = append(copied, files...)
	}
	for _, k := range copied {
		if v := os.Getenv(k); v != "" {
			envv[k] = v
		}
	}
	return c
}
